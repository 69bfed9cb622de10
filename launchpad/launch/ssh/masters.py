"""A detached SSH program's master connections, which outlive its supervisor.

Runs on the supervisor's host. A detached program's supervisor reaches each host's agent through
an ssh session over that host's master connection (OpenSSH's ControlMaster), whose control
socket is in a private directory of the program's run directory (`directory`, mode 0700). The
first session to a host starts its master, which goes to the background (ControlPersist) and is
handed to the keeper (the subreaper of what the supervisor starts): it outlives the supervisor,
and the new supervisor that the keeper starts after a death reaches the agents over the same
masters, with no new TCP connection, key exchange or login (seconds on a loaded machine); and
with no session either: each master forwards a local socket beside it (`a` and a digest of the
agent's) to its host's agent's socket (`forward`), so that no remote shell runs with the user's
startup files.

The masters end with the program:
- at its end (stop, or its last node ended) its supervisor ends them (`end_all`), and so does
  its keeper when it ends (after a supervisor that died too often, or one fenced off);
- a master that carries no session for IDLE seconds ends by itself: one whose keeper and
  supervisor were both killed (SIGKILL) ends IDLE seconds after their last session, which ends
  with the supervisor; one whose keeper alone was killed serves its supervisor to the end;
- a master whose host went away ends after ssh's keepalive (`protocol.LAUNCHER_SILENCE_TIMEOUT`),
  with its sessions, as a connection of its own would;
- a master through which no session opens, nor a forward answers, within SESSION_TIMEOUT (its
  host is cut off, and its keepalive has not given up yet) is ended by the supervisor that asked
  (`Connection.hello_again`): the next connection to that host is a new one, so a new
  supervisor is not held up by it.
A short directory outside the run directory, whose keeper and supervisor were both killed, is
left behind empty (its masters remove their sockets); the run directory goes with the program.
A master whose socket was removed while it ran (its sessions go on; a new connection to its host
starts a new master) is found at the end by the title OpenSSH gives it (`ssh: SOCKET [mux]`).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
from typing import Dict, List, Optional, Sequence

import psutil

from launchpad.launch.ssh import protocol

# Seconds a master without sessions stays (ssh's ControlPersist): longer than a new supervisor
# may take to start (unpickling the program imports its modules) before it opens its sessions.
IDLE = 30
SESSION_TIMEOUT = 5.0  # seconds a session over a running master may take to open
NAME = 'ssh'  # the directory of the control sockets in the run directory
_SUN_PATH = 107  # bytes of a Unix socket's path
_BINDING = 17  # ssh binds a master's socket as PATH.<16 random characters>, then renames it
_SOCKET_NAME = 4  # bytes of a master's socket's name: 'h' and the host's number


def directory(run_dir: str) -> Optional[str]:
    """The private directory (made if missing) of the control sockets of the masters of the
    program run from `run_dir`: in it, or where its path is too long for the sockets, a short
    one in the system's temporary directory named after it; None if neither fits."""
    for path in _places(run_dir):
        if len(os.fsencode(path)) + 1 + _SOCKET_NAME + _BINDING > _SUN_PATH:
            continue
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        found = os.lstat(path)
        if (stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid()
                and stat.S_IMODE(found.st_mode) == 0o700):
            return path
    logging.warning('No directory for ssh master connections fits a Unix socket\'s path (%s); '
                    'a new supervisor connects to the hosts anew. Set TMPDIR to a shorter '
                    'directory to keep them.', run_dir)
    return None


def _places(run_dir: str) -> List[str]:
    digest = hashlib.sha1(os.path.abspath(run_dir).encode()).hexdigest()[:12]
    return [os.path.join(run_dir, NAME),
            os.path.join(tempfile.gettempdir(), f'{protocol.DIR_PREFIX}m-{digest}')]


def socket_path(directory_: str, host, hosts: Dict[str, Sequence]) -> Optional[str]:
    """The control socket of `host`'s master in `directory_`, named after its place among the
    program's `hosts` (of each group), which every supervisor of the program knows alike; None
    for a host not among them, or past the 1000th (it gets connections of its own)."""
    keys = sorted({_ssh_key(each) for group in hosts.values() for each in group})
    key = _ssh_key(host)
    name = f'h{keys.index(key)}' if key in keys else ''
    return os.path.join(directory_, name) if 0 < len(name) <= _SOCKET_NAME else None


def _ssh_key(host) -> str:
    """What makes ssh reach the same server as the same user (hosts that differ only in what
    runs there share a master)."""
    return repr((host.host, host.user, host.port, host.identity_file, tuple(host.ssh_options)))


def argv(path: str) -> List[str]:
    """ssh's options for a session over the master at `path`, started by it if none runs."""
    return ['-S', path.replace('%', '%%'), '-o', 'ControlMaster=auto',
            '-o', f'ControlPersist={IDLE}', '-o', 'StreamLocalBindUnlink=yes']


def forward(path: str, remote: str) -> Optional[str]:
    """Has the master at `path` forward a local socket beside it to the Unix socket `remote`
    on its host, each connection over a channel of its own (no remote shell or session:
    milliseconds, where a session runs the user's shell and its startup files); returns the
    local socket, or None if the master did not take it (gone, or the server allows no
    forwarding). A forward that the master has already is kept. (Named after `remote`: two
    agents on one host, of hosts that differ in what runs there, share a master.)"""
    digest = hashlib.sha1(remote.encode()).hexdigest()[:_BINDING - 1]  # (fits as 'hN.' + 16)
    local = os.path.join(os.path.dirname(path), f'a{digest}')
    try:
        done = subprocess.run(['ssh', '-F', os.devnull, '-S', path.replace('%', '%%'), '-O',
                               'forward', '-L', f'{local}:{remote}', 'master'],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=10.0,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return local if done.returncode == 0 else None


def end(path: str) -> bool:
    """Ends the master at `path` and its sessions; True if one ran there (a stale socket, of a
    master that was killed, is removed)."""
    try:
        ended = subprocess.run(['ssh', '-F', os.devnull, '-S', path.replace('%', '%%'),
                                '-O', 'exit', 'master'], stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=10.0, check=False)
        if ended.returncode != 0 and os.path.exists(path):  # (no master listens)
            os.unlink(path)
        return ended.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as e:
        logging.warning('Could not end the ssh master connection at %s: %s', path, e)
        return False


def end_all(run_dir: str) -> None:
    """Ends the masters of the program run from `run_dir` and removes the directory of their
    sockets where it is not in the run directory. Raises nothing: a keeper calls it last."""
    try:
        unreachable = _unreachable(_places(run_dir))
        ended = 0
        for place in _places(run_dir):
            try:
                names = os.listdir(place)
            except OSError:
                continue
            for name in names:
                path = os.path.join(place, name)
                if re.fullmatch(r'h\d+', name) and stat.S_ISSOCK(os.lstat(path).st_mode):
                    ended += end(path)
            if place != os.path.join(run_dir, NAME):
                shutil.rmtree(place, ignore_errors=True)
        for process in unreachable:
            try:
                process.terminate()
                ended += 1
            except psutil.NoSuchProcess:
                pass
        if ended:
            logging.info('Ended %d ssh master connections of %s.', ended, run_dir)
    except Exception:  # pylint: disable=broad-except
        logging.exception('Could not end the ssh master connections of %s.', run_dir)


def _unreachable(places: List[str]) -> List[psutil.Process]:
    """This user's masters of sockets in `places` whose socket is gone (removed while they
    ran), found by their title."""
    titles = re.compile(r'ssh: ((?:%s)/h\d+) \[mux\]' % '|'.join(map(re.escape, places)))
    found = []
    for process in psutil.process_iter(['cmdline', 'uids']):
        title = titles.fullmatch(' '.join(process.info['cmdline'] or []).strip())
        uids = process.info['uids']
        if title and uids is not None and uids.real == os.getuid() and not os.path.exists(
                title.group(1)):
            found.append(process)
    return found
