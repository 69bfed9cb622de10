"""Futures of calls that an AddressResolver re-sends when their server goes away.

``client.futures.name(...)`` of a method whose resolver counts its calls
(``AddressResolver.resends``) returns a :class:`ResentFuture`: its call goes out as any
future's, and when it fails with ``ServerUnavailableError`` the call is sent again, to the
server the resolver finds next, while ``AddressResolver.resend`` allows, as a blocking call
of that method would be. The futures of other methods are the transport's own (nothing
here runs for them).

Deciding and re-sending waits (for a restarting server, and on the resolver), so it never
runs in the transport's thread that completed the failed call: one thread per client, started
when a call fails and ended when no failed call is left, takes the failed calls in the order
they failed.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, List, Optional

from courier import errors
from courier.transport import _base


class ResentFuture(_base.CallFuture):
    """The future of a call that goes again when its server goes away (see the module).

    Cancelling it cancels the call it is waiting for, and sends no other.
    """

    def __init__(self, client, method: str, args: tuple, kwargs: dict, sends):
        """``sends``: counts the failures of the call as sends (the client's ``_Sends``)."""
        super().__init__()
        self._sends = sends
        self._client = client
        self._method = method
        self._call = (args, kwargs)
        self._current: Optional[concurrent.futures.Future] = None
        self.explain = client._address.explain  # pylint: disable=protected-access
        self.track(self._cancel_current)

    def send(self) -> 'ResentFuture':
        """Sends the call (again), unless this future was cancelled."""
        if not self.cancelled():
            args, kwargs = self._call
            call = self._client._call_async(  # pylint: disable=protected-access
                self._method, args, kwargs)
            self._current = call
            if self.cancelled():
                call.cancel()
            call.add_done_callback(self._landed)
        return self

    def _cancel_current(self) -> None:
        current = self._current
        if current is not None:
            current.cancel()

    def _landed(self, call: concurrent.futures.Future) -> None:
        """The call ended (in the transport's thread): passes its outcome on, or hands a call
        that lost its server to the client's resender."""
        if call.cancelled():
            return
        error = concurrent.futures.Future.exception(call)  # as raised, not yet explained
        if isinstance(error, errors.ServerUnavailableError) and not self.cancelled():
            _resender(self._client).add(self, error)
        elif error is not None:
            self.fail(error)
        else:
            try:
                self.set_result(call.result())
            except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                pass

    def lost(self, error: errors.ServerUnavailableError) -> None:
        """The call lost its server with ``error`` (in the resender's thread): sends it again
        where the resolver says so, else fails with ``error``."""
        sent = self._sends.lost(error)
        client = self._client
        if self.cancelled():
            return
        try:  # what the resolver raises, as a blocking call would, the future raises
            if not client._address.resend(self._method, sent):  # pylint: disable=protected-access
                self.fail(error)
                return
            client._connection()  # pylint: disable=protected-access  (waits for the server)
        except Exception as failure:  # pylint: disable=broad-except
            self.fail(failure)
            return
        self.send()


class _Resender:
    """Takes one client's failed calls in the order they failed, in a thread of its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._failed: List[Any] = []
        self._running = False
        self._pid = os.getpid()

    def add(self, future: ResentFuture, error: errors.ServerUnavailableError) -> None:
        with self._lock:
            self._failed.append((future, error))
            if self._running and self._pid == os.getpid():
                return
            self._running, self._pid = True, os.getpid()
        threading.Thread(target=self._run, daemon=True, name='courier-resend').start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._failed:
                    self._running = False
                    return
                future, error = self._failed.pop(0)
            future.lost(error)


_resenders_lock = threading.Lock()


def _resender(client) -> _Resender:
    resender = client.__dict__.get('_resender')
    if resender is None:
        with _resenders_lock:
            resender = client.__dict__.setdefault('_resender', _Resender())
    return resender
