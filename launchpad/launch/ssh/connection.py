"""One multiplexed ssh connection from the launcher to a host, which runs the host agent there.

Runs on the launching machine. The agent at the other end is `agent`; what the two say to each
other is in `protocol`.

Each connection is a local `ssh -M` master (under `sh`, in a session of its own) and two threads;
a detached program's is a session over its host's master connection instead, which outlives the
supervisor (`masters`), or, for a new supervisor reaching an agent again over a running master,
a local relay (`launchpad.observe.relay`) to the master's forward of the agent's socket:

    send() from any thread (launch, kill, the runner's heartbeat) --lock--> ssh stdin
    ssh stdout --> thread lp-ssh-HOST: node output and exit codes straight to the node's
                   ForkedNode; every other event to a queue that `expect` reads
    ssh stderr --> thread lp-ssh-HOST-err: kept in `stderr_lines` for the preflight's
                   diagnosis, and logged once the agent said hello

When the agent's output ends (the agent is done, or the connection died), every forked node
still running counts as ended with 255, as ssh reports a session that ended with its connection;
unless the connection goes to a detached program's agent, which keeps its nodes for a supervisor
that reaches it again: then `on_lost` is called instead (the runner tries to reach it again).
"""
from __future__ import annotations

import logging
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from launchpad.launch.ssh import masters
from launchpad.launch.ssh import protocol
from launchpad.launch.ssh.hosts import SshHost
from launchpad.observe import relay


class Connection:
    """One multiplexed ssh connection to a host; its primary session runs the host agent.

    Attributes:
      host: the host it reaches.
      control_path: its control socket, which the ssh sessions of nodes in tmux windows share.
      master: a detached program's: the control socket of its host's master connection
        (`masters`), which it goes over instead.
      nodes: the indices of the executables it runs.
      hello: the agent's hello (the preflight facts), once the preflight has it.
      forked: the nodes the agent forks, by index.
      process: the local ssh process (in a session of its own).
      stderr_lines: what ssh and the agent wrote to stderr, line by line (the preflight
        diagnoses a host from it).
      on_lost: for a running detached program's connection, called with it when it ended
        without being closed (the network or the host went away); its nodes then run on.
      refused: the agent's `refused` event, if it refused this connection's claim (a newer
        supervisor holds it, see `protocol`).
      session_at: when a reattached session's shell answered (time.monotonic()): ssh's part of
        reaching an agent again (a new supervisor logs it).
    """

    def __init__(self, host: SshHost, control_path: str, detached: bool = False,
                 reattach: Optional[dict] = None, claim: Optional[dict] = None,
                 master: Optional[str] = None, forward: bool = False):
        """`detached`: its agent outlives the connection (a detached program's supervisor
        opens it); `reattach`: the hello of such an agent, which this connection reaches again
        (a new supervisor's), instead of starting one; `claim`: the supervisor's claim on such
        an agent (`protocol`), sent first; `master`: the control socket of the master
        connection to go over, started by this one if none runs; `forward`: reaching again
        over a running master, through a forward to the agent's socket (`masters.forward`, a
        local relay joining it) rather than a session (which runs the user's shell there, and
        tells how the host sees this one: its first hello says so for the same host)."""
        self.host = host
        self.control_path = control_path
        self.master = master
        self._over_running_master = master is not None and os.path.exists(master)
        self._forwarded = (forward and reattach is not None and self._over_running_master
                           and masters.forward(master, f'{reattach["directory"]}/'
                                                       f'{protocol.SOCKET_NAME}'))
        self._session_or_end = threading.Event()
        self.nodes: List[int] = []
        self.hello: Optional[dict] = None
        self._events: 'queue.Queue[Optional[dict]]' = queue.Queue()
        self.stderr_lines: List[str] = []
        self.forked: Dict[int, ForkedNode] = {}
        self.on_lost: Optional[Callable[['Connection'], None]] = None
        self.refused: Optional[dict] = None
        self._closing = False
        self._send_lock = threading.Lock()
        self._seen_as: Optional[str] = None  # SSH_CONNECTION of a reattached session
        self.session_at: Optional[float] = None
        if reattach is not None:  # (its agent's hello tells how the first session saw it)
            command = (f'printf \'{protocol.AGENT_LINE.decode()}{{"event": "session", '
                       '"ssh_connection": "%s"}\\n\' "$SSH_CONNECTION"; '
                       + host.command(protocol.relay_argv(host.python, reattach)))
        else:
            command = (f'{host.command(protocol.agent_argv(host.python, detached))} '
                       f'{shlex.quote(host.workdir or "")}')
        control = (['-M', '-S', control_path, '-o', 'ControlPersist=no'] if master is None
                   else masters.argv(master))
        argv = host.ssh_argv() + control + [
            '-o', f'ServerAliveInterval={protocol.SERVER_ALIVE_INTERVAL}', '-o',
            'ServerAliveCountMax='
            f'{int(protocol.LAUNCHER_SILENCE_TIMEOUT // protocol.SERVER_ALIVE_INTERVAL)}',
            host.host, command]
        if self._forwarded:
            argv = [sys.executable, relay.__file__, relay.PLAIN, self._forwarded]
        # The master ends when the agent does, also after the launcher died; the last one to end
        # removes the launch's local directory, which holds nothing but the control sockets (none
        # for sessions over a master connection: `rm` finds nothing, `rmdir` works). A
        # supervisor whose connections all ended (its host cut off for longer than the keepalive
        # allows) makes the directory again to reach its agents (ssh cannot bind the socket
        # without it, and a fenced supervisor would never hear that it is).
        os.makedirs(os.path.dirname(control_path), mode=0o700, exist_ok=True)
        self.process = subprocess.Popen(
            ['sh', '-c', '"$@"; code=$?; rm -f "$0"; rmdir "${0%/*}" 2>/dev/null; exit $code',
             control_path] + argv,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self._readers = [
            threading.Thread(target=self._read_events, daemon=True, name=f'lp-ssh-{host}'),
            threading.Thread(target=self._read_errors, daemon=True, name=f'lp-ssh-{host}-err')]
        for reader in self._readers:
            reader.start()
        if claim is not None:
            self.send('claim', claim)

    def _read_events(self) -> None:
        stream = self.process.stdout
        for line in iter(stream.readline, b''):
            if self._forwarded and self.session_at is None:  # (the agent's first words)
                self.session_at = time.monotonic()
                self._session_or_end.set()
            message = protocol.unpack_event(line)
            if message is None:
                logging.info('ssh host %s: %s', self.host, line.decode(errors='replace').rstrip())
                continue
            if message['event'] == 'output':
                data = stream.read(message['size'])
                if message['node'] in self.forked:
                    self.forked[message['node']].write(data)
            elif message['event'] == 'exited':
                if message['node'] in self.forked:
                    self.forked[message['node']].end(message['code'])
            elif message['event'] == 'refused':
                self.refused = message
            elif message['event'] == 'session':
                self._seen_as = message['ssh_connection']
                self.session_at = time.monotonic()
                self._session_or_end.set()
            else:
                self._events.put(message)
        self._session_or_end.set()
        if self.on_lost is not None and not self._closing:
            self._events.put(None)
            self.on_lost(self)
            return
        for node in self.forked.values():
            node.end(255)  # as ssh reports a session that ended with its connection
        self._events.put(None)

    def _read_errors(self) -> None:
        for line in iter(self.process.stderr.readline, b''):
            text = line.decode(errors='replace').rstrip()
            self.stderr_lines.append(text)
            if self.hello is not None and text:
                logging.warning('ssh host %s: %s', self.host, text)

    def expect(self, event: str, timeout: float) -> Optional[dict]:
        """The next message of the agent if it is `event`; None if the connection ended first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if message is None:
                self._events.put(None)  # the connection stays ended for later calls
                return None
            if message.get('event') == event:
                return message

    def hello_again(self, timeout: float) -> Optional[dict]:
        """The hello of the agent that this connection reaches again (`reattach`), or None if
        the connection ended first. A running master through which no session opens, nor the
        agent answers a forward, within `masters.SESSION_TIMEOUT` (its host is cut off) is
        ended, and so is this connection: the next one to the host connects anew."""
        if self._over_running_master and not self._session_or_end.wait(masters.SESSION_TIMEOUT):
            logging.warning('The ssh master connection to %s reached no agent within %g s; '
                            'ending it (the host is reached through a new one).', self.host,
                            masters.SESSION_TIMEOUT)
            masters.end(self.master)
            self.abandon()
        return self.expect('hello', timeout)

    @property
    def over_running_master(self) -> bool:
        """Whether its session opened over a master connection that ran already."""
        return self._over_running_master and self.session_at is not None

    def send(self, kind: str, body: Any) -> bool:
        """Sends a message to the agent; False if the connection is gone."""
        data = protocol.pack_command(kind, body)
        with self._send_lock:
            try:
                self.process.stdin.write(data)
                self.process.stdin.flush()
                return True
            except (OSError, ValueError):
                return False

    @property
    def directory(self) -> str:
        """The agent's private directory on the host."""
        return self.hello['directory']

    def node_argv(self, index: int) -> List[str]:
        """The ssh command that runs node `index` in a session of its own on this connection."""
        argv, env = protocol.node_command(self.directory, index, self.host.python, self.host.env)
        command = shlex.join(['env'] + [f'{k}={v}' for k, v in env.items()] + argv)
        if self.host.workdir:
            command = f'cd {shlex.quote(self.host.workdir)} && exec {command}'
        else:
            command = f'exec {command}'
        return self.host.ssh_argv() + ['-S', self.master or self.control_path,
                                       '-o', 'ControlMaster=no',
                                       self.host.host, command]

    def kill(self, indices: Sequence[int]) -> None:
        """Has the agent kill nodes `indices` on the host, and waits for it to confirm."""
        if self.send('kill', list(indices)) and self.expect('killed', 10.0) is None:
            logging.warning('Could not confirm that nodes %s on %s were killed.', list(indices),
                            self.host)

    def close(self, timeout: float = 10.0) -> None:
        """Ends the agent's session: it ends the rest of the program there and removes its files."""
        self._closing = True
        self.send('close', None)
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.abandon()  # (what has not ended by now)
        if self.hello is not None and self.expect('closed', 0) is None:
            logging.warning('Could not confirm that %s on %s was removed (the connection ended '
                            'early); remove it by hand if it is still there.', self.directory,
                            self.host)

    def abandon(self) -> None:
        """Ends this connection without a word to the agent, which keeps the program (a
        detached program's, reached again later through another)."""
        self._closing = True
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        for reader in self._readers:
            reader.join(2.0)

    def wait_ended(self, timeout: float) -> None:
        """Waits up to `timeout` s for the connection to end, then briefly for the rest of
        what it wrote (its last errors explain why it ended)."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        for reader in self._readers:
            reader.join(1.0)

    def agent_gone(self) -> bool:
        """True if this ended connection reached a detached program's host and found no agent
        there (the relay says so and exits 1; ssh exits 255 when the host cannot be reached,
        and a connection this process killed says nothing)."""
        self.wait_ended(5.0)
        code = self.process.returncode  # (a forward tells nothing: it reached the master only)
        return code is not None and code >= 0 and code != 255 and not self._forwarded

    @property
    def launcher_address(self) -> str:
        """The launcher's address as the host sees it."""
        return (self._seen_as or self.hello['ssh_connection']).split()[0]

    @property
    def bind_host(self) -> str:
        """Where servers on this host listen."""
        return self.host.address or (self._seen_as or self.hello['ssh_connection']).split()[2]


class ForkedNode:
    """A node the host agent forked (`poll` and `kill` like Popen): its output arrives through
    the agent's connection and goes to `fd`, which `Output` gave it; `on_end` is called when its
    exit code arrives, so that the launcher sees the exit without waiting for its next poll."""

    def __init__(self, fd: int, reader: Optional[threading.Thread],
                 on_end: Optional[Callable[[], None]] = None):
        self._fd: Optional[int] = fd
        self._reader = reader
        self._code: Optional[int] = None
        self._lock = threading.Lock()
        self._on_end = on_end

    def write(self, data: bytes) -> None:
        """Passes on output of the node that arrived through the connection."""
        with self._lock:
            view = memoryview(data)
            while view and self._fd is not None:
                view = view[os.write(self._fd, view):]

    def end(self, code: int) -> None:
        """Records its exit code (the first one counts) and closes its output."""
        with self._lock:
            first = self._code is None
            if first:
                self._code = code
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if first and self._on_end is not None:
            self._on_end()

    def poll(self) -> Optional[int]:
        if self._code is not None and self._reader is not None:
            self._reader.join(2.0)  # its output is printed before it counts as ended
        return self._code

    def kill(self) -> None:
        """Gives up on it here; the agent kills it on its host."""
        self.end(-signal.SIGKILL)


def coordinator_host(connections: List[Connection]) -> str:
    """Where to serve the coordinator: the address the hosts see the launcher at, or every
    address if they see it at different ones."""
    seen = {connection.launcher_address for connection in connections}
    return seen.pop() if len(seen) == 1 else (
        '::' if any(':' in address for address in seen) else '0.0.0.0')
