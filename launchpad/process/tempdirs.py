"""launchpad's temporary directories (`launchpad-KIND-*`): each names the processes that own
it, so that one left behind by owners that were killed (SIGKILL, a machine's test bed torn
down) is removed by the next launch on the same machine (`sweep`).

A node's directories go inside its program's run directory when it has one (`RUN_DIR_ENV`, set
by the worker), so that they leave with the program however the node ends; the directories of
the launch itself are removed by whoever of its processes is the last out, and, if all of them
were killed, by the sweep.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import tempfile
from typing import List, Optional, Tuple

import psutil

PREFIX = 'launchpad-'
OWNERS_FILE = '.owners'  # in each directory: a line 'machine pid start-time host' per owner
RUN_DIR_ENV = 'LAUNCHPAD_RUN_DIR'  # a node's run directory, where its own directories go


def make(kind: str = '', inside_run: bool = True) -> str:
    """Creates a private directory for `kind` of use, owned by this process; returns its path.

    In a node with a run directory ($LAUNCHPAD_RUN_DIR) and `inside_run`, it is `KIND-*` in
    there (a short path, for the Unix sockets it may hold), gone when the run directory goes;
    else `launchpad-KIND-*` in the system's temporary directory (`tempfile.gettempdir()`), and
    making it sweeps the ones there whose owners all ended.
    """
    run_dir = os.environ.get(RUN_DIR_ENV) if inside_run else None
    if run_dir and os.path.isdir(run_dir):
        path = tempfile.mkdtemp(prefix=f'{kind or "tmp"}-', dir=run_dir)
    else:
        sweep()
        path = tempfile.mkdtemp(prefix=f'{PREFIX}{kind}-' if kind else PREFIX)
    try:
        _add_owner(path, os.O_CREAT)
    except BaseException:  # (a Ctrl-C: the caller never gets the path to remove it)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def claim(path: str) -> None:
    """Adds this process to the owners of the directory `path` that `make` made (a process that
    shares or takes over a directory another process made: a node its launcher's, a detached
    program's next keeper); nothing if it has no owners file (gone, or of another host)."""
    _add_owner(path, 0)  # (never O_CREAT: no new file in a directory being removed)


def _add_owner(path: str, create: int) -> None:
    me = (_machine(), os.getpid(), _start_time(os.getpid()))
    if not path or me in [owner[:3] for owner in owners(path)]:
        return
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(path, OWNERS_FILE), os.O_WRONLY | create | os.O_APPEND,
                     0o600)
        try:
            os.write(fd, ' '.join(map(str, (*me, socket.gethostname()))).encode() + b'\n')
        finally:
            os.close(fd)


def leave(path: str) -> None:
    """This owner of the directory `path` is done with it: removes it if no other owner runs
    (the others were killed, or ended before), since this process is then the last out."""
    me = (_machine(), os.getpid(), _start_time(os.getpid()))
    found = owners(path)
    if found and not any(_alive(owner) for owner in found if owner[:3] != me):
        shutil.rmtree(path, ignore_errors=True)


def sweep(directory: Optional[str] = None) -> List[str]:
    """Removes the `launchpad-*` directories in `directory` (default: the system's temporary
    directory) whose owners all ended, on this machine; returns their paths. A directory that
    names no owner (made by an older launchpad), or an owner on another machine, is kept."""
    removed = []
    for path in glob.glob(os.path.join(directory or tempfile.gettempdir(), f'{PREFIX}*')):
        found = owners(path)
        if found and not any(_alive(owner) for owner in found):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def owners(path: str) -> List[Tuple[str, int, str, str]]:
    """(machine, pid, start time, host name) of each owner of the directory `path`."""
    try:
        with open(os.path.join(path, OWNERS_FILE)) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) == 4 and fields[1].isdigit():
            found.append((fields[0], int(fields[1]), fields[2], fields[3]))
    return found


def _alive(owner: Tuple[str, int, str, str]) -> bool:
    machine, pid, start_time, _ = owner
    if machine != _machine():
        return True  # another machine's or container's (a shared file system): not ours to judge
    return _start_time(pid) == start_time


def _start_time(pid: int) -> str:
    """When process `pid` started (so that a reused pid is not taken for it), '' if none runs."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return ''
        return f'{process.create_time():.2f}'
    except psutil.Error:
        return ''


def _machine() -> str:
    """This boot of this machine, and this process's pid namespace: where pids mean the same."""
    try:
        with open('/proc/sys/kernel/random/boot_id') as f:
            boot = f.read().strip()
    except OSError:
        boot = f'boot-{psutil.boot_time():.0f}'
    try:
        namespace = os.readlink('/proc/self/ns/pid').replace(' ', '')
    except OSError:
        namespace = 'pid'
    return f'{boot}/{namespace}'
