"""The same-host upgrade: a TCP client of a server on its own host calls it on a Unix socket.

Nodes of a multi-host launch (SSH, Slurm, Kubernetes) reach each other at their host's TCP
address, also when caller and server share a host, where a Unix socket would carry large
buffers in shared memory (:mod:`.shm`). So a TCP server without TLS also listens on a Unix
socket in Linux's abstract namespace: it belongs to the server's network namespace, leaves no
file behind, and goes with its socket, also when the process is killed. A TCP client offers
``frames.SAME_HOST`` in its hello; the server's WELCOME then names its host and that socket
(:func:`welcome_text`), and a client on the same host (:func:`socket_of`) dials the socket
and calls there from then on; when anything about it fails, it stays on TCP (:mod:`.dial`).

Same host means the same running kernel (its boot id) and the same network namespace: two
namespaces of one machine (containers, pods, the SSH test bed's hosts) are different hosts,
and cannot reach each other's abstract sockets anyway. ``COURIER_SAME_HOST=0`` in a process's
environment (read at import) turns the upgrade off there, for its servers and its clients.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from typing import Optional, Tuple

_BOOT_ID = '/proc/sys/kernel/random/boot_id'
_NETWORK_NAMESPACE = '/proc/self/ns/net'
_PREFIX = b'courier-'  # Of the sockets' abstract names (after the leading NUL byte).

# Whether this process's TCP servers listen on a same-host socket and its TCP clients ask.
ENABLED = sys.platform.startswith('linux') and os.environ.get(
    'COURIER_SAME_HOST', '1').strip().lower() not in ('0', 'false', 'off', 'no')


def host_identity() -> Optional[bytes]:
    """This process's host as the upgrade compares it: the kernel's boot id and the device and
    inode of its network namespace, or None where they cannot be read."""
    try:
        with open(_BOOT_ID, 'rb') as boot_id:
            boot = boot_id.read().strip()
        namespace = os.stat(_NETWORK_NAMESPACE)
    except OSError:
        return None
    if not boot or b' ' in boot:
        return None
    return b'%s:%d:%d' % (boot, namespace.st_dev, namespace.st_ino)


def listener(backlog: int) -> Optional[Tuple[socket.socket, bytes]]:
    """A listening Unix socket under a fresh abstract name, and the WELCOME text that names it
    with this host; None when the upgrade is off or cannot be offered here."""
    if not ENABLED:
        return None
    identity = host_identity()
    if identity is None:
        return None
    name = _PREFIX + secrets.token_hex(16).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(b'\0' + name)
        sock.listen(backlog)
    except OSError:
        sock.close()
        return None
    return sock, welcome_text(identity, name)


def welcome_text(identity: bytes, name: bytes) -> bytes:
    """What a server's WELCOME says to a client that offered the upgrade."""
    return identity + b' ' + name


def socket_of(text: bytes, identity: Optional[bytes]) -> Optional[bytes]:
    """The address of the same-host socket named by a WELCOME's ``text``, or None unless the
    server is on the host ``identity`` (the caller's :func:`host_identity`)."""
    server, _, name = text.rpartition(b' ')
    if identity is None or server != identity or not name.startswith(_PREFIX):
        return None
    return b'\0' + name
