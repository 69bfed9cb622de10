"""Reaching the observer of a program that is supervised on another host, through ssh.

A detached SSH program's supervisor runs on one of its hosts. The launching machine's registry
entry of it (`registry.Entry.ssh`) holds the ssh command that reaches that host, and `address`
is the observer's Unix socket there. A process that calls it opens a `Tunnel`: one ssh session
that first checks that the supervisor still runs, then forwards a private local socket to that
one. The session ends with the process that opened it (its input closes), so nothing lingers;
a laptop that lost the network and got it back simply opens a new one. Calls still carry the
entry's token.

A supervisor that died is replaced by its keeper there, whose new supervisor registers anew
(another pid and token): the check waits for it while the keeper lives, and sends the host's
entry, which `Tunnel` copies to this machine's.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import secrets
import select
import shlex
import subprocess
import threading
import time
from typing import Dict, Optional

import courier

from launchpad.observe import registry

_ANSWER_TIMEOUT = 30.0  # seconds beyond ssh's own connect timeout for the host to answer
_NEW_SUPERVISOR_WAIT = 100  # tenths of a second the check waits for a keeper's new supervisor
# On a supervisor's host, the script that starts a new keeper of program {id} (written by
# `launchpad.launch.detached.write_recover_script` in the program's run directory there).
RECOVER_SCRIPTS = '"${{TMPDIR:-/tmp}}"/launchpad-detached-{id}-*/recover'


class NoSupervisorError(registry.RegistryError):
    """The remote program's supervisor and keeper are gone, but its nodes may run on for the
    supervisor grace: `attach --recover` starts a new supervisor."""
_tunnels: Dict[str, 'Tunnel'] = {}  # program id -> this process's tunnel to it
_lock = threading.Lock()


class ProgramGoneError(registry.RegistryError):
    """The remote program's supervisor is gone: the program has ended (its entry here is
    removed)."""


class HostUnreachableError(registry.RegistryError):
    """The host of a remote program's supervisor cannot be reached from here now."""


def is_remote(entry: registry.Entry) -> bool:
    """True if `entry`'s supervisor runs on another host (reached through ssh)."""
    return entry.ssh is not None


class Tunnel:
    """One ssh session forwarding a private local socket to a remote observer's socket."""

    def __init__(self, entry: registry.Entry):
        self.path = str(registry.directory() / f'{entry.id}.{os.getpid()}.'
                                                f'{secrets.token_hex(3)}.fwd')
        remote = entry.address.split(':', 1)[1]
        *ssh, host = entry.ssh
        # The remote shell says whether the supervisor still runs (waiting while its keeper
        # starts a new one), with the host's entry of it, then holds the session open until
        # this process closes its input (or ends).
        pid = r's/^ *"%s": \([0-9]*\).*/\1/p'
        check = ('alive() { kill -0 "$1" 2>/dev/null && '  # (a zombie is not)
                 '! grep -qs "^[0-9]* (.*) Z" /proc/"$1"/stat; }; '
                 f'e={shlex.quote(remote[:-len(".sock")] + ".json")}; '
                 f'a=starting; for i in $(seq {_NEW_SUPERVISOR_WAIT}); do '
                 f'p=$(sed -n {shlex.quote(pid % "pid")} "$e" 2>/dev/null); '
                 f'k=$(sed -n {shlex.quote(pid % "keeper_pid")} "$e" 2>/dev/null); '
                 f'if test -S {shlex.quote(remote)} && alive "$p"; '
                 'then a="up $(tr -d \'\\n\' < "$e")"; break; fi; '
                 'if ! alive "$k"; then a=gone; '
                 f'for r in {RECOVER_SCRIPTS.format(id=entry.id)}; do '
                 'test -f "$r" && a=orphaned; done; break; fi; sleep 0.1; done; '
                 'echo "$a"; exec cat >/dev/null')
        self._process = subprocess.Popen(
            [*ssh, '-o', 'ExitOnForwardFailure=yes', '-o', 'ControlPath=none',
             '-L', f'{self.path}:{remote}', host, check],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)  # Ctrl-C here ends it through its input, not a signal
        answer = self._first_line()
        if answer.startswith('up '):
            _refresh(entry, json.loads(answer[3:]))
            return
        errors = self._close_and_read_errors()
        if answer == 'starting':
            raise registry.RegistryError(
                f'the supervisor of program {entry.name} ({entry.id}) on {entry.host} is gone '
                'and its keeper has not started a new one yet; try again in a while.')
        if answer == 'orphaned':
            raise NoSupervisorError(
                f'the supervisor of program {entry.name} ({entry.id}) on {entry.host} and its '
                'keeper are gone; its nodes stop after the supervisor grace unless `python -m '
                f'launchpad.launch attach --recover {entry.id}` starts a new one.')
        if answer == 'gone':
            registry.unregister(entry.id)
            raise ProgramGoneError(f'program {entry.name} ({entry.id}) has ended: its '
                                   f'supervisor on {entry.host} is gone.')
        raise HostUnreachableError(
            f'cannot reach host {entry.host}, where program {entry.name} ({entry.id}) is '
            f'supervised (`{shlex.join(entry.ssh)}`): {errors or "no answer"}. The program '
            'runs on there without this machine; try again once the host is reachable.')

    def _first_line(self) -> str:
        deadline = time.monotonic() + _ANSWER_TIMEOUT
        line = b''
        stdout = self._process.stdout.fileno()
        while not line.endswith(b'\n') and time.monotonic() < deadline:
            if not select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            chunk = os.read(stdout, 64)
            if not chunk:
                break
            line += chunk
        if line.startswith(b'up '):  # the forward is set up before the command runs
            while not os.path.exists(self.path) and time.monotonic() < deadline:
                time.sleep(0.01)
        return line.decode(errors='replace').strip()

    def _close_and_read_errors(self) -> str:
        self.close()
        return ' '.join(self._process.stderr.read().decode(errors='replace').split())

    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        """Ends the session (the remote shell sees its input end) and removes the socket."""
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _refresh(entry: registry.Entry, there: dict) -> None:
    """Copies the host's entry of a remote program (a new supervisor's pid and token) to
    `entry` and to this machine's registry, if they differ."""
    fresh = registry.Entry(**{**there, 'ssh': entry.ssh})
    if fresh != entry:
        for field in dataclasses.fields(registry.Entry):
            setattr(entry, field.name, getattr(fresh, field.name))
        registry.register(entry)


def address_of(entry: registry.Entry, fresh: bool = False) -> str:
    """The courier address at which this process reaches `entry`'s observer: its own for a
    local program, else a tunnel's (`fresh`: a new tunnel, as after a lost connection).

    Raises:
      ProgramGoneError, HostUnreachableError: for a remote program.
    """
    if not is_remote(entry):
        return entry.address
    with _lock:
        tunnel = _tunnels.get(entry.id)
        if tunnel is not None and (fresh or not tunnel.alive()):
            tunnel.close()
            tunnel = None
        if tunnel is None:
            tunnel = _tunnels[entry.id] = Tunnel(entry)
        return f'unix:{tunnel.path}'


def client_of(entry: registry.Entry, call_timeout: float, fresh: bool = False) -> courier.Client:
    """A courier client of `entry`'s observer, carrying its token (see `address_of`)."""
    return courier.Client(address_of(entry, fresh), auth_token=entry.token,
                          call_timeout=call_timeout, wait_for_ready=False)


def running(entry: registry.Entry) -> bool:
    """Whether `entry`'s program still runs; a remote one that cannot be reached counts as
    running (it runs on without this machine)."""
    if not is_remote(entry):
        return any(e.id == entry.id for e in registry.entries())
    try:
        Tunnel(entry).close()
    except ProgramGoneError:
        return False
    except (HostUnreachableError, NoSupervisorError):
        return True
    return True


def forget(entry: registry.Entry) -> None:
    """Closes this process's tunnel to `entry` and, for a remote program that has ended,
    removes its entry here."""
    with _lock:
        tunnel = _tunnels.pop(entry.id, None)
    if tunnel is not None:
        tunnel.close()
    if is_remote(entry):
        registry.unregister(entry.id)


@atexit.register
def _close_all() -> None:
    with _lock:
        tunnels = list(_tunnels.values())
        _tunnels.clear()
    for tunnel in tunnels:
        tunnel.close()
