"""What every courier transport shares: its interfaces, addresses, futures and errors.

The transports (:mod:`.grpc`, :mod:`.framed_client`, :mod:`.framed_server`)
import this module and never each other, as in :mod:`concurrent.futures`. Each
error message a caller may see is written once here, so that a call fails the
same way whichever transport carried it.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import errno
import ipaddress
import os
import socket
from typing import Any, Callable, List, Optional, Sequence, Type

from courier import errors
from courier import security
from courier import wire
from courier.transport import _compat

UNIX_PREFIX = 'unix:'
MAX_UNIX_PATH_BYTES = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux.
# The longest method name a call may carry, encoded as UTF-8 (the framed server's limit too).
MAX_METHOD_BYTES = 64 << 10

# handle_call(method, pickle, buffers): the buffers are writable and owned by the call.
HandleCall = Callable[[str, memoryview, List[Any]], wire.Response]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A parsed address: ``kind`` is 'tcp' (with host, port) or 'unix' (with path)."""

    kind: str
    host: str = ''
    port: int = 0
    path: str = ''

    @property
    def is_local(self) -> bool:
        """Whether only this machine can connect (Unix socket or loopback host)."""
        if self.kind == 'unix' or self.host == 'localhost':
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    @property
    def grpc_target(self) -> str:
        if self.kind == 'unix':
            return UNIX_PREFIX + self.path
        return tcp_address(self.host, self.port)


def parse_address(address: str) -> Endpoint:
    """Parses ``'host:port'``, ``'[ipv6]:port'`` or ``'unix:/path'``.

    Raises:
      ValueError: the address has neither form.
    """
    if not isinstance(address, str):
        raise TypeError(f'a courier address must be a str, got {type(address).__name__}')
    if address.startswith(UNIX_PREFIX):
        path = address[len(UNIX_PREFIX):]
        if path.startswith('//'):  # gRPC's 'unix:///abs/path' spelling.
            path = path[2:]
        if not path:
            raise ValueError(f'courier address {address!r} has no socket path; '
                             f"use 'unix:/path/to/socket'")
        return Endpoint('unix', path=path)
    host, sep, port = address.rpartition(':')
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"courier address {address!r} is not 'host:port' or 'unix:/path'")
    if host.startswith('[') and host.endswith(']'):
        host = host[1:-1]
    return Endpoint('tcp', host=host, port=int(port))


def tcp_address(host: str, port: int) -> str:
    """Returns the ``host:port`` address, bracketing IPv6 hosts."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


_WILDCARD_HOSTS = ('', '0.0.0.0', '::', '[::]')


def connectable_host(host: str) -> str:
    """Returns the host clients should dial for a server bound on ``host``."""
    if host not in _WILDCARD_HOSTS:
        return host
    # Bound on every interface: name the machine so that other hosts can connect too.
    hostname = socket.gethostname()
    try:
        socket.getaddrinfo(hostname, None)
    except OSError:
        return '127.0.0.1'
    return hostname


def check_unix_path_free(path: str) -> None:
    """Refuses a socket path that is too long or where a live server listens.

    gRPC would silently unlink a live server's socket and take over its path.
    """
    if len(os.fsencode(path)) > MAX_UNIX_PATH_BYTES:
        raise OSError(errno.ENAMETOOLONG,
                      f'unix socket path {path!r} is longer than {MAX_UNIX_PATH_BYTES} '
                      f'bytes; use a shorter path')
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return  # Stale socket file; the server replaces it.
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f'another server is listening on unix socket {path!r}')


class ClientTransport(abc.ABC):
    """Carries calls from a client to one server address."""

    address: str
    # What carries the calls: 'framed' (courier's frames, on a Unix socket or TCP) or 'grpc'.
    protocol: Optional[str] = None

    @abc.abstractmethod
    def call(self, method: str, pickle: bytes, buffers: Sequence[memoryview],
             timeout: Optional[float]) -> wire.Response:
        """Calls ``method`` and returns the server's response.

        Raises:
          errors.CourierError: the call did not reach the server or no response
            came back (timeout, server unavailable, permission denied, ...).
        """

    @abc.abstractmethod
    def call_async(self, method: str, pickle: bytes, buffers: Sequence[memoryview],
                   timeout: Optional[float],
                   finish: Callable[[wire.Response], Any]) -> concurrent.futures.Future:
        """Starts a call; the returned future resolves to ``finish(response)``.

        Cancelling the future cancels the call.
        """

    @abc.abstractmethod
    def list_methods(self, timeout: Optional[float]) -> List[str]:
        """Returns the names of the methods bound on the server."""

    @abc.abstractmethod
    def close(self) -> None:
        """Releases the connection; calls in flight fail."""


class ServerTransport(abc.ABC):
    """Accepts calls on one address and hands them to the server's callables."""

    address: str

    @abc.abstractmethod
    def start(self) -> None:
        """Starts accepting calls."""

    @abc.abstractmethod
    def stop(self, grace: Optional[float]) -> None:
        """Stops accepting calls, waits up to ``grace`` seconds for calls in flight."""


class CallFuture(_compat.LightFuture):
    """The future of a call; cancelling it also cancels the call, through ``on_cancel``.

    It is a ``concurrent.futures.Future`` (wait, as_completed, callbacks, cancel), made and
    read for less (:mod:`._compat`).
    """

    on_cancel: Optional[Callable[[], Any]] = None
    # The client's AddressResolver.explain, applied to a ServerUnavailableError when the
    # outcome is read (in the reader's thread: it may call out), not where the call failed.
    explain: Optional[Callable[[BaseException], BaseException]] = None

    def result(self, timeout: Optional[float] = None) -> Any:
        try:
            return super().result(timeout)
        except errors.ServerUnavailableError as error:
            explained = self._explained(error)
            if explained is error:
                raise
            raise explained from error

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        return self._explained(super().exception(timeout))

    def _explained(self, error: Optional[BaseException]) -> Optional[BaseException]:
        """``error`` as ``explain`` says it, once (every later reader gets the same)."""
        explain = self.explain
        if explain is None or not isinstance(error, errors.ServerUnavailableError):
            return error
        explained = explain(error)
        if explained is not error:
            explained.__cause__ = error
        with self.locked():
            if self.explain is explain:
                self.explain = None
                self.replace_exception(error, explained)
        return self.exception_now()

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        on_cancel, self.on_cancel = self.on_cancel, None
        if on_cancel is not None:
            on_cancel()
        return True

    def track(self, cancel: Callable[[], Any]) -> None:
        """Makes ``cancel`` the cancel hook, and calls it if the future is cancelled already."""
        self.on_cancel = cancel
        if self.cancelled():
            cancel()

    def fail(self, error: BaseException) -> None:
        try:
            self.set_exception(error)
        except concurrent.futures.InvalidStateError:  # Cancelled or completed meanwhile.
            pass
        self.on_cancel = None  # What it holds (a connection, an RPC) is not needed anymore.

    def resolve(self, finish: Callable[[Any], Any], response: Any) -> None:
        """Completes the future with what ``finish(response)`` returns or raises."""
        try:
            result = finish(response)
        except BaseException as error:  # pylint: disable=broad-except
            self.fail(error)
            return
        try:
            self.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass
        self.on_cancel = None


def decode_response(data: Any, method: str, address: str) -> wire.Response:
    """Decodes an encoded ``wire.Response``; its buffers come out writable, like local arrays."""
    try:
        response = wire.decode_response(data)
    except ValueError as error:
        raise call_error(errors.ProtocolError, method, address,
                         f'got a malformed response: {error}') from None
    response.buffers = [bytearray(buffer) for buffer in response.buffers]
    return response


def decode_method_list(data: Any, address: str) -> List[str]:
    try:
        return wire.decode_method_list(data)
    except ValueError as error:
        raise call_error(errors.ProtocolError, LIST_METHODS, address,
                         f'got a malformed method list: {error}') from None


def encode_method(method: str, address: str) -> bytes:
    """Returns ``method`` as the UTF-8 a call carries, or raises the courier error saying why."""
    try:
        encoded = method.encode()
    except UnicodeEncodeError as error:
        raise call_error(errors.SerializationError, method, address,
                         f'cannot be made: the method name is not valid Unicode ({error})'
                         ) from None
    if len(encoded) > MAX_METHOD_BYTES:
        raise call_error(errors.SerializationError, method[:64] + '...', address,
                         f'cannot be made: the method name is {len(encoded):,} bytes long, '
                         f'longer than the {MAX_METHOD_BYTES:,} bytes courier allows')
    return encoded


# Why a server refuses a call, by the token the call carried.
NO_TOKEN = ('the server requires an auth token and the call carried none; pass '
            f'auth_token= to courier.Client or set {security.AUTH_TOKEN_ENV}')
WRONG_TOKEN = ('the call carried the wrong auth token; client and server must use the same '
               f'auth_token (or {security.AUTH_TOKEN_ENV})')


def call_error(kind: Type[errors.CourierError], method: str, address: str,
               what: str) -> errors.CourierError:
    """Returns ``kind('call to <method> on courier server <address> <what>')``."""
    return kind(f'call to {method!r} on courier server {address} {what}')


# What a method named in a call error is called when the call lists the methods.
LIST_METHODS = 'ListMethods'


def call_timeout(method: str, address: str, timeout: Optional[float]) -> errors.CourierError:
    # "Deadline Exceeded": the words of gRPC's status, which code written for dm-launchpad
    # looks for in the message.
    return call_error(errors.CallTimeoutError, method, address,
                      f'timed out{_after(timeout)} (Deadline Exceeded: call_timeout); pass a '
                      f'larger call_timeout if the method needs longer')


def unreachable_timeout(method: str, address: str,
                        timeout: Optional[float]) -> errors.CourierError:
    return call_error(errors.ServerUnreachableTimeoutError, method, address,
                      f'timed out{_after(timeout)} (Deadline Exceeded): the server was not '
                      f'reachable (wait_for_ready=True waited for it to come up). Is it '
                      f'running, and is the address right?')


def unavailable(method: str, address: str, details: str,
                wait_for_ready: bool) -> errors.CourierError:
    hint = ('' if wait_for_ready else
            ' Is it running? Pass wait_for_ready=True to wait for it to come up.')
    return call_error(errors.ServerUnavailableError, method, address,
                      f'failed: the server is unavailable ({details}).{hint}')


def refused(method: str, address: str, reason: str) -> errors.CourierError:
    return call_error(errors.PermissionDeniedError, method, address, f'was refused: {reason}')


def rejected_as_malformed(method: str, address: str, details: str) -> errors.CourierError:
    return call_error(errors.ProtocolError, method, address,
                      f'was rejected as malformed: {details}')


def stopped_during_call(method: str, address: str) -> errors.CourierError:
    return call_error(errors.ServerUnavailableError, method, address,
                      'failed: the server stopped during the call')


class NotFramedError(errors.ProtocolError):
    """The server does not speak courier's framed protocol (it answered in gRPC's HTTP/2, or
    chose no courier protocol under TLS): :mod:`courier.transport` calls it over gRPC instead."""


def not_framed(method: str, address: str, how: str) -> errors.CourierError:
    return call_error(NotFramedError, method, address,
                      f'failed: the server does not speak courier\'s framed protocol ({how})')


def closed(method: str, address: str) -> errors.CourierError:
    return call_error(errors.ServerUnavailableError, method, address,
                      'failed: the client was closed (courier.Client.close)')


def busy(method: str, address: str, reason: str) -> errors.CourierError:
    """The server refused the connection at one of its limits (``reason`` says which)."""
    return call_error(errors.ServerUnavailableError, method, address,
                      f'failed: the server refused the connection: {reason}')


def unknown_method(method: str, address: str, existing: Sequence[str]) -> errors.CourierError:
    # "not found": the words code written for dm-launchpad looks for in the message.
    names = ', '.join(repr(name) for name in existing) or 'none'
    return errors.UnknownMethodError(
        f'courier server {address} has no method {method!r} (method not found); its methods '
        f'are: {names}')


def _after(timeout: Optional[float]) -> str:
    return f' after {timeout:g}s' if timeout is not None else ''
