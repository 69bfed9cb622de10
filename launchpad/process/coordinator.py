"""The coordinator: the one place that knows a launched program's state.

Nodes report to it (started, finished, failed), publish their endpoints to it and watch it for the
stop signal; the controller reads it. In threads it is a plain object; for processes and remote
hosts the launcher serves it with courier and nodes call it through a client with the same methods.
Stop and failure therefore travel one way on every platform: a node tells the coordinator, and every
node learns it from the coordinator.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import socket
import threading
import time
import traceback
from typing import Callable, Dict, Iterable, List, Optional

# Seconds a node keeps running without reaching its coordinator before it decides that the
# launcher is gone and stops itself.
COORDINATOR_LOSS_TIMEOUT = 5.0


class NodeState(str, enum.Enum):
    PENDING = 'pending'
    RUNNING = 'running'
    FINISHED = 'finished'
    FAILED = 'failed'
    KILLED = 'killed'

    @property
    def ended(self) -> bool:
        return self in (NodeState.FINISHED, NodeState.FAILED, NodeState.KILLED)


@dataclasses.dataclass
class NodeStatus:
    """How one executable of the program is doing."""
    name: str
    state: NodeState = NodeState.PENDING
    pid: Optional[int] = None
    host: Optional[str] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None
    started_at: Optional[float] = None  # wall-clock time the coordinator heard it start


class NodeFailedError(RuntimeError):
    """A node of the program failed; the program was stopped because of it.

    Attributes:
      node_name: the failing node, 'group/index'.
      message: its error message.
      remote_traceback: the traceback text printed where it failed.
    """

    def __init__(self, node_name: str, message: str, remote_traceback: str = ''):
        self.node_name = node_name
        self.message = message
        self.remote_traceback = remote_traceback
        text = f'Node {node_name} failed: {message}'
        if remote_traceback:
            text += f'\n\nTraceback in {node_name}:\n{remote_traceback.rstrip()}'
        super().__init__(text)

    def __reduce__(self):
        return type(self), (self.node_name, self.message, self.remote_traceback)


class Coordinator:
    """Node states, published addresses and the stop signal of one launched program."""

    def __init__(self, node_names: Iterable[str]):
        self._changed = threading.Condition()
        self._nodes: Dict[str, NodeStatus] = {name: NodeStatus(name) for name in node_names}
        self._addresses: Dict[str, str] = {}
        self._stop_reason: Optional[str] = None
        self._stop_time: Optional[float] = None
        self._failure: Optional[NodeFailedError] = None
        self._metrics: Dict[str, dict] = {}

    # Called by nodes.

    def node_started(self, name: str, pid: int, host: str) -> None:
        with self._changed:
            status = self._status(name)
            if status.state is NodeState.PENDING:
                status.state = NodeState.RUNNING
            status.pid, status.host = pid, host
            status.started_at = status.started_at or time.time()
            self._changed.notify_all()

    def node_finished(self, name: str) -> None:
        with self._changed:
            status = self._status(name)
            if not status.state.ended:
                status.state = NodeState.FINISHED
            self._changed.notify_all()

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        """Marks `name` failed; the first failure stops the program and is what `wait` raises."""
        with self._changed:
            self._fail(name, message, traceback_text)

    def request_stop(self, reason: str = 'stop requested') -> None:
        with self._changed:
            self._set_stopping(reason)

    def wait_for_stop(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the program is stopping or `timeout` passes; True if stopping."""
        with self._changed:
            return self._changed.wait_for(lambda: self._stop_reason is not None, timeout)

    def publish_address(self, address_id: str, endpoint: str) -> None:
        with self._changed:
            self._addresses[address_id] = endpoint
            self._changed.notify_all()

    def report_metrics(self, name: str, snapshot: dict) -> None:
        """Keeps the latest metrics executable `name` reported (`launchpad.observe.report`)."""
        with self._changed:
            self._metrics[name] = snapshot

    def lookup_address(self, address_id: str, timeout: Optional[float] = None) -> Optional[str]:
        """The endpoint published for `address_id`, waiting up to `timeout`; None if none came."""
        with self._changed:
            self._changed.wait_for(lambda: address_id in self._addresses, timeout)
            return self._addresses.get(address_id)

    # Called by the launcher and the controller.

    def executable_exited(self, name: str, exit_code: int) -> None:
        """Records that the executable's process is gone, reporting a failure if it never did."""
        with self._changed:
            status = self._status(name)
            status.exit_code = exit_code
            if status.state.ended:
                pass  # it reported how it ended
            elif self._stop_reason is not None and exit_code != 0:
                status.state = NodeState.KILLED
            elif exit_code == 0:
                status.state = NodeState.FINISHED
            else:
                description = (f'killed by signal {-exit_code}' if exit_code < 0
                               else f'exit code {exit_code}')
                self._fail(name, f'its process ended ({description}) without reporting an error; '
                                 'see its output above or in its log.')
            self._changed.notify_all()

    def mark_killed(self, names: Iterable[str]) -> None:
        with self._changed:
            for name in names:
                status = self._status(name)
                if not status.state.ended:
                    status.state = NodeState.KILLED
            self._changed.notify_all()

    def status(self) -> Dict[str, NodeStatus]:
        with self._changed:
            return {name: dataclasses.replace(status) for name, status in self._nodes.items()}

    def metrics(self) -> Dict[str, dict]:
        """Executable name -> the metrics it reported last."""
        with self._changed:
            return dict(self._metrics)

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> Optional[str]:
        return self._stop_reason

    @property
    def stop_time(self) -> Optional[float]:
        return self._stop_time

    @property
    def failure(self) -> Optional[NodeFailedError]:
        return self._failure

    def wait_for_change(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def running(self, names: Optional[Iterable[str]] = None) -> List[str]:
        with self._changed:
            selected = self._nodes if names is None else {n: self._nodes[n] for n in names}
            return [name for name, status in selected.items() if not status.state.ended]

    def _status(self, name: str) -> NodeStatus:
        status = self._nodes.get(name)
        if status is None:
            raise KeyError(f'{name!r} is not a node of this program.')
        return status

    def _fail(self, name: str, message: str, traceback_text: str = '') -> None:
        status = self._status(name)
        status.state = NodeState.FAILED
        status.error = message
        if self._failure is None and self._stop_reason is None:
            self._failure = NodeFailedError(name, message, traceback_text)
        self._set_stopping(f'node {name} failed')

    def _set_stopping(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
            self._stop_time = time.monotonic()
        self._changed.notify_all()


def serve_coordinator(coordinator: Coordinator, address: str, *, auth_token: Optional[str] = None,
                      tls=None):
    """Serves `coordinator` with courier on `address` and returns the started courier.Server.

    Every node keeps a call to `wait_for_stop` open, so the server gets two threads per node and
    some to spare. `auth_token` None reads COURIER_AUTH_TOKEN, as courier does.
    """
    import courier  # pylint: disable=import-outside-toplevel
    server = courier.Server(address=address, auth_token=auth_token, tls=tls,
                            thread_pool_size=2 * len(coordinator.status()) + 8)
    server.bind_object(coordinator)
    server.Start()
    return server


def run_reporting(run: Callable[[], None], name: str, coordinator, *, starting=None) -> int:
    """Runs an executable, reporting to the coordinator how it ended; returns an exit code.

    `starting` (default: `coordinator`) reports the start; a worker passes a client that waits for
    a busy coordinator there, and reports the end through one that fails at once when it is gone.
    """
    (starting or coordinator).node_started(name, os.getpid(), socket.gethostname())
    try:
        run()
    except SystemExit as e:
        if e.code not in (None, 0):
            coordinator.node_failed(name, f'SystemExit({e.code!r})', traceback.format_exc())
            return 1
    except BaseException as e:  # pylint: disable=broad-except
        traceback.print_exc()
        coordinator.node_failed(name, f'{type(e).__name__}: {e}', traceback.format_exc())
        return 1
    coordinator.node_finished(name)
    return 0
