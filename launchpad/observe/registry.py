"""The registry of running programs on this machine, private to each user.

`lp.launch` registers every program it runs in the foreground, so that any shell of the same
user finds it (`python -m launchpad.launch list`); the entry goes when the program ends, and an
entry whose launching process died without removing it is pruned by the next reader (a detached
program's only once its keeper is gone too: until then the keeper starts a new supervisor, which
registers anew).

Where: `$LAUNCHPAD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/launchpad`, else `/tmp/lp-runtime-<uid>`
(the same in every shell of the user, whatever its TMPDIR). The directory must be a real
directory owned by the user with no access for anyone else (mode 0700); it is created so, and
refused otherwise. In it, per program:

    <id>.json   mode 0600: {"version": 1, "id", "name", "launch_type", "host", "pid",
                "pid_started" (the launcher's process start time, to tell a reused pid),
                "started", "nodes", "address" (its observer's courier address), "token" (the
                auth token every call to the observer must carry), "node_token" (the auth
                token every call to one of its nodes must carry, or null), "dashboard" (URL or
                null), "keeper_pid" (a detached program's keeper, which starts a new
                supervisor when this one dies; null for others), "ssh" (null, or for a
                program supervised on another host, a detached SSH program: the ssh command
                that reaches that host, its name last; "address", "host", "pid" and
                "keeper_pid" are then the supervisor's there, see `tunnel`), "hosts" (null, or
                for a detached SSH program: its hosts as ssh names them, where `attach
                --recover` may move its supervision), "relay" (null,
                or for a program supervised on another host that ssh does not reach, a
                detached Slurm or Kubernetes program: the command that, run here, relays its
                stdin and stdout to the observer's socket there, see `tunnel`), "job" (null, or the
                Slurm job that runs a detached Slurm program)}
    <id>.sock   the observer's Unix socket (`launchpad.observe.observer`; none for a program
                supervised on another host)
    <id>.<pid>.<random>.fwd  the local end of process <pid>'s tunnel to a program
                supervised on another host (`launchpad.observe.tunnel`)

Another user can neither list the directory, read an entry, nor connect to the socket, and a
call without the entry's token is refused.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import pathlib
import re
import secrets
import socket
import stat
import time
from typing import List, Optional

ENV = 'LAUNCHPAD_RUNTIME_DIR'
VERSION = 1
SOCKET_PATH_LIMIT = 107  # bytes of a Unix socket's path (Linux; macOS allows 103)
ORPHAN_AGE = 60.0  # seconds after which a socket without an entry is removed


class RegistryError(RuntimeError):
    """The registry cannot be used, or a program asked for is not in it."""


@dataclasses.dataclass
class Entry:
    """One running program (see the module docstring for the fields)."""
    id: str
    name: str
    launch_type: str
    address: str
    token: str
    host: str = dataclasses.field(default_factory=socket.gethostname)
    pid: int = dataclasses.field(default_factory=os.getpid)
    pid_started: float = 0.0
    started: float = dataclasses.field(default_factory=time.time)
    nodes: int = 0
    node_token: Optional[str] = None
    dashboard: Optional[str] = None
    keeper_pid: Optional[int] = None
    ssh: Optional[List[str]] = None
    hosts: Optional[List[str]] = None
    relay: Optional[List[str]] = None
    job: Optional[str] = None
    version: int = VERSION


def directory(create: bool = True) -> pathlib.Path:
    """The user's registry directory, checked to be private (created so if `create`)."""
    explicit = os.environ.get(ENV)
    if explicit:
        path = pathlib.Path(explicit)
    elif os.environ.get('XDG_RUNTIME_DIR'):
        path = pathlib.Path(os.environ['XDG_RUNTIME_DIR']) / 'launchpad'
    else:
        path = pathlib.Path('/tmp') / f'lp-runtime-{os.getuid()}'
    if create:
        try:
            path.mkdir(mode=0o700, parents=bool(explicit))
        except FileExistsError:
            pass
        except OSError as e:
            raise RegistryError(f'cannot create the registry of running programs {path}: '
                                f'{e.strerror}; set {ENV} to a directory of yours.') from e
    _check_private(path)
    return path


def _check_private(path: pathlib.Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return  # nothing registered yet
    except OSError as e:
        raise RegistryError(f'cannot read the registry of running programs {path}: '
                            f'{e.strerror}.') from e
    if not stat.S_ISDIR(info.st_mode):
        raise RegistryError(f'the registry of running programs {path} is not a directory; '
                            f'remove it, or set {ENV} to a private directory of yours.')
    if info.st_uid != os.getuid():
        raise RegistryError(f'the registry of running programs {path} belongs to another user '
                            f'(uid {info.st_uid}, you are {os.getuid()}): programs are visible '
                            f'to the user who launched them only. Set {ENV} to a directory of '
                            f'yours.')
    if info.st_mode & 0o077:
        raise RegistryError(f'the registry of running programs {path} is open to other users '
                            f'(mode {stat.S_IMODE(info.st_mode):o}); make it private with '
                            f'chmod 700 {path}, or set {ENV} to a private directory.')


def new_id(name: str) -> str:
    """An id for a new program named `name`: its name, made safe for a file name, and a random
    suffix."""
    safe = re.sub(r'[^A-Za-z0-9_.-]+', '-', name).strip('-.')[:40] or 'program'
    return f'{safe}-{secrets.token_hex(3)}'


def socket_path(program_id: str) -> pathlib.Path:
    """Where the observer of program `program_id` listens."""
    return unix_socket_path(f'{program_id}.sock')


def unix_socket_path(name: str) -> pathlib.Path:
    """The path of socket `name` in the registry directory, checked to fit a Unix socket.

    Raises:
      RegistryError: the path is too long (the directory's path is).
    """
    path = directory() / name
    size = len(os.fsencode(path))
    if size > SOCKET_PATH_LIMIT:
        raise RegistryError(
            f'the socket path {path} has {size} bytes, more than the {SOCKET_PATH_LIMIT} a Unix '
            f'socket\'s path may have: the registry of running programs is in too long a '
            f'directory. Set {ENV}= to a shorter private directory (e.g. /tmp/lp-$USER).')
    return path


def is_remote(entry: Entry) -> bool:
    """True if `entry`'s program is supervised on another host (reached through `tunnel`)."""
    return entry.ssh is not None or entry.relay is not None


def register(entry: Entry) -> None:
    """Writes (or rewrites) `entry`, atomically and readable by this user only."""
    path = directory() / f'{entry.id}.json'
    if not entry.pid_started and not is_remote(entry):
        entry.pid_started = process_started(entry.pid) or 0.0
    temporary = path.with_suffix('.tmp')
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:
        json.dump(dataclasses.asdict(entry), f, indent=1)
    os.replace(temporary, path)


def unregister(program_id: str) -> None:
    """Removes the entry of `program_id` and its socket, if there."""
    folder = directory(create=False)
    for path in [folder / f'{program_id}{suffix}' for suffix in ('.json', '.sock')] + list(
            folder.glob(f'{glob.escape(program_id)}.*.fwd')):  # (`tunnel`'s)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def entries() -> List[Entry]:
    """Every registered program that is still running and whose observer listens, oldest
    first; prunes the others. (A program is registered just before its observer binds its
    socket: until then it is left out, so what is listed can be called.) A program supervised
    on another host is listed without asking that host (`tunnel.running` does)."""
    folder = directory(create=False)
    if not folder.exists():
        return []
    found = []
    for path in sorted(folder.glob('*.json')):
        try:
            entry = Entry(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours to read
        if is_remote(entry):
            found.append(entry)
        elif not _alive(entry):
            if not keeper_alive(entry):  # (else it starts a new supervisor, which registers)
                unregister(entry.id)
        elif path.with_suffix('.sock').exists():
            found.append(entry)
    _remove_orphan_sockets(folder)
    return sorted(found, key=lambda entry: entry.started)


def _remove_orphan_sockets(folder: pathlib.Path) -> None:
    """Removes sockets without an entry that are older than a minute (left by a launcher killed
    while it unregistered), and the tunnels' sockets of processes that are gone (`tunnel`)."""
    for path in folder.glob('*.fwd'):
        pid = path.name.rsplit('.', 3)[1]
        if not pid.isdigit() or process_started(int(pid)) is None:
            try:
                os.unlink(path)
            except OSError:
                pass
    for path in folder.glob('*.sock'):
        try:
            if (not path.with_suffix('.json').exists()
                    and time.time() - os.lstat(path).st_mtime > ORPHAN_AGE):
                os.unlink(path)
        except OSError:
            pass


def find(query: str) -> Entry:
    """The running program whose id is `query`, whose id starts with it, or named `query`.

    Raises:
      RegistryError: none matches, or several do (the message lists them).
    """
    running = entries()
    for matches in ([e for e in running if e.id == query],
                    [e for e in running if e.name == query],
                    [e for e in running if e.id.startswith(query)]):
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            ids = ', '.join(entry.id for entry in matches)
            raise RegistryError(f'{len(matches)} running programs match {query!r}: {ids}; '
                                f'name one by its id.')
    names = ', '.join(f'{e.name} ({e.id})' for e in running) or 'none'
    raise RegistryError(f'no running program is named {query!r} or has that id; running '
                        f'programs of yours on this machine: {names} (see `python -m '
                        f'launchpad.launch list`).')


def _alive(entry: Entry) -> bool:
    """True if the entry's launching process still runs (and is not another with its pid)."""
    started = process_started(entry.pid)
    if started is None:
        return False
    return not (started and entry.pid_started) or abs(started - entry.pid_started) < 1.0


def keeper_alive(entry: Entry) -> bool:
    """True if the keeper of detached program `entry`, supervised on this machine, still runs:
    not another process that took its pid, which started after the supervisor (the keeper forks
    its supervisors).

    Raises:
      ValueError: `entry` is supervised on another host, whose pids mean nothing here (its
        tunnel's check asks that host, see `tunnel`).
    """
    if is_remote(entry):
        raise ValueError(f'program {entry.id} is supervised on {entry.host}: its keeper\'s pid '
                         'means nothing on this machine; ask there (`tunnel`).')
    if entry.keeper_pid is None:
        return False
    started = process_started(entry.keeper_pid)
    if started is None:
        return False
    return not (started and entry.pid_started) or started <= entry.pid_started + 1.0


def process_started(pid: int) -> Optional[float]:
    """When process `pid` started; None if there is none, 0.0 if that cannot be read."""
    import psutil  # pylint: disable=import-outside-toplevel
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # ended, not yet waited for
            return None
        return process.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return 0.0
