"""The far end of a relay tunnel (`launchpad.observe.tunnel`): joins its stdin and stdout to a
supervisor's observer socket on the supervisor's host.

    python relay.py SOCKET PID

Started there by a command such as an `srun` step in a Slurm job, once for each connection a
tunnel's user opens. It first says in one line whether the supervisor (process PID, listening
on SOCKET) still runs: `up`, then it copies bytes both ways until either side ends; or `gone`,
and it ends. It is run as a script, not as a module, so that it starts without importing
launchpad (standard library only).
"""
import os
import socket
import sys
import threading

_CHUNK = 65536


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


def main(argv) -> int:
    path, pid = argv[1], int(argv[2])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.kill(pid, 0)
        connection.connect(path)
    except OSError:  # the process, or its socket, is gone
        _write_all(1, b'gone\n')
        return 0
    _write_all(1, b'up\n')
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
