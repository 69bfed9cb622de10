"""The limits of a framed server, read from ``COURIER_*`` environment variables by default.

A server cannot be made to grow without bound: connections, hellos, calls in flight and
stalled frames each have a limit (docs/courier.md shows them), and a client at one gets an
error naming it.
"""

from __future__ import annotations

import dataclasses
import os


def _environment_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f'{name} must be a whole number, got {value!r}') from None
    if number < 1:
        raise ValueError(f'{name} must be at least 1, got {value!r}')
    return number


def _default_max_connections() -> int:
    try:
        import resource  # pylint: disable=import-outside-toplevel
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        soft = -1
    if soft < 0:
        return 4096
    # Half the descriptors a process may open: the rest stay for its clients, files, pipes.
    return max(64, min(4096, soft // 2))


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """The limits of one framed server; the defaults read ``COURIER_*`` environment variables.

    Attributes:
      max_connections: connections open at once, in any state (``COURIER_MAX_CONNECTIONS``;
        default half the process's file descriptor limit, at most 4096).
      max_connections_per_client: of those, from one client process (a Unix socket's peer)
        or one host (TCP) (``COURIER_MAX_CONNECTIONS_PER_CLIENT``; default: max_connections
        // 2, at least 1).
      hello_timeout: seconds a new connection may take to introduce itself
        (``COURIER_HELLO_TIMEOUT``, default 10).
      max_calls_in_flight: calls of one futures connection the server holds at once; past it
        the server reads no more of that connection until some are answered
        (``COURIER_MAX_CALLS_IN_FLIGHT``, default 4096).
      linger_ms: how long a worker keeps waiting on a connection that just made a call before
        it hands the connection back to the loop (``COURIER_LINGER_MS``, default 20: long
        enough for a client descheduled between two calls on a busy machine); a frame that
        brings less than 256 KiB in that time goes back to the loop too.
      stall_timeout: seconds a connection may send nothing in the middle of a frame, or take
        none of an answer's bytes, before the server drops it (``COURIER_STALL_TIMEOUT``,
        default 30). A frame of any size may take as long as it needs while its bytes keep
        coming.
    """

    max_connections: int = dataclasses.field(
        default_factory=lambda: _environment_int('COURIER_MAX_CONNECTIONS',
                                                 _default_max_connections()))
    max_connections_per_client: int = 0
    hello_timeout: float = dataclasses.field(
        default_factory=lambda: float(_environment_int('COURIER_HELLO_TIMEOUT', 10)))
    max_calls_in_flight: int = dataclasses.field(
        default_factory=lambda: _environment_int('COURIER_MAX_CALLS_IN_FLIGHT', 4096))
    linger_ms: int = dataclasses.field(
        default_factory=lambda: _environment_int('COURIER_LINGER_MS', 20))
    stall_timeout: float = dataclasses.field(
        default_factory=lambda: float(_environment_int('COURIER_STALL_TIMEOUT', 30)))

    def __post_init__(self):
        for name in ('max_connections', 'max_connections_per_client', 'max_calls_in_flight',
                     'linger_ms'):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (
                    value == 0 and name != 'max_connections_per_client'):
                raise ValueError(f'{name} must be a whole number of at least 1, got {value!r}')
        for name in ('hello_timeout', 'stall_timeout'):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f'{name} must be a positive number of seconds, got {value!r}')
        if not self.max_connections_per_client:
            object.__setattr__(self, 'max_connections_per_client', _environment_int(
                'COURIER_MAX_CONNECTIONS_PER_CLIENT', max(1, self.max_connections // 2)))
