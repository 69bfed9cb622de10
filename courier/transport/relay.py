"""The relay that lets gRPC clients call a framed server: HTTP/2 connections go to its gRPC service.

A courier server on TCP owns one port. Its event loop (:mod:`.loop`) tells a gRPC
client by the first bytes it sends (HTTP/2's connection preface) or by the protocol
it chose under TLS (ALPN ``h2``), and hands the connection here. One thread moves the
bytes between each such connection and the server's gRPC service, which listens on a
private Unix socket and is started when the first gRPC client comes:

    loop thread ──hand(connection, bytes read so far)──▶ relay thread (one per server)
                                                             │ selector over every pair:
        client's socket (TCP, maybe TLS) ◀──── bytes ────▶ gRPC service's Unix socket
                                                             │ either side closes or fails
                                                             ▼
                                                closed(connection): the loop forgets it

A relayed connection costs two sockets and its buffers (at most ``_CAP`` each way, so a
slow reader only slows its own writer), never a thread. Only gRPC clients pay for the
relay; courier's own clients speak the framed protocol on the same port.
"""

from __future__ import annotations

import collections
import logging
import selectors
import socket
import threading
from typing import Any, Callable, Deque, Optional, Set

from courier.transport import tls

_logger = logging.getLogger('courier')

_CAP = 256 << 10  # Bytes buffered in each direction of a pair before reading pauses.
_CHUNK = 64 << 10


class _Pair:
    """One relayed connection: the client's socket, the gRPC service's, a buffer each way."""

    __slots__ = ('owner', 'front', 'back', 'to_back', 'to_front', 'front_eof', 'back_eof',
                 'shut_back', 'events')

    def __init__(self, owner: Any, front: socket.socket, back: socket.socket, data: bytes):
        self.owner = owner
        self.front = front
        self.back = back
        self.to_back = bytearray(data)
        self.to_front = bytearray()
        self.front_eof = False
        self.back_eof = False
        self.shut_back = False
        self.events = {front: 0, back: 0}  # What the selector watches each socket for.


class Relay:
    """Moves bytes between gRPC clients of a framed server and its gRPC service.

    Args:
      backend: returns the Unix socket path of the gRPC service, starting it on first use;
        called on the relay thread.
      closed: ``closed(owner)`` is called once a relayed connection is over (any thread).
      name: names the thread.
    """

    def __init__(self, backend: Callable[[], str], closed: Callable[[Any], None], name: str):
        self._backend = backend
        self._closed = closed
        self._name = name
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._handed: Deque[tuple] = collections.deque()
        self._pairs: Set[_Pair] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def hand(self, owner: Any, front: socket.socket, data: bytes) -> None:
        """Relays ``front`` (non-blocking), which sent ``data`` so far. Any thread."""
        with self._lock:
            if self._stopping:
                stopped = True
            else:
                stopped = False
                self._handed.append((owner, front, data))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, daemon=True,
                                                    name=self._name)
                    self._thread.start()
        if stopped:
            self._closed(owner)
            return
        try:
            self._wake_write.send(b'!')
        except OSError:  # Full: the relay is awake anyway.
            pass

    def stop(self) -> None:
        """Ends every relayed connection and the thread."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        try:
            self._wake_write.send(b'!')
        except OSError:
            pass
        if thread is not None:
            thread.join()
        else:
            self._shut()

    # The relay thread.

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select():
                    if key.data is None:
                        self._take_handed()
                    elif key.data in self._pairs:
                        self._pump(key.data)
        except Exception:  # pylint: disable=broad-except
            _logger.exception('courier server %s: its gRPC relay failed', self._name)
        finally:
            self._shut()

    def _shut(self) -> None:
        with self._lock:
            self._stopping = True
            handed = list(self._handed)
            self._handed.clear()
        for owner, _, _ in handed:
            self._closed(owner)
        for pair in list(self._pairs):
            self._end(pair)
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def _take_handed(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except OSError:
            pass
        while True:
            with self._lock:
                if not self._handed:
                    return
                owner, front, data = self._handed.popleft()
            try:
                path = self._backend()
                back = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    back.connect(path)
                except OSError:
                    back.close()
                    raise
            except Exception as error:  # pylint: disable=broad-except
                _logger.warning('courier server %s cannot relay a gRPC client to its gRPC '
                                'service: %s', self._name, error)
                self._closed(owner)
                continue
            back.setblocking(False)
            pair = _Pair(owner, front, back, data)
            self._pairs.add(pair)
            self._pump(pair)

    def _pump(self, pair: _Pair) -> None:
        """Moves what can move now, both ways, and watches for what comes next."""
        try:
            moved = True
            while moved:
                moved = False
                if not pair.front_eof and len(pair.to_back) < _CAP:
                    got, pair.front_eof = _read(pair.front, pair.to_back)
                    moved |= got
                if not pair.back_eof and len(pair.to_front) < _CAP:
                    got, pair.back_eof = _read(pair.back, pair.to_front)
                    moved |= got
                if pair.to_back:
                    moved |= _write(pair.back, pair.to_back)
                if pair.to_front:
                    moved |= _write(pair.front, pair.to_front)
        except OSError:  # Either side failed (TLS errors included): the connection is over.
            self._end(pair)
            return
        if pair.front_eof and not pair.to_back and not pair.shut_back:
            pair.shut_back = True  # The client is done sending: so is the relay, to the service.
            try:
                pair.back.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if pair.back_eof and not pair.to_front:  # The service is done, and the client has it all.
            self._end(pair)
            return
        self._watch(pair, pair.front,
                    (not pair.front_eof and len(pair.to_back) < _CAP, bool(pair.to_front)))
        self._watch(pair, pair.back,
                    (not pair.back_eof and len(pair.to_front) < _CAP, bool(pair.to_back)))

    def _watch(self, pair: _Pair, sock: socket.socket, wants: tuple) -> None:
        events = (selectors.EVENT_READ if wants[0] else 0) | (
            selectors.EVENT_WRITE if wants[1] else 0)
        if events == pair.events[sock]:
            return
        if not events:
            self._selector.unregister(sock)
        elif not pair.events[sock]:
            self._selector.register(sock, events, pair)
        else:
            self._selector.modify(sock, events, pair)
        pair.events[sock] = events

    def _end(self, pair: _Pair) -> None:
        self._pairs.discard(pair)
        for sock in (pair.front, pair.back):
            if pair.events[sock]:
                try:
                    self._selector.unregister(sock)
                except (KeyError, ValueError):
                    pass
                pair.events[sock] = 0
        pair.back.close()
        self._closed(pair.owner)  # Closes the client's socket.


def _read(sock: socket.socket, buffer: bytearray) -> tuple:
    """Reads what ``sock`` has, up to the cap: returns (whether bytes came, whether it ended)."""
    got = False
    while len(buffer) < _CAP:
        try:
            data = sock.recv(_CHUNK)
        except tls.WOULD_BLOCK:
            return got, False
        except tls.CLOSED:  # The peer's TLS close_notify.
            return got, True
        if not data:
            return got, True
        buffer += data
        got = True
    return got, False


def _write(sock: socket.socket, buffer: bytearray) -> bool:
    """Sends what ``sock`` takes from the front of ``buffer``: returns whether it took any."""
    try:
        sent = sock.send(memoryview(buffer)[:_CAP])
    except tls.WOULD_BLOCK:
        return False
    del buffer[:sent]
    return sent > 0
