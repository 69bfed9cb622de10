"""The controller's end of a program: what happens between its last node's exit and `wait`'s
return, with a platform (a `Runner`) and an observer of the test's own."""
import threading

from launchpad.launch.controller import Controller
from launchpad.launch.runner import Runner
from launchpad.process.coordinator import Coordinator


class _Runner(Runner):
    """One executable, which exits once `exit` is set; its release waits (a while) for the
    observer's last sample, as a fork server's exit or a coordinator server's stop takes time."""

    def __init__(self):
        self.exit = threading.Event()
        self.last_sample = threading.Event()
        self.released_during_last_sample = None

    def poll(self):
        return {'a/0': 0 if self.exit.is_set() else None}

    def kill(self, names):
        self.exit.set()

    def release(self):
        self.released_during_last_sample = self.last_sample.wait(10.0)


class _Observer:
    def __init__(self, runner: _Runner):
        self._runner = runner
        self.done_at_last_sample = None

    def program_ended(self):
        self._runner.last_sample.set()
        self.done_at_last_sample = self.controller.done


def test_the_last_sample_is_taken_while_the_runner_releases_and_before_wait_returns():
    """The observer's last sample needs only the nodes' end, so it is not queued behind the
    platform's release; `wait` still returns only once both are done."""
    runner = _Runner()
    controller = Controller('p', Coordinator(['a/0']), runner, launch_type='test',
                            poll_interval=0.01)
    observer = _Observer(runner)
    observer.controller = controller
    controller.observer = observer
    runner.exit.set()
    assert controller.wait(timeout=60)
    assert runner.released_during_last_sample is True
    assert observer.done_at_last_sample is False


class _PolledRunner(_Runner):
    """Says when the controller has polled it."""

    def __init__(self):
        super().__init__()
        self.polled = threading.Event()

    def poll(self):
        self.polled.set()
        return super().poll()

    def release(self):
        pass


def test_an_exit_the_runner_hears_of_is_seen_without_waiting_for_the_next_poll():
    """A runner told of an exit as it happens (local_mp's fork server, an SSH host's agent)
    wakes the controller through the coordinator, which restarts a failed node that much
    sooner; here the poll interval is an hour."""
    runner = _PolledRunner()
    coordinator = Coordinator(['a/0'])
    controller = Controller('p', coordinator, runner, launch_type='test', poll_interval=3600)
    assert runner.polled.wait(60)
    runner.exit.set()
    woken = 0
    while not controller.wait(timeout=0.1) and woken < 300:  # (the first may come before
        coordinator.notify_change()                          # the controller waits)
        woken += 1
    assert controller.done
    assert coordinator.status()['a/0'].exit_code == 0
