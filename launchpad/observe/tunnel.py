"""Reaching the observer of a program that is supervised on another host.

A detached SSH, Slurm or Kubernetes program's supervisor runs on another host than the
launching machine, whose registry entry of it (`registry.Entry`) says how to reach it;
`address` is the observer's Unix socket there. A process that calls it opens a `Tunnel`, which
first checks that the supervisor still runs and then serves a private local socket whose
connections reach that one:

- `Entry.ssh`, an SSH program: one ssh session forwards the local socket (`ssh -L`). ssh is
  how the launcher reached the host in the first place, so it works wherever the program does.
- `Entry.relay`, a Slurm or Kubernetes program: each connection runs the relay command, whose
  stdin and stdout a small process on the supervisor's host (`launchpad.observe.relay`) joins
  to the observer's socket. On Kubernetes that command is `kubectl exec -i` into the
  coordinator pod (`launchpad.launch.kubernetes.reach`). On Slurm it is a step of the
  program's own job on its batch host (`srun --jobid=JOB --overlap -w HOST`, see
  `launchpad.launch.slurm.reach`): a
  cluster's compute nodes often refuse ssh, or allow it only with a site's pam_slurm_adopt,
  while a step in the user's own running job is always allowed, and goes through Slurm's
  authentication (munge) rather than keys.

A tunnel ends with the process that opened it (its relay processes' input closes), so nothing
lingers; a laptop that lost the network and got it back simply opens a new one. Calls still
carry the entry's token.

A dead SSH supervisor is replaced by its keeper there, whose new supervisor registers anew
(another pid and token): the check waits for it while the keeper lives and sends the host's
entry, which `Tunnel` copies to this machine's (again before each client made through an open
tunnel, `address_of`); a Slurm relay's `up` line does the same.
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from typing import Dict, List, Union

import courier

from launchpad.observe import registry

_ANSWER_TIMEOUT = 30.0  # seconds beyond ssh's own connect timeout for the host to answer
_RELAY_TRIES = 3  # runs of a relay command that ends without a word (`RelayTunnel`)
_NEW_SUPERVISOR_WAIT = 100  # tenths of a second the check waits for a keeper's new supervisor
# On a supervisor's host, the script that starts a new keeper of program {id} (written by
# `launchpad.launch.detached.write_recover_script` in the program's run directory there).
RECOVER_SCRIPTS = '"${{TMPDIR:-/tmp}}"/launchpad-detached-{id}-*/recover'


class NoSupervisorError(registry.RegistryError):
    """The remote program's supervisor and keeper are gone, but its nodes may run on for the
    supervisor grace: `attach --recover` starts a new supervisor."""


# program id -> this process's tunnel to it
_tunnels: Dict[str, Union['Tunnel', 'RelayTunnel']] = {}
_lock = threading.Lock()


class ProgramGoneError(registry.RegistryError):
    """The remote program's supervisor is gone: the program has ended (its entry here is
    removed)."""


class HostUnreachableError(registry.RegistryError):
    """The host of a remote program's supervisor cannot be reached from here now."""


def local_path(program_id: str) -> str:
    """A new private socket path of this process's tunnel to program `program_id`.

    Raises:
      registry.RegistryError: the registry's directory is too long a path for a socket.
    """
    return str(registry.unix_socket_path(
        f'{program_id}.{os.getpid()}.{secrets.token_hex(3)}.fwd'))


def _gone(entry: registry.Entry) -> ProgramGoneError:
    """Removes `entry` here, and says the program has ended."""
    registry.unregister(entry.id)
    return ProgramGoneError(f'program {entry.name} ({entry.id}) has ended: its supervisor on '
                            f'{entry.host} is gone.')


def _unreachable(entry: registry.Entry, how: List[str], errors: str) -> HostUnreachableError:
    return HostUnreachableError(
        f'cannot reach host {entry.host}, where program {entry.name} ({entry.id}) is '
        f'supervised (`{shlex.join(how)}`): {errors or "no answer"}. The program runs on there '
        'without this machine; try again once the host is reachable.')


def _read_line(fd: int, deadline: float) -> str:
    """One line from `fd`, read a byte at a time (what follows it is not ours), by `deadline`."""
    line = b''
    while not line.endswith(b'\n') and time.monotonic() < deadline:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return line.decode(errors='replace').strip()


class Tunnel:
    """One ssh session forwarding a private local socket to a remote observer's socket."""

    def __init__(self, entry: registry.Entry):
        self.path = local_path(entry.id)
        self.entry = entry
        remote = entry.address.split(':', 1)[1]
        *ssh, host = entry.ssh
        # The remote shell says whether the supervisor still runs (waiting while its keeper
        # starts a new one), with the host's entry of it, and says it again for each line of
        # its input (`renew`), until this process closes its input (or ends).
        pid = r's/^ *"%s": \([0-9]*\).*/\1/p'
        check = ('check() { '
                 'alive() { kill -0 "$1" 2>/dev/null && '  # (a zombie is not)
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
                 'echo "$a"; }; check; while read -r _; do check; done')
        self._process = subprocess.Popen(
            [*ssh, '-o', 'ExitOnForwardFailure=yes', '-o', 'ControlPath=none',
             '-L', f'{self.path}:{remote}', host, check],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)  # Ctrl-C here ends it through its input, not a signal
        self._take(self._first_line())

    def renew(self) -> None:
        """Asks the host again which supervisor the socket reaches: a new one may have replaced
        the one this tunnel found (its socket has the same path), and a client made next must
        carry its token. A round trip over the open session; raises as opening does."""
        try:
            self._process.stdin.write(b'\n')
            self._process.stdin.flush()
        except (OSError, ValueError):
            pass  # (its session ended: no answer comes)
        self._take(_read_line(self._process.stdout.fileno(),
                              time.monotonic() + _ANSWER_TIMEOUT))

    def _take(self, answer: str) -> None:
        """Takes the host's `answer` of whether the supervisor runs: its entry there (a new
        supervisor's pid and token), or the error it means (the tunnel is then closed)."""
        entry = self.entry
        if answer.startswith('up '):
            there = json.loads(answer[3:])
            _refresh(entry, {key: value for key, value in there.items()  # (this machine's own)
                             if key not in ('ssh', 'hosts')})
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
            raise _gone(entry)
        raise _unreachable(entry, entry.ssh, errors)

    def _first_line(self) -> str:
        deadline = time.monotonic() + _ANSWER_TIMEOUT
        line = _read_line(self._process.stdout.fileno(), deadline)
        if line.startswith('up '):  # the forward is set up before the command runs
            while not os.path.exists(self.path) and time.monotonic() < deadline:
                time.sleep(0.01)
        return line

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


class RelayTunnel:
    """A private local socket each of whose connections runs the entry's relay command, joined
    to the connection: the command's far end (`launchpad.observe.relay`) says `up` and then
    carries the bytes to the remote observer's socket, or says `gone`."""

    def __init__(self, entry: registry.Entry):
        self.path = local_path(entry.id)
        self.entry = entry  # as its supervisor now is
        self._lock = threading.Lock()
        self._processes: List[subprocess.Popen] = []
        self._closed = False
        self._gone = False
        # The check's relay serves the first connection (most users open one).
        self._spare = self._relay()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)  # in the private registry directory
            self._listener.listen(8)
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._accept, daemon=True,
                         name=f'lp-relay-{entry.id}').start()

    def _relay(self) -> subprocess.Popen:
        """A relay process that said `up`; raises if the supervisor is gone or unreachable.
        A relay command that ended without a word (its way in failed: an `srun` whose task
        could not be launched, say) is run again, up to _RELAY_TRIES times: nothing of the
        connection went through it."""
        for tries in range(1, _RELAY_TRIES + 1):
            process = subprocess.Popen(
                self.entry.relay, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, bufsize=0,
                start_new_session=True)  # Ctrl-C here ends it through its input, not a signal
            with self._lock:
                self._processes.append(process)
            deadline = time.monotonic() + _ANSWER_TIMEOUT
            answer = _read_line(process.stdout.fileno(), deadline)
            if answer.split(' ', 1)[0] == 'up':
                self._adopt(answer[2:])
                return process
            ended = time.monotonic() < deadline  # (its output ended: not a timeout)
            errors = ' '.join(self._end(process).split())
            if answer == 'gone':
                self._gone = True
                raise _gone(self.entry)
            if answer or not ended or tries == _RELAY_TRIES or self._closed:
                break
            time.sleep(0.5)
        raise _unreachable(self.entry, self.entry.relay, errors)

    def renew(self) -> None:
        """Runs the relay of the next connection now, ending a spare one: a relay finds the
        supervisor as it is when it starts (`entry`: its pid and token), which may be a new
        one since this tunnel's last relay, and a client made next must carry the token of the
        supervisor its connection reaches, not that of the one before."""
        process = self._relay()
        with self._lock:
            spare, self._spare = self._spare, process
        if spare is not None:
            self._end(spare)

    def _adopt(self, supervisor: str) -> None:
        """Takes the supervisor's pid and token from its `up` line (`launchpad.observe.relay`):
        a new supervisor replaced a dead one if they changed."""
        try:
            fields = {key: value for key, value in json.loads(supervisor).items()
                      if value is not None}
        except ValueError:
            return
        _refresh(self.entry, fields)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                process, self._spare = self._spare, None
            try:
                process = process or self._relay()
            except registry.RegistryError:
                connection.close()
                continue
            threading.Thread(target=self._downstream, args=(connection, process),
                             daemon=True).start()
            threading.Thread(target=self._upstream, args=(connection, process),
                             daemon=True).start()

    @staticmethod
    def _upstream(connection: socket.socket, process: subprocess.Popen) -> None:
        """Copies the connection to the relay's input, whose end ends its half remotely."""
        try:
            while True:
                data = connection.recv(65536)
                if not data:
                    break
                process.stdin.write(data)
        except (OSError, ValueError):  # (ValueError: closed meanwhile)
            pass
        finally:
            try:
                process.stdin.close()
            except OSError:
                pass

    def _downstream(self, connection: socket.socket, process: subprocess.Popen) -> None:
        """Copies the relay's output to the connection; its end ends the connection."""
        try:
            while True:
                data = os.read(process.stdout.fileno(), 65536)
                if not data:
                    break
                connection.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            try:  # (wakes the upstream thread's recv; a close alone would not end it)
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()
            self._end(process)

    def _end(self, process: subprocess.Popen) -> str:
        """Ends a relay process (its input closes; if it lingers, a signal) and returns what it
        wrote to stderr."""
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGTERM)  # (srun passes it on to the step)
            try:
                process.wait(5.0)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        with self._lock:
            if process in self._processes:
                self._processes.remove(process)
        try:
            return process.stderr.read().decode(errors='replace')
        except (OSError, ValueError):
            return ''

    def alive(self) -> bool:
        return not (self._closed or self._gone)

    def close(self) -> None:
        """Stops listening, ends every relay process and removes the socket."""
        self._closed = True
        listener = getattr(self, '_listener', None)
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            processes = list(self._processes)
        for process in processes:
            self._end(process)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    """Signals the relay command's process group (its session: a shell's children too)."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def _open(entry: registry.Entry) -> Union[Tunnel, RelayTunnel]:
    return RelayTunnel(entry) if entry.relay is not None else Tunnel(entry)


def _refresh(entry: registry.Entry, fields: dict) -> None:
    """Copies what the supervisor's host says of a remote program (a new supervisor's pid and
    token) to `entry` and to this machine's registry, if anything differs."""
    changed = {key: value for key, value in fields.items() if getattr(entry, key) != value}
    if changed:
        for key, value in changed.items():
            setattr(entry, key, value)
        registry.register(entry)


def address_of(entry: registry.Entry, fresh: bool = False) -> str:
    """The courier address at which this process reaches `entry`'s observer: its own for a
    local program, else a tunnel's (`fresh`: a new tunnel, as after a lost connection). A tunnel
    already open finds out now which supervisor the next connection reaches (`renew`: a relay
    tunnel runs that connection's relay, an ssh tunnel asks the host), so that `current` names
    it (a new one's token, if one replaced the supervisor the tunnel found before).

    Raises:
      ProgramGoneError, HostUnreachableError: for a remote program.
    """
    if not registry.is_remote(entry):
        return entry.address
    with _lock:
        tunnel = _tunnels.get(entry.id)
        if tunnel is not None and (fresh or not tunnel.alive()):
            tunnel.close()
            tunnel = None
        if tunnel is None:
            tunnel = _tunnels[entry.id] = _open(entry)
        else:
            tunnel.renew()
        return f'unix:{tunnel.path}'


def client_of(entry: registry.Entry, call_timeout: float, fresh: bool = False) -> courier.Client:
    """A courier client of `entry`'s observer, carrying its token (see `address_of`; a new
    supervisor's, if its tunnel found one, see `current`)."""
    address = address_of(entry, fresh)
    return courier.Client(address, auth_token=current(entry).token, call_timeout=call_timeout,
                          wait_for_ready=False)


def current(entry: registry.Entry) -> registry.Entry:
    """`entry` as this process's tunnel to it found its supervisor (the pid and token of a new
    one that replaced a dead one); `entry` itself if none is open."""
    with _lock:
        tunnel = _tunnels.get(entry.id)
    return entry if tunnel is None else tunnel.entry


def running(entry: registry.Entry) -> bool:
    """Whether `entry`'s program still runs; a remote one that cannot be reached counts as
    running (it runs on without this machine)."""
    if not registry.is_remote(entry):
        return any(e.id == entry.id for e in registry.entries())
    try:
        _open(entry).close()
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
    if registry.is_remote(entry):
        registry.unregister(entry.id)


@atexit.register
def _close_all() -> None:
    with _lock:
        tunnels = list(_tunnels.values())
        _tunnels.clear()
    for tunnel in tunnels:
        tunnel.close()
