"""What a running node sees: its context, the program's stop signal, and handle dereferencing.

Launchers install a `NodeContext` for every executable before it runs (per thread for threads,
per process for processes). The module-level functions here are re-exported as `lp.stop`,
`lp.wait_for_stop`, `lp.stop_event`, `lp.register_stop_handler`, `lp.unregister_stop_handler` and
`lp.get_context`, `lp.heartbeat` and `lp.resize`.

A node *cooperates* with a stop when it registers a stop handler or waits for or watches the stop
(`lp.wait_for_stop`, `lp.stop_event`); such a node gets the notice period to end, while one that
does none of these is ended at once when the program stops, as a process given SIGTERM would be.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Optional, Tuple


class StopSignal:
    """The program's stop event and stop handlers, as seen by one process."""

    def __init__(self, request_stop: Callable[[str], None]):
        self._request_stop = request_stop
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._handlers: list = []
        self.cooperating = False  # see the module docstring
        self._triggered = False
        self._handled = threading.Event()  # the stop handlers of the trigger have run

    def watched(self) -> threading.Event:
        """The stop event, for code that waits for or watches it: the node cooperates."""
        self.cooperating = True
        return self.event

    def request(self, reason: str) -> None:
        """Asks the program to stop (it reaches every node, this one included)."""
        self._request_stop(reason)

    def trigger(self) -> None:
        """Marks the program as stopping here and runs the stop handlers once."""
        with self._lock:
            if self._triggered:
                return
            self._triggered = True
            self.event.set()
            handlers, self._handlers = self._handlers, []
        ended = None
        try:
            for handler in handlers:
                try:
                    handler()
                except Exception:  # pylint: disable=broad-except
                    logging.exception('Stop handler %r failed', handler)
                except BaseException as e:  # pylint: disable=broad-except
                    # Run in the node's own thread, a handler may end it (Acme's raises
                    # SystemExit there): the node ends once the other handlers ran too.
                    ended = ended or e
        finally:
            self._handled.set()
        if ended is not None:
            raise ended

    def wait_for_handlers(self, timeout: Optional[float]) -> bool:
        """Waits up to `timeout` for the stop handlers to have run, if the stop was triggered:
        the event is set before they run, so the node's code may end while they still write its
        last checkpoint. False if they are still running."""
        with self._lock:
            if not self._triggered:
                return True
        return self._handled.wait(timeout)

    def add_handler(self, handler: Callable[[], None]) -> None:
        self.cooperating = True
        with self._lock:
            if not self._triggered:
                self._handlers.append(handler)
                return
        handler()

    def remove_handler(self, handler: Callable[[], None]) -> None:
        with self._lock:
            if handler in self._handlers:
                self._handlers.remove(handler)


class Progress:
    """When a node last reported progress (monotonic seconds); shared by the contexts of the nodes
    of one executable, so that any of them keeps it alive."""

    def __init__(self):
        self.last = time.monotonic()

    def report(self) -> None:
        self.last = time.monotonic()


@dataclasses.dataclass
class NodeContext:
    """Everything an executable knows about where it runs.

    Attributes:
      launch_type: the launch type, an `lp.LaunchType` member such as
        `LaunchType.LOCAL_MULTI_PROCESSING` (equal to its name, 'local_mp'), or the name of a
        launch type of your own.
      program_name: the program's name.
      label: the node's group label.
      index: the node's index within its group.
      address_table: endpoints of every address in the program.
      stop: the program's stop signal in this process.
      coordinator: the program's coordinator (or a client of it).
      notice_period: seconds the node has to end after the program starts stopping.
      tls: TLS credentials (a courier.TLSConfig) for the program's TCP traffic, or None.
      auth_token: the program's auth token for this process's calls to its nodes, where the
        environment does not carry it (the launching process of a local_mp program); else None.
      attempt: 0 in a node's first run, then how many times it was restarted (a restarted node
        can restore from its own checkpoint).
      progress_deadline: seconds the node may go without progress before it counts as hung
        (time it waits for a CPU or for a courier call's answer does not count).
      progress: when it last reported progress (`lp.heartbeat()`, or serving a call).
      resources: what the node was given where it runs (a `launchpad.resources.NodeResources`:
        its GPUs and cores), or None if its group was given no `lp.Resources`.
      checkpoint_root: the directory under which each node of the program on this host has its
        `checkpoint_dir` (None where the launcher keeps none; see docs/checkpoints.md).
    """
    launch_type: str
    program_name: str
    label: str
    index: int
    address_table: Any  # a launchpad.address.AddressTable (which imports this module)
    stop: StopSignal
    coordinator: Any = None
    notice_period: float = 10.0
    tls: Any = None
    auth_token: Optional[str] = None
    attempt: int = 0
    progress_deadline: Optional[float] = None
    progress: Progress = dataclasses.field(default_factory=Progress)
    resources: Any = None
    checkpoint_root: Optional[str] = None

    @property
    def node_name(self) -> str:
        return f'{self.label}/{self.index}'

    @property
    def checkpoint_dir(self) -> str:
        """A directory private to this node that outlives its restarts (and a Slurm job's
        requeue), for its checkpoints; created on first use. See docs/checkpoints.md."""
        if self.checkpoint_root is None:
            raise RuntimeError(
                f'{self.node_name} asked for its checkpoint_dir, but this {self.launch_type} '
                'program has no checkpoint directory. On kubernetes, name a volume for it: '
                "lp.launch(..., launch_type='kubernetes', checkpoint_volume={...}) "
                '(see docs/checkpoints.md).')
        path = os.path.join(self.checkpoint_root, *self.node_name.split('/'))
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def tls_for(self, endpoint) -> Any:
        """The TLS credentials for serving or calling `endpoint` (None on Unix sockets).

        An endpoint not known yet (a callable resolving a published address) is a TCP one.
        """
        if isinstance(endpoint, str) and endpoint.startswith('unix:'):
            return None
        return self.tls


_thread_context = threading.local()
_process_context: Optional[NodeContext] = None


def group_of(name: str) -> str:
    """The group label in the name of a node ('group/index'), of an inner node of a colocation
    ('group/index/i') or of an executable running several nodes ('group/index+group/index')."""
    return name.split('/', 1)[0]


def label_and_index(name: str) -> Tuple[str, int]:
    """The context label and index of the (first) node that executable `name` runs: 'group/3'
    -> ('group', 3); an inner node of a colocation, 'group/3/1' -> ('group/3', 1)."""
    label, _, index = name.split('+', 1)[0].rpartition('/')
    return label, int(index) if index.isdigit() else 0


def set_thread_context(context: NodeContext) -> None:
    """Installs `context` for the calling thread."""
    _thread_context.value = context


def thread_context() -> Optional[NodeContext]:
    """The context installed for the calling thread itself (None: it sees the process's)."""
    return getattr(_thread_context, 'value', None)


def set_process_context(context: Optional[NodeContext]) -> None:
    """Installs `context` for every thread of the process that has none of its own."""
    global _process_context
    _process_context = context


def in_context(context: NodeContext, fn: Callable[..., Any], *,
               progress: bool = False) -> Callable[..., Any]:
    """`fn`, running with `context` installed on whichever thread calls it (and, with `progress`,
    each call counting as the node's progress: a server's served calls)."""
    @functools.wraps(fn)
    def call_in_context(*args, **kwargs):
        _thread_context.value = context
        if progress:
            context.progress.report()
        return fn(*args, **kwargs)

    return call_in_context


def clear_process_context(context: NodeContext) -> None:
    """Removes `context` as the process default if it still is (its program ended)."""
    global _process_context
    if _process_context is context:
        _process_context = None


def get_context() -> NodeContext:
    """The context of the node running this code.

    Threads a node starts itself see the process's default context.
    """
    context = thread_context() or _process_context
    if context is None:
        raise RuntimeError('No launchpad program is running here: this function is only available '
                           'inside a node of a launched program.')
    return context


def stop() -> None:
    """Stops the whole program. Safe to call from any node, on any platform."""
    context = get_context()
    context.stop.request(f'lp.stop() called in {context.node_name}')


def stop_event() -> threading.Event:
    """An event that is set when the program is stopping."""
    return get_context().stop.watched()


def wait_for_stop(timeout: Optional[float] = None) -> bool:
    """Blocks until the program is stopping or `timeout` seconds pass; True if stopping."""
    return get_context().stop.watched().wait(timeout)


def heartbeat() -> None:
    """Reports that the node makes progress (see `progress_deadline` of `Program.group`)."""
    get_context().progress.report()


def resize(label: str, size: int) -> None:
    """Asks for group `label` of the program to have `size` nodes: the launcher adds nodes (made
    by the group's `lp.Elastic(make_node=...)`) or removes the newest. Returns at once; the
    group's `lp.GroupClient` sees the members join and leave.

    Raises ValueError (KeyError for an unknown group), naming the group, the size and what it
    allows, if the group cannot have `size` nodes: outside its `lp.Elastic(min_size, max_size)`,
    or growing without a node factory. What fails later (the factory or the platform cannot
    start a node, the program stops) the launcher logs; see docs/elastic.md.
    """
    context = get_context()
    if context.coordinator is None:
        raise RuntimeError('lp.resize needs the program\'s coordinator, which this node has not.')
    context.coordinator.request_size(label, size)


def register_stop_handler(handler: Callable[[], None]) -> None:
    """Calls `handler()` once when the program starts stopping (at once if it already is)."""
    get_context().stop.add_handler(handler)


def unregister_stop_handler(handler: Callable[[], None]) -> None:
    """Removes a handler added with `register_stop_handler`."""
    get_context().stop.remove_handler(handler)
