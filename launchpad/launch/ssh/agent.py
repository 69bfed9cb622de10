"""The host agent: runs on each ssh host, as `python -m launchpad.launch.ssh.agent WORKDIR`.

The launcher starts one agent per ssh connection, as the connection's primary session. The agent
says hello (the preflight facts), keeps a private directory for the node specs, forks the nodes
from itself and sends their output and exit codes back; when the launcher is done or gone it
ends what is left of the program on its host and removes the directory. It imports nothing of
the launcher side: what the two share is in `protocol`.

One single-threaded process per connection, and one forked child per node:

    launcher ==ssh==> agent stdin:  commands (specs, kill, start again) and heartbeats
    launcher <==ssh== agent stdout: events (hello, ready, exited...) and node output
                        |
                        +-- fork --> node (a session of its own, marked with NODE_ENV)
                        <-- pipe --- its stdout and stderr

The agent's loop `select`s on its stdin and the nodes' pipes: it forwards output as it comes,
reports a node's exit code once its last output is forwarded, and handles a command whenever a
complete one has arrived.

A detached program's agent (`--detached`) must outlive its supervisor, so it does not live in
the ssh session: it forks away in a session of its own, listening on a socket in its private
directory, and the process ssh started relays between the session and that socket
(`launchpad.observe.relay`):

    supervisor ==ssh==> relay <==socket==> agent (protocol.SOCKET_NAME) --fork--> nodes
    new supervisor ==ssh==> relay.py --plain SOCKET <==socket==^

When the supervisor's session ends the agent keeps the nodes running, and what they print and
how they end, until a new supervisor connects (it says hello again with the state of every
node, and sends what it kept on `resume`) or the supervisor grace has passed.

A supervisor's connection is taken only for a claim newer than the last the agent took (see
`protocol`, fencing); the agent then drops the connection it had. It also keeps what a
supervisor on this host would take over from (`launchpad.launch.ssh.move`): where the nodes
reach the coordinator, copies of the launch file and state, and the script that starts it.
"""
from __future__ import annotations

import os
import select
import shlex
import shutil
import signal
import socket
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from launchpad.launch.ssh import protocol
from launchpad.observe import relay
from launchpad.process import forkserver
from launchpad.process import spec as specs
from launchpad.process import tempdirs
from launchpad.process import tree
from launchpad.process.devices import Inventory


def main() -> None:
    """Runs the agent of one connection until the launcher is done or gone.

    Says hello (the preflight facts), creates the private directory, writes the node specs it
    is sent, forks the nodes and sends their output and exit codes back, and kills nodes on
    request. When its input ends or falls silent (the launcher is done or dead, or the network
    is gone) it gives the nodes still running a grace period to notice and stop, kills the rest
    and removes the directory.

    With `--detached` (a detached program's supervisor started it) the agent leaves the ssh
    session, which then only relays to it (`launchpad.observe.relay`), and listens on SOCKET_NAME in its
    directory: when its supervisor is gone it keeps the nodes running, for the supervisor
    grace the `files` command gave, until a new supervisor connects there.
    """
    import cloudpickle  # pylint: disable=import-outside-toplevel,unused-import
    import psutil  # pylint: disable=import-outside-toplevel,unused-import

    def end(signum, frame):
        del frame
        sys.exit(128 + signum)

    args = sys.argv[1:]
    detached = args[:1] == ['--detached']
    workdir = args[detached] if len(args) > detached else ''
    directory = tempdirs.make(protocol.DIR_KIND, inside_run=False)
    listener = _listen(directory) if detached else None
    if listener is not None and os.fork():
        listener.close()  # this process is the session's relay from now on
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(os.path.join(directory, protocol.SOCKET_NAME))
        relay.join(connection)
        return
    if listener is not None:  # the agent, in a session of its own, apart from ssh's
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end)
    agent = _HostAgent(directory, workdir or os.getcwd(), listener)
    try:
        agent.facts = dict(
            hostname=socket.gethostname(), python=sys.version_info[:2],
            spec_fields=protocol.spec_fields(), launchpad=_launchpad_directory(),
            directory=agent.directory, workdir_ok=not workdir or os.path.isdir(workdir),
            ssh_connection=os.environ.get('SSH_CONNECTION', ''),
            devices=Inventory.discover(socket.gethostname()).to_json())
        agent.serve()
    finally:
        agent.close()


def _listen(directory: str) -> socket.socket:
    """The socket a detached program's supervisors reach the agent at: this user's only."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(directory, protocol.SOCKET_NAME)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(4)
    return listener


def _launchpad_directory() -> str:
    """Where this host's launchpad package is (the hello names it when the versions differ)."""
    return os.path.dirname(os.path.dirname(specs.__file__))


class _HostAgent:
    """The agent's state: the nodes it forked, and the stream of messages to the launcher.

    The agent forks the nodes itself, as launchpad's fork server does, having imported what
    nodes need once: a node costs milliseconds instead of an ssh session (with the login
    shell's start-up files) and a fresh interpreter. Each node writes to a pipe that the agent
    forwards to the launcher.
    """

    def __init__(self, directory: str, workdir: str,
                 listener: Optional[socket.socket] = None):
        self.directory = directory
        self.workdir = workdir
        self.facts: Dict[str, Any] = {}  # what the hello says
        self._listener = listener  # a detached program's (see `main`)
        self._connection: Optional[socket.socket] = None
        if listener is None:
            # Our stdout carries the protocol; anything else printed here goes to stderr instead.
            self._in, self._out = sys.stdin.fileno(), os.dup(1)
            os.dup2(2, 1)
        else:
            self._in = self._out = -1  # until a supervisor connects
        self._pending = bytearray()  # events while no supervisor is connected, for the next
        self._holding = False  # a new supervisor is connected but not ready for them yet
        self._nodes: Dict[int, _Child] = {}  # by index
        self._grace = 0.0
        self._supervisor_grace = 0.0  # set by a detached program's `files` command
        self._run_dir = ''  # and its supervisor's files, which go when no supervisor came
        self._preloaded = False
        # A detached program's: the claim it took last (epoch, owner), and new connections
        # whose claim is not complete yet (fd -> (socket, what it sent)).
        self._claim = (0, '')
        self._candidates: Dict[int, Tuple[socket.socket, bytearray]] = {}

    def announce(self, data: bytes = b'', **message: Any) -> None:
        """Sends `message` to the launcher, followed by `data` if the message gives its size;
        keeps it for the next supervisor of a detached program while none is connected."""
        packed = protocol.pack_event(message, data)
        if self._out < 0 or self._holding:
            if len(self._pending) < protocol.PENDING_LIMIT or message['event'] != 'output':
                self._pending += packed
        elif not self._send(packed) and self._listener is not None:
            self._pending += packed  # (the next supervisor may get it twice, never half)

    def _send(self, data: bytes) -> bool:
        """Writes `data` to the launcher; False if it is gone (a detached program's agent then
        waits for the next)."""
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._out, view):]
            return True
        except OSError:  # the launcher is gone; nobody is listening
            if self._listener is not None:
                self._disconnect()
            return False

    def serve(self) -> None:
        """Handles the launcher's messages until its input ends or stays silent (a detached
        program's agent then waits up to the supervisor grace for a new supervisor)."""
        buffer = bytearray()
        heard = time.monotonic()
        if self._listener is None:
            self.announce(event='hello', **self.facts)
        while True:
            if not self._preloaded:  # while the launcher packs the program
                forkserver.preload()
                self._preloaded = True
            if self._in < 0:  # a detached program before or between supervisors
                alone = self._supervisor_grace if self._claim[0] else protocol.AGENT_START_TIMEOUT
                if time.monotonic() - heard > alone:
                    shutil.rmtree(self._run_dir, ignore_errors=True)  # (if on this host)
                    return
            waiting = [] if self._listener is None else [self._listener.fileno(),
                                                         *self._candidates]
            ready = self._pump(0.1 if self._nodes else 1.0, *waiting,
                               *([self._in] if self._in >= 0 else []))
            if self._listener is not None and self._listener.fileno() in ready:
                candidate = self._listener.accept()[0]
                self._candidates[candidate.fileno()] = (candidate, bytearray())
            claimed = None
            for fd in ready:
                rest = self._hear_claim(fd) if fd in self._candidates else None
                claimed = claimed if rest is None else rest
            if claimed is not None:  # a supervisor took over: what it sent after its claim
                buffer, heard = claimed, time.monotonic()
                if not self._handle_all(buffer):
                    return
                continue
            if self._in < 0:
                continue
            if self._in not in ready:
                if time.monotonic() - heard > protocol.LAUNCHER_SILENCE_TIMEOUT:
                    if not self._lost():
                        return
                continue
            try:
                chunk = os.read(self._in, 1 << 20)
            except OSError:
                chunk = b''
            if not chunk:
                if not self._lost():
                    return
                continue
            heard = time.monotonic()
            buffer += chunk
            if not self._handle_all(buffer):
                return

    def _handle_all(self, buffer: bytearray) -> bool:
        """Handles every complete command in `buffer`; False once the launcher is done."""
        for kind, body in protocol.unpack_commands(buffer):
            if kind == 'close':  # the supervisor is done with the program
                return False
            self._handle(kind, body)
        return True

    def _lost(self) -> bool:
        """The launcher is gone: True if a new supervisor may come (a detached program's)."""
        if self._listener is None or not self._supervisor_grace:
            return False
        self._disconnect()
        return True

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self._in = self._out = -1

    def _hear_claim(self, fd: int) -> Optional[bytearray]:
        """Reads from a supervisor's new connection until its claim is complete: takes the
        connection if the claim may take the nodes over (`protocol`, fencing), and returns what
        followed the claim; else answers `refused` and closes it."""
        candidate, heard = self._candidates[fd]
        try:
            chunk = candidate.recv(1 << 20)
        except OSError:
            chunk = b''
        if not chunk:
            del self._candidates[fd]
            candidate.close()
            return None
        heard += chunk
        for kind, body in protocol.unpack_commands(heard):
            del self._candidates[fd]
            epoch, owner = (body.get('epoch', 0), body.get('owner', '')) if (
                kind == 'claim' and isinstance(body, dict)) else (0, '')
            held_epoch, held_owner = self._claim
            if epoch > held_epoch or (epoch == held_epoch and owner == held_owner and epoch):
                self._take(candidate, epoch, owner)
                return heard
            try:
                candidate.sendall(protocol.pack_event(
                    {'event': 'refused', 'epoch': held_epoch, 'owner': held_owner}))
            except OSError:
                pass
            candidate.close()
            return None
        return None

    def _take(self, connection: socket.socket, epoch: int, owner: str) -> None:
        """Makes `connection`, whose claim it took, the supervisor's (dropping the one it
        replaces): says hello with the state of every node (their exit codes, None while
        running); what happened meanwhile, and until it is ready, follows on `resume`."""
        first = not self._claim[0]
        if self._connection is not None:  # the supervisor it replaces hears why
            self._send(protocol.pack_event({'event': 'refused', 'epoch': epoch, 'owner': owner}))
        self._disconnect()
        self._claim = (epoch, owner)
        protocol.write_atomically(os.path.join(self.directory, protocol.CLAIM_FILE),
                                  f'{epoch} {owner}'.encode())
        self._connection = connection
        self._in = self._out = connection.fileno()
        nodes = {index: node.poll() for index, node in self._nodes.items()}
        self._holding = False
        self.announce(event='hello', nodes=nodes, **self.facts)
        self._holding = not first

    def _handle(self, kind: str, body: Any) -> None:
        if kind == 'files':
            for name, data in body['files'].items():
                path = os.path.join(self.directory, name)
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 'wb') as f:
                    f.write(data)
            self._grace = body['grace']
            self._supervisor_grace = body.get('supervisor_grace', 0.0)
            self._run_dir = body.get('run_dir', '')
            tempdirs.claim(self._run_dir)  # (if on this host) it stays while the nodes here run
            for index in body['start']:
                self._start(index)
            self.announce(event='ready')
        elif kind == 'coordinator':  # where the nodes here reach it from now on
            protocol.write_atomically(os.path.join(self.directory, protocol.COORDINATOR_FILE),
                                      body['address'].encode())
            self._run_dir = body['run_dir']
            tempdirs.claim(self._run_dir)
        elif kind == 'copy':  # what a supervisor moved to this host would start from
            for name, data in body['files'].items():
                protocol.write_atomically(os.path.join(self.directory, name), data)
            self._write_move_script(body['program_id'])
        elif kind == 'resume':  # a new supervisor is ready for what it missed
            self._holding = False
            if self._send(bytes(self._pending)):
                self._pending.clear()
        elif kind == 'kill':
            self._kill(body)
            self.announce(event='killed')
        elif kind == 'start':  # nodes to start again (restarted): what is left of them goes first
            _kill_nodes({protocol.node_marker(self.directory, i) for i in body}, self.directory)
            for index in body:
                self._start(index)

    def _write_move_script(self, program_id: str) -> None:
        """Writes protocol.MOVE_SCRIPT: the shell script that starts a supervisor of this
        program on this host from the copies here, with this agent's interpreter and
        environment; its first line names this host, where it applies."""
        path = os.path.join(self.directory, protocol.MOVE_SCRIPT.format(id=program_id))
        if os.path.exists(path):
            return
        env = [f'{k}={v}' for k, v in os.environ.items() if not k.startswith('SSH_')]
        command = shlex.join(['exec', 'env', '-i', *env, sys.executable,
                              *protocol.MOVE_ARGV, self.directory])
        protocol.write_atomically(path, f'#{socket.gethostname()}\n{command}\n'.encode())

    def _start(self, index: int) -> None:
        argv, env = protocol.node_command(self.directory, index)
        env = {**env, specs.CHECKPOINT_ROOT_ENV: os.path.join(self.directory, 'checkpoints')}
        request = {'argv': argv[1:], 'cwd': self.workdir, 'env': env}
        read_fd, write_fd = os.pipe()
        ours = {fd for fd in (self._out, self._in) if fd >= 0} | {read_fd} | {
            node.pipe for node in self._nodes.values() if node.pipe is not None}
        if self._listener is not None:
            ours.add(self._listener.fileno())
        try:
            pid = forkserver.fork_worker(request, write_fd, sorted(ours))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._nodes[index] = _Child(pid, read_fd)

    def _pump(self, timeout: float, *fds: int) -> list:
        """Forwards the nodes' output and exit codes for up to `timeout` s, or until one of
        `fds` can be read; returns those that can."""
        pipes = {node.pipe: index for index, node in self._nodes.items() if node.pipe is not None}
        ready = select.select([*fds, *pipes], [], [], timeout)[0]
        for fd in ready:
            if fd in pipes:
                self._forward(pipes[fd])
        for index, node in self._nodes.items():
            if not node.reported and node.poll() is not None:
                for _ in range(64):  # what it wrote before it ended
                    if node.pipe is None:
                        break
                    self._forward(index)
                node.close_pipe()
                node.reported = True
                self.announce(event='exited', node=index, code=node.poll())
        return [fd for fd in ready if fd in fds]

    def _forward(self, index: int) -> None:
        node = self._nodes[index]
        try:
            data = os.read(node.pipe, 1 << 16)
        except BlockingIOError:
            if node.poll() is None:
                return
            data = b''  # it ended, and whatever holds the pipe open now is not the node
        if data:
            self.announce(data, event='output', node=index, size=len(data))
        else:
            node.close_pipe()

    def _running(self) -> bool:
        return (any(node.poll() is None for node in self._nodes.values())
                or bool(_node_processes(self.directory)))

    def _kill(self, indices: Optional[Sequence[int]]) -> None:
        for index, node in self._nodes.items():
            if indices is None or index in indices:
                node.kill()
        markers = None if indices is None else {
            protocol.node_marker(self.directory, i) for i in indices}
        _kill_nodes(markers, self.directory)

    def close(self) -> None:
        """Ends what is left of the program on this host: nodes still running (the launcher is
        gone) get SIGHUP, which ends them as a preemption without reporting (their stop
        handlers run); what has not ended after the grace period is killed."""
        for node in self._nodes.values():
            node.hang_up()
        deadline = time.monotonic() + self._grace
        while self._running() and time.monotonic() < deadline:
            self._pump(0.2)
        self._kill(None)
        for node in self._nodes.values():
            node.wait()
            node.close_pipe()
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._listener is not None:
            self._listener.close()
        self.announce(event='closed')


class _Child:
    """A node the agent forked, in a session of its own (`poll` and `kill` like Popen), and
    the pipe its output comes out of."""

    def __init__(self, pid: int, pipe: int):
        self.pid = pid
        self.pipe: Optional[int] = pipe
        self.reported = False  # whether the launcher was told its exit code
        self._code: Optional[int] = None

    def close_pipe(self) -> None:
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None

    def poll(self, flags: int = os.WNOHANG) -> Optional[int]:
        if self._code is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self._code = os.waitstatus_to_exitcode(status)
        return self._code

    def wait(self) -> int:
        return self.poll(0)

    def hang_up(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGHUP)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        if self.poll() is None:  # not reaped, so the pid is still its own
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _node_processes(directory: str, markers: Optional[set] = None) -> list:
    """This host's processes of the nodes `markers` (default: every node of `directory`)."""
    import psutil  # pylint: disable=import-outside-toplevel
    found = []
    for process in psutil.process_iter():
        try:
            marker = process.environ().get(protocol.NODE_ENV)
        except (psutil.Error, OSError):
            continue
        if marker and (marker in markers if markers is not None
                       else marker.startswith(directory + '/')):
            found.append(process)
    return found


def _kill_nodes(markers: Optional[set], directory: str = '') -> None:
    """Kills the processes of the given nodes, children included, until none is left."""
    tree.end_until_gone(lambda: _node_processes(directory, markers), rounds=10)


if __name__ == '__main__':
    main()
