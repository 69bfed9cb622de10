"""The entry point of every node process: `python -m launchpad.process.worker SPEC_FILE`.

A launcher packs a `WorkerSpec` (the executable, the address table, how to reach the coordinator)
with `launchpad.process.spec`, ships the file to where the process runs and starts this module on
it (`spec.worker_argv`). The worker installs the node's context, watches the coordinator for the
stop signal (and for the launcher going away), runs the executable and reports how it ended.

Its threads:

    main thread       runs the node (`run_reporting`), then ends its process tree and exits
    lp-stop-watcher   waits for the program's stop: runs the stop handlers, wakes the main
                      thread (`interrupt`), then exits at once if the node does not cooperate
                      (see `runtime`), else after the notice period
    lp-watchdog       with a progress deadline: reports a hung node with its stacks and exits
    lp-probe          answers questions about the node's stacks and calls (`probe`)
    lp-preempted      on SIGTERM (the platform ends the node: preemption, eviction): reports a
                      failure that the restart policy covers, runs the stop handlers, exits

However it ends, the worker first ends every process its node started (`tree`). Nothing imports
this module: it only runs as a program's main module.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import courier

from launchpad import runtime
from launchpad import metrics
from launchpad.process import faces
from launchpad.process import flags
from launchpad.process import interrupt
from launchpad.process import probe
from launchpad.process import spec as specs
from launchpad.process import tempdirs
from launchpad.process import tree
from launchpad.process import watchdog
from launchpad.process.coordinator import COORDINATOR_LOSS_TIMEOUT, run_reporting
from launchpad.process.spec import WorkerSpec
from launchpad.process.supervisor_endpoint import SupervisorEndpoint

_POLL = 1.0
_POLL_SLACK = 4.0  # seconds a stop watcher's poll may take beyond _POLL before it dials again
_REPORT_WAIT = 10.0  # seconds a detached program's node waits for a supervisor to report to


def _run_with_flags(spec: WorkerSpec) -> None:
    flags.install(spec.flags, spec.flag_overrides)
    spec.run()


class _Watching(faces.NodeFaceProxy):
    """The stop watcher's face of a detached program's coordinator. A poll that times out
    drops its connection, so that the next one dials again: a supervisor whose host or pod went
    away without a word leaves the connection open and silent, while its successor listens at
    the same name elsewhere (a Kubernetes coordinator pod made again has a new address). The
    node's other clients of the coordinator (`others`) drop theirs too: a call waiting on such
    a connection (how the node ended, at a stop) would wait out its timeout, past the notice
    period; it goes again to the successor (`SupervisorEndpoint`)."""

    def __init__(self, dial: Callable[[], courier.Client], others: Sequence[courier.Client] = ()):
        self._dial = dial
        self._others = others
        super().__init__(dial())

    def _call(self, method: str, *args):
        try:
            return getattr(self._target, method)(*args)
        except courier.CallTimeoutError:
            silent, self._target = self._target, self._dial()
            silent.close()
            for client in self._others:
                client.redial()
            raise

    def wait_for_stop(self, timeout: Optional[float] = None, name: Optional[str] = None) -> bool:
        return self._call('wait_for_stop', timeout, name)

    def node_started(self, name: str, pid: int, host: str,
                     instance: Optional[str] = None) -> Optional[int]:
        return self._call('node_started', name, pid, host, instance)

    def publish_address(self, address_id: str, endpoint: str) -> None:
        self._call('publish_address', address_id, endpoint)


def _watch(coordinator, watching, published: '_Published', stop: runtime.StopSignal,
           spec: WorkerSpec, launcher_lost: threading.Event, instance: str,
           started: threading.Event) -> None:
    """Triggers the stop signal when the program stops or the launcher is gone, watching the
    coordinator through `watching` (which fails at once while it is unreachable). When the
    coordinator answers again after it was unreachable (a detached program's new supervisor),
    tells it again that this node runs (`instance`) and the endpoints it `published`, in case
    its predecessor heard them but died before it persisted them."""
    unreachable_since = None
    grace = (COORDINATOR_LOSS_TIMEOUT if spec.coordinator_grace is None
             else spec.coordinator_grace)
    while True:
        if spec.parent_pid is not None and os.getppid() != spec.parent_pid:
            logging.error('%s: the launcher (pid %d) is gone; stopping.', spec.node_name,
                          spec.parent_pid)
            launcher_lost.set()
            break
        try:
            if unreachable_since is not None:
                if started.is_set():
                    watching.node_started(spec.node_name, os.getpid(), socket.gethostname(),
                                          instance)
                for address_id, endpoint in published.endpoints():
                    watching.publish_address(address_id, endpoint)
            if watching.wait_for_stop(_POLL, spec.node_name):  # or it is removed
                break
            unreachable_since = None
        except Exception as e:  # pylint: disable=broad-except
            now = time.monotonic()
            unreachable_since = unreachable_since or now
            if now - unreachable_since > grace:
                logging.error('%s: the program\'s coordinator has been unreachable for %.0f s (%s); '
                              'stopping.', spec.node_name, grace, e)
                launcher_lost.set()
                break
            time.sleep(0.2)
    stop.trigger()
    _wake()
    if not stop.cooperating:  # nothing of the node waits for the stop: it ends at once
        if coordinator.failed:  # the stop may be its own failure's: its exit code says so too
            _exit_now(1, spec, launcher_lost)
        if not launcher_lost.is_set():
            if not started.is_set():  # it started into a stopping program: say where it ran
                _report(coordinator.node_started, spec.node_name, os.getpid(),
                        socket.gethostname(), instance)
            _report(coordinator.node_finished, spec.node_name)
        _exit_now(0, spec, launcher_lost)
    time.sleep(spec.notice_period + 1.0)
    logging.error('%s did not end within the %g s notice period; exiting.', spec.node_name,
                  spec.notice_period)
    _exit_now(3, spec, launcher_lost)


def _preempted(signum: int, coordinator, stop: runtime.StopSignal, spec: WorkerSpec,
               done: threading.Event, launcher_lost: threading.Event) -> None:
    """The platform ends this node (SIGTERM): a failure, unless the program is stopping anyway;
    the node's stop handlers run, and a cooperating node gets the notice period to end."""
    name = signal.Signals(signum).name
    if not stop.event.is_set() and _requeued(spec):
        logging.warning('%s received %s: the platform ends the program to start it again '
                        '(requeue); its stop handlers run.', spec.node_name, name)
        coordinator.silent = True  # this attempt ends without a word; the next one reports
    elif not stop.event.is_set():
        logging.warning('%s received %s: the platform is ending it (preemption?).',
                        spec.node_name, name)
        _report(coordinator.node_failed, spec.node_name,
                f'{name}: the platform ({spec.launch_type}) ended this node: preempted, evicted, '
                'cancelled or killed')
    stop.trigger()
    _wake()
    done.wait(spec.notice_period if stop.cooperating else 0.0)
    _exit_now(128 + signum, spec, launcher_lost)


def _wake() -> None:
    """Wakes the main thread, which runs the node, once the stop handlers ran, so that an
    exception a handler raised in it lands now (Acme's `runtime_terminator` raises SystemExit
    there): see `launchpad.process.interrupt`."""
    interrupt.wake(threading.main_thread())


def _requeued(spec: WorkerSpec) -> bool:
    """True if the platform ends the whole program to start it again (`spec.requeue_check`)."""
    if spec.requeue_check is None:
        return False
    try:
        return bool(spec.requeue_check())
    except Exception:  # pylint: disable=broad-except
        logging.exception('%s could not tell whether the platform requeues the program.',
                          spec.node_name)
        return False


def _hung(coordinator, spec: WorkerSpec, launcher_lost: threading.Event, name: str,
          summary: str, stacks: str) -> None:
    """The watchdog found the node silent past its deadline: it fails, with its stacks."""
    print(f'{stacks}\n{name} hung: {summary}; above, the stack of each of its threads.',
          file=sys.stderr, flush=True)
    _report(coordinator.node_failed, name, f'hung: {summary}',
            f'The stack of each thread, the node\'s own last:\n{stacks}')
    _exit_now(1, spec, launcher_lost)


class _CoordinatorClient(faces.NodeFaceProxy):
    """The node face of the coordinator as the worker's threads call it (through a courier
    client), remembering whether the node reported a failure (a node that failed must not end
    with exit code 0, which a platform that only sees exit codes, Kubernetes, would take for
    success). How the node ends, and its `lp.stop()`, go through `reports` if given: a client
    that waits for a detached program's next supervisor, unless `lost` says that none comes."""

    def __init__(self, client: courier.Client, reports: Optional[courier.Client] = None,
                 lost: Optional[threading.Event] = None):
        super().__init__(client)
        self.failed = False
        self.silent = False  # the platform requeues the program: this attempt reports no end
        self._reports = faces.NodeFaceProxy(reports if reports is not None else client)
        self._lost = lost or threading.Event()

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        if self.silent:
            return
        self.failed = True
        if not self._lost.is_set():
            self._reports.node_failed(name, message, traceback_text)

    def node_finished(self, name: str) -> None:
        if not self.silent and not self._lost.is_set():
            self._reports.node_finished(name)

    def request_stop(self, reason: str = 'stop requested') -> None:
        self._reports.request_stop(reason)


class _Published:
    """The address registry (the coordinator) as the node's address table calls it, keeping the
    endpoints the node published, to tell a new supervisor again."""

    def __init__(self, client: courier.Client):
        self._client = client
        self._endpoints: Dict[str, str] = {}
        self._lock = threading.Lock()

    def publish_address(self, address_id: str, endpoint: str) -> None:
        with self._lock:
            self._endpoints[address_id] = endpoint
        self._client.publish_address(address_id, endpoint)

    def lookup_address(self, address_id: str, timeout: Optional[float] = None) -> Optional[str]:
        return self._client.lookup_address(address_id, timeout)

    def endpoints(self) -> List[Tuple[str, str]]:
        """(address id, endpoint) of each address the node published."""
        with self._lock:
            return list(self._endpoints.items())


class _Started:
    """The coordinator client that reports the node's start, setting `started` once it did."""

    def __init__(self, client: courier.Client, started: threading.Event):
        self._client, self._started = client, started

    def node_started(self, *args) -> int:
        attempt = self._client.node_started(*args)
        self._started.set()
        return attempt


def _report(method, *args) -> None:
    """Tells the coordinator something on the way out; it may be gone already."""
    try:
        method(*args)
    except Exception as e:  # pylint: disable=broad-except
        logging.warning('Could not reach the coordinator on the way out: %s', e)


def _exit_now(code: int, spec: WorkerSpec, launcher_lost: threading.Event) -> None:
    tree.end_descendants()
    _leave_run_dir(spec, launcher_lost)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access


def _report_unloadable(error: specs.NodeUnpicklingError) -> None:
    """Tells the coordinator why this node could not start, so that the error names the cause."""
    if error.coordinator_address is None:
        return  # only the (unloaded) spec knows how to reach it; the traceback is in the output
    try:
        coordinator = courier.Client(error.coordinator_address, call_timeout=30.0,
                                     tls=None if error.coordinator_address.startswith('unix:')
                                     else error.tls)
        coordinator.node_failed(error.node_name, str(error), traceback.format_exc())
    except Exception:  # pylint: disable=broad-except
        logging.exception('%s could not report to the coordinator.', error.node_name)


def main() -> None:
    """Runs the executable of the spec file named by the last command-line argument, then exits."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    if len(sys.argv) != 2:
        sys.exit(f'usage: python -m {specs.WORKER_MODULE} SPEC_FILE')
    if os.environ.get(specs.SUPERVISE_ENV) == '1':
        code = _supervise()
        if code is not None:
            sys.exit(code)
    sys.exit(_run(sys.argv[1]))


def _supervise():
    """Runs the node in a child process, and outlives it to end what it leaves (None: this is
    the child, which runs the node).

    The worker ends its node's processes itself, unless it is killed (SIGKILL, the OOM killer).
    Where nothing else contains a node's processes, e.g. Slurm without cgroups, whatever it
    started would outlive it, and hold its job step open by its output. This parent adopts them
    (a subreaper), passes signals on to the node, and ends them once the node is gone.
    """
    tree.become_subreaper()
    pid = os.fork()
    if pid == 0:
        return None
    def pass_on(signum, frame):
        del frame
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # it has just ended

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, pass_on)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    tree.end_descendants()
    return 128 - code if code < 0 else code


def _run(spec_path: str) -> int:
    try:
        spec = specs.load(spec_path)
    except specs.NodeUnpicklingError as e:
        _report_unloadable(e)
        raise
    tree.become_subreaper()
    if spec.cleanup_dir:  # the node's own directories go in there (`tempdirs.make`)
        tempdirs.claim(spec.cleanup_dir)
        os.environ[tempdirs.RUN_DIR_ENV] = spec.cleanup_dir
    if spec.resources is not None and spec.resources.cores is not None:
        if hasattr(os, 'sched_setaffinity'):
            os.sched_setaffinity(0, spec.resources.cores)  # before the node starts any thread
        else:
            logging.warning('%s: this system cannot pin a process to cores; it runs on any.',
                            spec.node_name)
    label, index = runtime.label_and_index(spec.node_name)
    context = runtime.NodeContext(
        launch_type=spec.launch_type, program_name=spec.program_name, label=label,
        index=index, address_table=spec.address_table, stop=None,
        notice_period=spec.notice_period, tls=spec.tls,
        progress_deadline=spec.progress_deadline, resources=spec.resources,
        checkpoint_root=os.environ.get(specs.CHECKPOINT_ROOT_ENV) or spec.checkpoint_root)
    tls = context.tls_for(spec.coordinator_address)
    # A detached program's node sends a call that lost its supervisor again, to the next one.
    address = spec.coordinator_address if spec.coordinator_grace is None else \
        SupervisorEndpoint(spec.coordinator_address, spec.coordinator_grace)
    # The start waits for a busy coordinator; everything later fails at once when it is gone, so
    # that a node whose launcher died ends within seconds.
    starting = courier.Client(address, call_timeout=30.0, wait_for_ready=True, tls=tls)
    # A detached program's node tells how it ended to the next supervisor if its own just died.
    reports = None if spec.coordinator_grace is None else courier.Client(
        address, call_timeout=_REPORT_WAIT, wait_for_ready=True, tls=tls)
    launcher_lost = threading.Event()
    calls = courier.Client(address, call_timeout=30.0, wait_for_ready=False, tls=tls)
    coordinator = _CoordinatorClient(calls, reports,
                                     launcher_lost if reports is not None else None)
    # Address lookups wait for servers to come up, longer than other calls may take. A detached
    # program's node starting (publishing its address, looking up others') while its supervisor
    # is replaced waits for the next one.
    table = spec.address_table
    lookup_deadline = None if table.lookup_timeout is None else table.lookup_timeout + 30.0
    registry = courier.Client(address, call_timeout=lookup_deadline,
                              wait_for_ready=reports is not None, tls=tls)
    table.registry = published = _Published(registry)
    stop = runtime.StopSignal(coordinator.request_stop)
    context.stop, context.coordinator = stop, coordinator
    runtime.set_process_context(context)
    reporting = courier.Client(spec.coordinator_address, call_timeout=metrics.REPORT_TIMEOUT,
                               wait_for_ready=False, tls=tls)
    metrics.start_reporting(spec.node_name, reporting)
    answering = courier.Client(spec.coordinator_address, call_timeout=probe.CALL_TIMEOUT,
                               wait_for_ready=False, tls=tls)
    probe.start_answering(spec.node_name, answering, context.progress)
    # The stop watcher sees the coordinator unreachable (and measures the grace) itself.
    watching = coordinator if spec.coordinator_grace is None else _Watching(functools.partial(
        courier.Client, spec.coordinator_address, call_timeout=_POLL + _POLL_SLACK,
        wait_for_ready=False, tls=tls), [client for client in (
            starting, reports, calls, registry, reporting, answering) if client is not None])
    done = threading.Event()
    _handle_signals(coordinator, stop, spec, done, launcher_lost)
    if spec.progress_deadline is not None:
        deadline = spec.progress_deadline
        watchdog.ProgressWatchdog(
            functools.partial(_hung, coordinator, spec, launcher_lost),
            tick=functools.partial(watchdog.arm_fallback, deadline)).watch(
                spec.node_name, context, deadline, threading.get_ident())
    instance, started = uuid.uuid4().hex, threading.Event()
    threading.Thread(target=_watch, args=(coordinator, watching, published, stop, spec,
                                          launcher_lost, instance, started),
                     daemon=True, name='lp-stop-watcher').start()
    try:
        code = run_reporting(functools.partial(_run_with_flags, spec), spec.node_name, coordinator,
                             starting=_Started(starting, started), context=context,
                             instance=instance)
    except Exception:  # pylint: disable=broad-except
        # Reporting failed: the coordinator is gone.
        logging.exception('%s could not report to the coordinator.', spec.node_name)
        code = 1
    # A stop's handlers run in another thread (a preemption's, the stop watcher's): the process
    # ends once they have, within the notice period, or a checkpoint they write is lost.
    stop.wait_for_handlers(spec.notice_period)
    done.set()
    if launcher_lost.is_set():
        _exit_now(code, spec, launcher_lost)
    tree.end_descendants()
    _leave_run_dir(spec, launcher_lost)
    return code


def _leave_run_dir(spec: WorkerSpec, launcher_lost: threading.Event) -> None:
    """Removes the node's run directory if its launcher (which removes it) is gone: the
    launcher died, or this node is the last out of a host whose agent was killed."""
    if not spec.cleanup_dir:
        return
    if launcher_lost.is_set():
        shutil.rmtree(spec.cleanup_dir, ignore_errors=True)
    else:
        tempdirs.leave(spec.cleanup_dir)


def _handle_signals(coordinator, stop: runtime.StopSignal, spec: WorkerSpec,
                    done: threading.Event, launcher_lost: threading.Event) -> None:
    """SIGTERM ends the node as a preemption (`_preempted`), SIGHUP the same way without
    reporting (its launcher is gone); the platform's warning signal, if it
    has one (`spec.stop_signal`), stops the program. Handlers only start a thread: the work
    needs locks that the interrupted code may hold."""
    def preempted(signum, frame):
        del frame
        threading.Thread(target=_preempted, name='lp-preempted', daemon=True,
                         args=(signum, coordinator, stop, spec, done, launcher_lost)).start()

    def warned(signum, frame):
        del frame
        threading.Thread(target=stop.request, name='lp-warned', daemon=True, args=(
            f'{spec.node_name} received {signal.Signals(signum).name}: the platform ends the '
            'program soon',)).start()

    def orphaned(signum, frame):  # an SSH host's agent lost the launcher: nobody to report to
        launcher_lost.set()
        preempted(signum, frame)

    signal.signal(signal.SIGTERM, preempted)
    signal.signal(signal.SIGHUP, orphaned)
    interrupt.install()
    if spec.stop_signal:
        signal.signal(getattr(signal, spec.stop_signal), warned)


if __name__ == '__main__':
    main()
