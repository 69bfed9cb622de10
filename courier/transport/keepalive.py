"""How long a TCP connection waits for a peer that went silent: one set of constants.

A peer that vanishes without a reset (its host frozen or cut off the network, a pod deleted
while its address goes dark) leaves a connection that TCP would keep for about 15 minutes of
retransmissions, or for ever while nothing is sent. Courier's TCP sockets, client and server,
framed protocol and gRPC, end such a connection after about :data:`DEAD_AFTER` seconds, and
ride out shorter silences (a network cut of 30 s costs nothing but the wait; gRPC's pings are
slower, see :func:`grpc_channel_options`):

- an idle connection, or one whose call is running on the server, is probed after
  :data:`IDLE` seconds without a byte from the peer, then every :data:`INTERVAL` seconds; it
  ends once nothing came back for :data:`DEAD_AFTER` seconds (TCP keepalive);
- data sent and not acknowledged for :data:`DEAD_AFTER` seconds ends it (TCP_USER_TIMEOUT;
  this also bounds connecting to a host that does not answer).

Either way the socket fails with ETIMEDOUT (or EHOSTUNREACH), and courier fails the calls on it
with ``ServerUnavailableError``; the next call connects again.
"""

from __future__ import annotations

import socket
from typing import Tuple

IDLE = 10        # Seconds without a byte from the peer before the first probe.
INTERVAL = 5     # Seconds between probes.
PROBES = 10      # Unanswered probes after which the peer counts as dead.
DEAD_AFTER = IDLE + INTERVAL * PROBES  # 60 s: also how long sent data may stay unacknowledged.
# Seconds without a byte from a gRPC server before a gRPC client pings it, while calls wait:
# the shortest interval gRPC servers accept by default (grpc_channel_options says why).
GRPC_PING_AFTER = 300


def configure(sock: socket.socket) -> None:
    """Gives TCP socket ``sock`` the dead-peer bounds: before it connects, or as a listener
    (the connections it accepts inherit them).

    Options a platform lacks are left out (TCP_USER_TIMEOUT is Linux's, TCP_KEEPIDLE is
    TCP_KEEPALIVE on macOS): the keepalive alone still ends an idle connection there.
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = getattr(socket, 'TCP_KEEPIDLE', getattr(socket, 'TCP_KEEPALIVE', None))
    for option, value in ((idle, IDLE), (getattr(socket, 'TCP_KEEPINTVL', None), INTERVAL),
                          (getattr(socket, 'TCP_KEEPCNT', None), PROBES),
                          (getattr(socket, 'TCP_USER_TIMEOUT', None), DEAD_AFTER * 1000)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def grpc_channel_options() -> Tuple[Tuple[str, int], ...]:
    """The same bounds for a gRPC channel, as far as gRPC servers allow them.

    gRPC sets TCP_USER_TIMEOUT to ``grpc.keepalive_timeout_ms``: data (a call, a ping) that
    stays unacknowledged for :data:`DEAD_AFTER` seconds ends the connection. A call that waits
    while nothing comes (its method running) is checked with an HTTP/2 ping only every
    :data:`GRPC_PING_AFTER` seconds: a gRPC server, by default, ends a connection that pings more
    often during such a call ("too_many_pings"), and servers outside courier (dm-launchpad's) keep
    that default. So such a call finds its server's host gone within about 6 minutes.
    """
    return (('grpc.keepalive_time_ms', GRPC_PING_AFTER * 1000),
            ('grpc.keepalive_timeout_ms', DEAD_AFTER * 1000))
