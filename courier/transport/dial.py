"""How a framed client reaches its server: the socket (Unix, TCP, TLS), the hello, and what
each answer to the hello means.

A client connects, says hello (its mode and the auth token) and reads the answer:
WELCOME, or REFUSED saying why (a wrong token, a connection limit), or a FAULT. A
server not up yet is tried again every 1 to 20 ms while the caller waits for it. A
TCP peer that answers in HTTP/2, or a TLS peer that chooses no courier protocol, is a
server that speaks only gRPC: the attempt fails with ``_base.NotFramedError``. A TCP client
of a server on its own host goes on on the server's same-host Unix socket (:mod:`.same_host`).
"""

from __future__ import annotations

import errno
import functools
import math
import os
import select
import socket
import time
from typing import Callable, Optional, Tuple, Type

from courier import errors
from courier import security
from courier.transport import _base
from courier.transport import _here
from courier.transport import frames
from courier.transport import keepalive
from courier.transport import same_host
from courier.transport import shm

_RETRY_FIRST = 0.001  # Seconds between connection attempts to a server not yet up: doubling...
_RETRY_MAX = 0.02     # ... up to this, so that a node notices a new server within 20 ms.
# Connections a peer may close during the hello, in a row, before a call gives up on it.
_HELLO_ATTEMPTS = 5
# Seconds a TCP connection may sit idle before a call checks that the server has not closed it.
_IDLE_CHECK = 0.002
# Seconds a client gives a server's same-host socket to welcome it before it stays on TCP.
_SAME_HOST_TIMEOUT = 5.0
# Errors of a TCP connection attempt after which a server that is not up yet may come up
# (ETIMEDOUT: its host did not answer for keepalive.DEAD_AFTER seconds).
_RETRIED = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                      errno.ECONNRESET, errno.ECONNABORTED, errno.EAGAIN, errno.ETIMEDOUT})


class Target:
    """Where a transport connects: a Unix socket, or a TCP host and port, maybe with TLS."""

    def __init__(self, endpoint: _base.Endpoint, tls: Optional[security.TLSConfig]):
        self.path = os.path.abspath(endpoint.path) if endpoint.kind == 'unix' else None
        self.host, self.port = endpoint.host, endpoint.port
        # A plaintext TCP server's clients ask whether it is on their host (:mod:`.same_host`),
        # and then dial its same-host socket instead while that works.
        self.upgrade = same_host.ENABLED and self.path is None and tls is None
        self.same_host: Optional[bytes] = None
        self.tls = None
        if tls is not None:
            from courier.transport import tls as tls_module  # pylint: disable=import-outside-toplevel
            self.tls = tls_module
            self.context = tls_module.client_context(tls)
            self.server_name = tls_module.server_name(tls, endpoint.host)

    def connect(self, deadline: Optional[float]) -> socket.socket:
        """Returns a connected socket (TLS: after the handshake).

        Raises:
          Unreachable: the attempt failed for good (also: no courier protocol under TLS).
          socket.timeout: the deadline passed first.
          OSError: the attempt failed; a server not up yet may be there later.
        """
        if self.path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                if deadline is not None:
                    time_out_at(sock, deadline)
                sock.connect(self.path)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = self._connect_tcp(deadline)
        if self.tls is None:
            return sock
        try:
            sock = self.tls.wrap(self.context, sock, server_hostname=self.server_name)
        except OSError as error:  # Includes ssl.SSLError: not a TLS server, or gone.
            sock.close()
            if deadline_passed(error):
                raise
            if isinstance(error, self.tls.CertificateError):
                raise unreachable(f"failed: TLS: the server's certificate is not trusted "
                                  f'({describe(error)})') from None
            raise unreachable(f'failed: the TLS handshake failed ({describe(error)}); does the '
                              f'server serve TLS (courier.Server(tls=...))?') from None
        if sock.selected_alpn_protocol() != self.tls.COURIER:
            sock.close()
            raise Unreachable(functools.partial(
                _base.not_framed, how='under TLS it chose no courier protocol'))
        return sock

    def _connect_tcp(self, deadline: Optional[float]) -> socket.socket:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as error:
            raise OSError(errno.EAGAIN, f'cannot resolve {self.host!r}: {error}') from None
        last: OSError = OSError(errno.EHOSTUNREACH, f'no address for {self.host!r}')
        for family, kind, protocol, _, sockaddr in infos:
            sock = socket.socket(family, kind, protocol)
            try:
                keepalive.configure(sock)  # Also bounds connecting to a host that is silent.
                if deadline is not None:
                    time_out_at(sock, deadline)
                sock.connect(sockaddr)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError as error:
                sock.close()
                if deadline_passed(error):
                    raise
                last = error
        raise last


class ServerHere(Exception):
    """The server turned out to run in this process: call it there."""


class Unreachable(Exception):
    """No connection could be made: ``error(method, address)`` is what each call raises."""

    def __init__(self, error: Callable[[str, str], errors.CourierError]):
        super().__init__()
        self.error = error


def unreachable(what: str,
                kind: Type[errors.CourierError] = errors.ServerUnavailableError) -> Unreachable:
    """Returns the Unreachable whose calls raise ``kind('call to ... <what>')``."""
    return Unreachable(functools.partial(_base.call_error, kind, what=what))


class DialedConnection:
    """One socket to the server, after a successful hello."""

    __slots__ = ('sock', 'reader', 'tcp', 'used', 'shared', 'timed', '__weakref__')

    def __init__(self, sock: socket.socket):
        self.sock = sock
        frames.enlarge_send_buffer(sock)
        self.reader = frames.FrameReader(sock)
        # A Unix socket tells a sender at once (EPIPE) when its peer closed it; TCP accepts the
        # bytes and loses them: blocking calls on TCP check first (closed_meanwhile).
        self.tcp = sock.family != socket.AF_UNIX
        self.used = time.monotonic()  # When its last blocking call started.
        # Large buffers go both ways in shared memory (the server said so in its welcome).
        self.shared = False
        # Whether the socket may have a timeout (dialing sets one, and so does a blocking call
        # with a deadline): a call without one then clears it; others skip the system call.
        self.timed = True

    def closed_meanwhile(self) -> bool:
        """Whether the server closed this idle TCP connection (or said why it will).

        Without this check, a call on a connection whose server stopped or restarted
        would fail as if the server had gone away during it. Nothing arrives on an idle
        connection but a server's last words, so a readable one is closed. Checked only
        when the previous call started ``_IDLE_CHECK`` seconds ago or more, which
        back-to-back calls never pay for.
        """
        now = time.monotonic()
        idle, self.used = now - self.used, now
        if idle < _IDLE_CHECK:
            return False
        if self.reader.buffered:
            return True
        poller = select.poll()  # Not select(): it fails on descriptors above 1,024.
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(0))

    def for_two_threads(self) -> None:
        """Readies the connection for a futures pipeline: a reader thread reads it while
        callers send on it. A TLS socket goes non-blocking, so that each SSL read and write
        holds its lock and none of the waits does (:func:`.tls.wrap`)."""
        if hasattr(self.sock, 'courier_lock'):  # (A plain socket takes a reader and a sender.)
            self.sock.setblocking(False)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # Wakes a thread blocked reading it.
        except OSError:
            pass
        self.sock.close()
        self.reader.close_descriptors()

    def __del__(self):  # The connection of a thread that ended.
        self.sock.close()
        self.reader.close_descriptors()


def open_connection(target: Target, token: Optional[str], mode: int, wait_for_ready: bool,
                    deadline: Optional[float], here: bool = False) -> DialedConnection:
    """Connects and says hello, waiting for the server to come up if asked to.

    Raises:
      Unreachable: no server (and no waiting), or it refused the hello, or the peer
        keeps closing connections during the hello (it is not a courier server), or it
        speaks only gRPC (the error is then a NotFramedError).
      ServerHere: ``here`` is true and the server started in this process meanwhile.
      socket.timeout: the deadline passed first.
    """
    delay = _RETRY_FIRST
    closed_in_hello = 0
    path = target.path
    offers = True  # Until a server older than the offers (shared memory, upgrade) refuses them.
    while True:
        if here and path is not None and path in _here.servers:
            raise ServerHere
        if target.same_host is not None:
            connection = _dial_same_host(target, token, mode, deadline)
            if connection is not None:
                return connection
        try:
            sock = target.connect(deadline)
        except Unreachable:
            raise
        except OSError as error:
            if deadline_passed(error):
                raise
            retried = (isinstance(error, (FileNotFoundError, ConnectionRefusedError))
                       or path is None and error.errno in _RETRIED)
            if not retried:
                raise unreachable(f'failed: cannot connect to its socket ({describe(error)})'
                                  ) from None
            if not wait_for_ready:
                raise Unreachable(functools.partial(
                    _base.unavailable, details=describe(error), wait_for_ready=False)) from None
        else:
            connection = DialedConnection(sock)
            offer = _offer(target, sock) if offers else 0
            answer, error = _hello(connection, token, mode | offer)
            if answer is not None and answer.kind == frames.WELCOME:
                _share_memory(connection, offer, answer)
                if offer & frames.SAME_HOST:
                    return _upgrade(connection, answer.text, target, token, mode, deadline)
                return connection
            connection.close()
            if offer and answer is not None and answer.kind == frames.REFUSED and (
                    answer.status == frames.BAD_HELLO):
                offers = False  # It knows no offers: hello again without any, at once.
                continue
            if answer is not None:
                raise refusal(answer)
            if target.tls is not None and isinstance(error, target.tls.Error):
                raise unreachable(f'failed: the server ended TLS ({describe(error)}); does it '
                                  f'require a client certificate (TLSConfig.certificate_chain) '
                                  f'signed by its root_certificates?')
            closed_in_hello += 1
            if not wait_for_ready:
                raise unreachable(f'failed: the server closed the connection '
                                  f'({describe(error)})')
            if closed_in_hello >= _HELLO_ATTEMPTS:
                raise unreachable(
                    f'failed: the socket closed the connection during the hello '
                    f'{closed_in_hello} times in a row ({describe(error)}); it does not '
                    f'serve the courier protocol', errors.ProtocolError)
        pause = delay if deadline is None else min(delay, deadline - time.monotonic())
        if pause <= 0:
            raise socket.timeout
        time.sleep(pause)
        delay = min(2 * delay, _RETRY_MAX)


def _offer(target: Target, sock: socket.socket) -> int:
    """What a client offers in its hello on ``sock``."""
    if sock.family == socket.AF_UNIX:
        return frames.SHARED_MEMORY if shm.ENABLED else 0
    return frames.SAME_HOST if target.upgrade else 0


def _share_memory(connection: DialedConnection, offer: int, welcome: frames.Frame) -> None:
    """Large buffers go in shared memory on ``connection`` if both sides said so."""
    if offer & frames.SHARED_MEMORY and welcome.status & frames.SHARED_MEMORY:
        connection.shared = True
        connection.reader.take_descriptors()


def _upgrade(connection: DialedConnection, text: bytes, target: Target, token: Optional[str],
             mode: int, deadline: Optional[float]) -> DialedConnection:
    """The welcomed TCP ``connection``, or one on the server's same-host socket in its place
    when the server, whose WELCOME said ``text``, runs on this host."""
    address = same_host.socket_of(text, same_host.host_identity())
    if address is None:  # Another host, or a server that offers no upgrade:
        target.upgrade = False  # its later connections need not ask.
        return connection
    target.same_host = address
    upgraded = _dial_same_host(target, token, mode, deadline)
    if upgraded is None:
        target.upgrade = False  # It does not work here (see _dial_same_host): TCP from now on.
        return connection
    connection.close()
    return upgraded


def _dial_same_host(target: Target, token: Optional[str], mode: int,
                    deadline: Optional[float]) -> Optional[DialedConnection]:
    """A welcomed connection on the server's same-host socket, or None (and the target dials
    TCP again) when that fails in any way: e.g. the server stopped, or restarted elsewhere."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection = None
    try:
        time_out_at(sock, min(deadline or math.inf, time.monotonic() + _SAME_HOST_TIMEOUT))
        sock.connect(target.same_host)
        connection = DialedConnection(sock)
        offer = _offer(target, sock)
        answer, _ = _hello(connection, token, mode | offer)
        if answer is not None and answer.kind == frames.WELCOME:
            sock.settimeout(None)  # As a TCP connection's: a call sets its own deadline.
            _share_memory(connection, offer, answer)
            return connection
    except (OSError, Unreachable):  # (socket.timeout is an OSError)
        pass
    if connection is not None:
        connection.close()
    sock.close()
    target.same_host = None
    return None


def _hello(connection: DialedConnection, token: Optional[str],
           mode: int) -> Tuple[Optional[frames.Frame], Optional[BaseException]]:
    """Says hello; returns the server's answer, or (None, why) if it closed the connection.

    Raises:
      socket.timeout: the deadline passed first.
    """
    sock = connection.sock
    try:
        frames.send(sock, frames.encode(
            frames.HELLO, mode, frames.VERSION, (token or '').encode(), frames.MAGIC))
    except OSError as error:
        if deadline_passed(error):
            connection.close()
            raise
        # Else a server refusing the connection may have closed it first: its answer says why.
    try:
        first = connection.reader.peek(_HTTP2_HEADER)
        if first and first[0] not in _ANSWERS:
            if len(first) == _HTTP2_HEADER and first[3] == 4 and first[5:] == bytes(4):
                # An HTTP/2 SETTINGS frame (type 4, stream 0): what a gRPC server sends first.
                raise Unreachable(functools.partial(
                    _base.not_framed, how='it answered in HTTP/2, as a gRPC server does'))
            raise unreachable(f'failed: the socket does not serve the courier protocol (it '
                              f'answered the hello with {first!r})', errors.ProtocolError)
        return connection.reader.read_frame(), None
    except Unreachable:
        connection.close()
        raise
    except (EOFError, OSError, frames.ProtocolViolation) as error:
        if deadline_passed(error):
            connection.close()
            raise
        return None, error


# The kinds of frame a server answers a hello with.
_ANSWERS = (frames.WELCOME, frames.REFUSED, frames.FAULT)
_HTTP2_HEADER = 9  # Bytes of an HTTP/2 frame's header: length (3), type, flags, stream (4).


def refusal(answer: frames.Frame) -> Unreachable:
    """What each call raises when the server answered the hello with ``answer``, not WELCOME."""
    text = answer.text.decode(errors='replace')
    if answer.kind == frames.REFUSED and answer.status in frames.REFUSALS:
        return Unreachable(functools.partial(_base.refused,
                                             reason=frames.REFUSALS[answer.status]))
    if answer.kind == frames.REFUSED and answer.status == frames.BUSY:
        return Unreachable(functools.partial(_base.busy, reason=text))
    if answer.kind == frames.REFUSED and answer.status == frames.TLS_REQUIRED:
        return unreachable(f'failed: {text}')
    return unreachable(f'failed: the socket does not serve the courier protocol ({text})',
                       errors.ProtocolError)


def time_out_at(sock: socket.socket, deadline: float) -> None:
    """Makes ``sock``'s operations time out at ``deadline``; raises socket.timeout if it passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise socket.timeout
    sock.settimeout(remaining)


def deadline_passed(error: BaseException) -> bool:
    """Whether ``error`` is a socket's timeout (the caller's deadline passed), not the kernel's
    ETIMEDOUT (the peer stopped answering: :mod:`.keepalive`); Python raises TimeoutError for
    both."""
    return isinstance(error, socket.timeout) and error.errno is None


def describe(error: BaseException) -> str:
    return f'{type(error).__name__}: {error}' if str(error) else type(error).__name__
