"""Joins its stdin and stdout to a Unix socket: the far end of a command that reaches a process
on another host through that host's own way in (ssh, a Slurm step, `kubectl exec`).

    python relay.py SOCKET                 a supervisor's observer (`launchpad.observe.tunnel`)
    python relay.py --absent-exits SOCKET  the same, asked again while no socket is there (a
                                           Slurm job's driver, `launchpad.launch.slurm.reach`)
    python relay.py --plain SOCKET         a detached SSH program's host agent (`launch.ssh.agent`)

For a tunnel (started there by an `srun` step in a Slurm job, or `kubectl exec` into a
Kubernetes coordinator pod, once for each connection a tunnel's user opens), it first says in
one line whether the supervisor listening on SOCKET runs: `up`, with the JSON of its registry
entry's `pid`, `token` and `keeper_pid` (they change when a new supervisor replaced a dead one),
then it copies bytes both ways until either side ends; or `gone`, and it ends. While SOCKET is
there but refuses (its supervisor was killed, and its keeper starts another), it waits for the
next one, up to WAIT seconds. With `--absent-exits`, where no socket is there it says nothing
and exits with ABSENT instead of `gone`: a Slurm job's driver may be between lives (its socket
not yet bound), and only Slurm says whether the job, and so the program, has ended.

With `--plain` (a new supervisor of a detached SSH program reaching a host's agent again,
`launchpad.launch.ssh.protocol.relay_argv`) it says nothing and does not wait: it copies bytes
both ways, or, if no agent listens on SOCKET, says so on stderr and exits 1 (ssh's own failures
exit 255). The agent's first session uses `join` in the same way.

It is run as a script, not as a module, so that it starts in milliseconds without importing
launchpad (standard library only).
"""
import json
import os
import socket
import sys
import threading
import time

_CHUNK = 65536
WAIT = 60.0
PLAIN = '--plain'
ABSENT_EXITS = '--absent-exits'
ABSENT = 75  # the exit code of `--absent-exits` when no socket is there (EX_TEMPFAIL)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _upstream(connection: socket.socket, stdin: int) -> None:
    """Copies `stdin` to the socket; its end ends our half of the connection."""
    try:
        while True:
            data = os.read(stdin, _CHUNK)
            if not data:
                break
            connection.sendall(data)
        connection.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def join(connection: socket.socket, stdin: int = 0, stdout: int = 1) -> None:
    """Copies `stdin` to `connection` and `connection` to `stdout` until the socket's side
    ends (the end of `stdin` ends our half of it, which the other side hears)."""
    threading.Thread(target=_upstream, args=(connection, stdin), daemon=True).start()
    try:
        while True:
            data = connection.recv(_CHUNK)
            if not data:
                break
            _write_all(stdout, data)
    except OSError:
        pass
    finally:
        connection.close()


def _connect(path: str, wait: float) -> socket.socket:
    """A connection to the socket at `path`, waiting up to `wait` s while it is there but
    refuses."""
    deadline = time.monotonic() + wait
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
    if argv[1:2] == [PLAIN]:
        path = argv[2]
        try:
            connection = _connect(path, 0.0)
        except OSError as e:
            sys.stderr.write(f'No agent listens on {path}: {e.strerror} (its program has '
                             'ended).\n')
            return 1
        join(connection)
        return 0
    absent_exits = argv[1:2] == [ABSENT_EXITS]
    path = argv[-1]
    try:
        connection = _connect(path, WAIT)
    except OSError:  # the supervisor, and its socket, are gone
        if absent_exits:
            return ABSENT
        _write_all(1, b'gone\n')
        return 0
    _write_all(1, f'up {json.dumps(_supervisor(path))}\n'.encode())
    join(connection)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
