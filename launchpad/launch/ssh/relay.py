"""Joins an ssh session's standard streams to the Unix socket of a host agent that outlives it.

The agent of a detached program (`agent`, started with `--detached`) runs apart from the ssh
session that started it and listens on a socket in its private directory (mode 0600 in a 0700
directory); a supervisor talks to it through a relay on the agent's host, which copies the
session's input to the socket and the socket's output to the session. A new supervisor reaches
the same agent again with

    ssh HOST python <launchpad>/launch/ssh/relay.py SOCKET

It uses the standard library only, so that it starts in milliseconds run as a file.
"""
from __future__ import annotations

import os
import select
import socket
import sys


def relay(connection: socket.socket, stdin: int = 0, stdout: int = 1) -> None:
    """Copies `stdin` to `connection` and `connection` to `stdout` until either ends."""
    sock = connection.fileno()
    while True:
        for fd in select.select([stdin, sock], [], [])[0]:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b''
            if not data:  # either side ended: so does the session, and the agent hears it
                connection.close()
                return
            target = sock if fd == stdin else stdout
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(target, view):]
            except OSError:
                connection.close()
                return


def main() -> None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(sys.argv[1])
    except OSError as e:
        sys.exit(f'No agent listens on {sys.argv[1]}: {e.strerror} (its program has ended).')
    relay(connection)


if __name__ == '__main__':
    main()
