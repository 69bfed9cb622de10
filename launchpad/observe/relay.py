"""The far end of a relay tunnel (`launchpad.observe.tunnel`): joins its stdin and stdout to a
supervisor's observer socket on the supervisor's host.

    python relay.py SOCKET

Started there by a command such as an `srun` step in a Slurm job, once for each connection a
tunnel's user opens. It first says in one line whether the supervisor listening on SOCKET runs:
`up`, with the JSON of its registry entry's `pid`, `token` and `keeper_pid` (they change when a
new supervisor replaced a dead one), then it copies bytes both ways until either side ends; or
`gone`, and it ends. While SOCKET is there but refuses (its supervisor was killed, and its
keeper starts another), it waits for the next one, up to WAIT seconds. It is run as a script,
not as a module, so that it starts without importing launchpad (standard library only).
"""
import json
import os
import socket
import sys
import threading
import time

_CHUNK = 65536
WAIT = 60.0


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _upstream(connection: socket.socket) -> None:
    """Copies stdin to the socket; its end ends our half of the connection."""
    try:
        while True:
            data = os.read(0, _CHUNK)
            if not data:
                break
            connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _connect(path: str) -> socket.socket:
    """A connection to the socket at `path`, waiting while it is there but refuses."""
    deadline = time.monotonic() + WAIT
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except (ConnectionRefusedError, FileNotFoundError):
            connection.close()
            if not os.path.exists(path) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _supervisor(path: str) -> dict:
    """The registry entry's fields a new supervisor changes, from beside its socket."""
    try:
        with open(path[:-len('.sock')] + '.json') as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return {}
    return {key: entry.get(key) for key in ('pid', 'token', 'keeper_pid')}


def main(argv) -> int:
    path = argv[1]
    try:
        connection = _connect(path)
    except OSError:  # the supervisor, and its socket, are gone
        _write_all(1, b'gone\n')
        return 0
    _write_all(1, f'up {json.dumps(_supervisor(path))}\n'.encode())
    threading.Thread(target=_upstream, args=(connection,), daemon=True).start()
    try:
        while True:
            data = connection.recv(_CHUNK)
            if not data:
                break
            _write_all(1, data)
    except OSError:
        pass
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
