"""Handles to a whole group that grows and shrinks while the program runs.

`program.group_handle('actor')` gives a `GroupHandle`; passed to a node, it arrives there as a
`GroupClient`, which asks the program's coordinator for the group's live members (the nodes of
the group that run and are not leaving) and keeps a courier client per member:

    def learner(actors):                       # actors: an lp.GroupClient
        while not lp.stop_event().is_set():
            actors.call_all('set_params', params)   # whoever is a member now
            if actors.wait_for_change(timeout=0):   # cheap: did anyone join or leave?
                print('actors now', actors.names())

A member that left (removed, or ended) fails a call with `NodeLeftError` at once instead of being
waited for; `call_all` leaves such members out, so a broadcast goes on as members come and go.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from launchpad import runtime
from launchpad.address import Address
from launchpad.nodes.base import Handle
from launchpad.nodes.endpoint import NodeLeftError, node_client
from launchpad.process.supervision import MemberEvent

_LONGEST_WAIT = 10.0  # seconds of one wait for a change at the coordinator (under its call timeout)


class _Group:
    """What a `GroupHandle` refers to, for `Handle`'s constructor."""

    def __init__(self, label: str):
        self.node_id = f'group:{label}'


class GroupHandle(Handle):
    """A handle to every node of group `label`, as the group grows and shrinks; dereferenced into
    a `GroupClient` (see the module docstring)."""

    def __init__(self, label: str, client_kwargs: Optional[dict] = None):
        super().__init__(_Group(label))
        self.label = label
        self._client_kwargs = dict(client_kwargs or {})

    def dereference(self) -> 'GroupClient':
        return GroupClient(self.label, self._client_kwargs)


class GroupClient:
    """The live members of a group, as courier clients (see the module docstring).

    Thread-safe; picklable (a copy starts with no members and asks the coordinator again).
    """

    def __init__(self, label: str, client_kwargs: Optional[dict] = None):
        self.label = label
        self._client_kwargs = dict(client_kwargs or {})
        self._lock = threading.Lock()
        self._known: List[Tuple[str, List[str]]] = []
        self._clients: Dict[str, Any] = {}
        self._events_seen = 0  # how many of the group's departures `events` returned

    def __getstate__(self):
        return {'label': self.label, 'client_kwargs': self._client_kwargs}

    def __setstate__(self, state):
        self.__init__(state['label'], state['client_kwargs'])

    # Who is a member.

    def names(self) -> List[str]:
        """The live members' names ('group/index'), oldest first (asks the coordinator, with
        the members this client saw: a new supervisor keeps those it has not heard from yet)."""
        with self._lock:
            known = list(self._known)
        self._update(_coordinator().wait_for_members(self.label, known, 0))
        with self._lock:
            return [name for name, _ in self._known]

    def members(self) -> Dict[str, Any]:
        """Member name -> its courier client (None for a node that serves nothing, a PyNode)."""
        names = self.names()
        with self._lock:
            return {name: self._clients.get(name) for name in names}

    def clients(self) -> List[Any]:
        """The live members' clients, oldest member first."""
        return [client for client in self.members().values() if client is not None]

    def __len__(self) -> int:
        return len(self.names())

    def wait_for_change(self, timeout: Optional[float] = None) -> bool:
        """Blocks until a member joins or leaves, compared with what this client saw last (or
        `timeout` passes, 0 polls); True if the members changed. One coordinator call a wait."""
        coordinator = _coordinator()
        with self._lock:
            known = list(self._known)
        left = timeout
        while True:
            wait = _LONGEST_WAIT if left is None else min(left, _LONGEST_WAIT)
            found = [(name, list(ids)) for name, ids in
                     coordinator.wait_for_members(self.label, known, wait)]
            if found != known:
                self._update(found)
                return True
            if left is not None:
                left -= wait
                if left <= 0:
                    return False
            if runtime.get_context().stop.event.is_set():
                return False

    def on_change(self, callback: Callable[[List[str]], None]) -> None:
        """Calls `callback(names)` from a thread of its own each time members join or leave,
        until the program (or this node) stops."""
        stop = runtime.get_context().stop.event
        context = runtime.get_context()

        def watch():
            runtime.set_thread_context(context)
            while not stop.is_set():
                try:
                    if self.wait_for_change(1.0):
                        callback(self.names())
                except Exception:  # pylint: disable=broad-except
                    if stop.is_set():
                        return
                    logging.exception('Watching the members of group %s failed.', self.label)
                    stop.wait(1.0)

        threading.Thread(target=watch, daemon=True, name=f'lp-group-{self.label}').start()

    # Why members left, and supervision (`launchpad.process.supervision`).

    def events(self, timeout: Optional[float] = 0) -> List[MemberEvent]:
        """The members that left since the last call (the first: since the launch), oldest
        first, each saying why (`lp.MemberEvent`: finished, removed, failed with its error and
        traceback, dropped, killed); waits up to `timeout` seconds (None: until one leaves or
        the node stops)."""
        coordinator = _coordinator()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with self._lock:
                since = self._events_seen
            found = coordinator.member_events(
                self.label, since, _LONGEST_WAIT if left is None else min(left, _LONGEST_WAIT))
            if found:
                with self._lock:
                    self._events_seen = since + len(found)
                return list(found)
            if ((deadline is not None and time.monotonic() >= deadline)
                    or runtime.get_context().stop.event.is_set()):
                return []

    def supervise(self) -> None:
        """Makes this node the owner of the group's failures: a member failure that would fail
        the program (its restart policy spent) is handed to this node instead, as a 'failed'
        event; it decides with `replace`, `lp.resize` or `fail`."""
        _coordinator().supervise(self.label, runtime.get_context().node_name)

    def replace(self, name: str) -> None:
        """Starts again member `name`, whose failure this node took over (its next attempt)."""
        _coordinator().settle_failure(name, 'replace')

    def fail(self, name: str) -> None:
        """Fails the program with the failure of member `name`, which this node took over."""
        _coordinator().settle_failure(name, 'fail')

    # Calling members.

    def call_all(self, method: str, *args, timeout: Optional[float] = None,
                 return_exceptions: bool = False, **kwargs) -> Dict[str, Any]:
        """Calls `method(*args, **kwargs)` on every live member at once; member name -> result.

        Members that leave during the call are left out. Another error is raised (the first
        member's, in member order), unless `return_exceptions`: then it is that member's value.
        `timeout` bounds the whole call (a slow member's TimeoutError is its error).
        """
        members = {name: client for name, client in self.members().items() if client is not None}
        futures = {name: getattr(client.futures, method)(*args, **kwargs)
                   for name, client in members.items()}
        results: Dict[str, Any] = {}
        done, _ = concurrent.futures.wait(list(futures.values()), timeout)
        first_error = None
        for name, future in futures.items():
            if future not in done:
                error: Optional[BaseException] = TimeoutError(
                    f'{name}.{method} did not answer within {timeout} s')
            else:
                error = future.exception()
            if error is None:
                results[name] = future.result()
            elif isinstance(error, NodeLeftError):
                continue
            elif return_exceptions:
                results[name] = error
            elif first_error is None:
                first_error = error
        if first_error is not None:
            raise first_error
        return results

    def call_any(self, method: str, *args, **kwargs) -> Any:
        """Calls `method` on one live member, trying the next if it left; raises
        `NodeLeftError` if there is none (or every one left)."""
        members = [(name, client) for name, client in self.members().items()
                   if client is not None]
        for _, client in members:
            try:
                return getattr(client, method)(*args, **kwargs)
            except NodeLeftError:
                continue
        raise NodeLeftError(f'group {self.label} has no member that serves {method}: '
                            f'{len(members)} tried.')

    def _update(self, found) -> None:
        with self._lock:
            self._known = [(name, list(ids)) for name, ids in found]
            current = {name for name, _ in self._known}
            for name in list(self._clients):
                if name not in current:
                    del self._clients[name]
            for name, ids in self._known:
                if name not in self._clients:
                    self._clients[name] = self._client(name, ids)

    def _client(self, name: str, address_ids: List[str]) -> Any:
        if not address_ids:
            return None
        address = Address('courier')
        address.id = address_ids[0]
        return node_client(address, name, self._client_kwargs)

    def __repr__(self) -> str:
        return f'GroupClient({self.label!r})'


def _coordinator():
    coordinator = runtime.get_context().coordinator
    if coordinator is None:
        raise RuntimeError('This node has no coordinator to ask for its group\'s members.')
    return coordinator
