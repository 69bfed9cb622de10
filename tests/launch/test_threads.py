"""local_mt's node threads (`launchpad.launch.threads`)."""
from launchpad import runtime
from launchpad.launch.threads import _ThreadRunner
from launchpad.process import interrupt
from launchpad.process.coordinator import Coordinator, NodeStopped
from tests.core.conftest import wait_until


def test_a_node_stopped_as_its_code_ends_ends_finished(tmp_path):
    """The stop raises NodeStopped in a node that does not cooperate, under the runner's lock,
    just as the node's code returns: the exception lands once its thread takes that lock to
    record its exit code. It ended all the same: exit code 0, not a kill."""
    coordinator = Coordinator(['node/0'])
    runner = _ThreadRunner(str(tmp_path), coordinator)
    context = runtime.NodeContext(launch_type='local_mt', program_name='p', label='node',
                                  index=0, address_table=None,
                                  stop=runtime.StopSignal(coordinator.request_stop),
                                  coordinator=coordinator)
    runner.add('node/0', context, lambda: None)
    thread = runner.threads['node/0']
    with runner._lock:  # pylint: disable=protected-access
        thread.start()
        # its code returned and it reported so: now it waits for the lock to record its exit
        assert wait_until(lambda: not coordinator.running(['node/0']), timeout=10)
        interrupt.raise_in(thread, NodeStopped)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert runner.poll() == {'node/0': 0}
