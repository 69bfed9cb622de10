"""`ssh`: run a program's nodes on hosts you can ssh into.

    lp.launch(program, launch_type='ssh', resources={
        'learner': lp.SshHost('gpu-box', python='/opt/venv/bin/python'),
        'actor': lp.SshHosts(['cpu-1', 'cpu-2'], python='/opt/venv/bin/python'),
    })

The launcher uses the system OpenSSH client (so `~/.ssh/config` applies) with one multiplexed
connection per host. The primary session of each connection runs a small host agent from the
host's own launchpad: it answers the preflight, keeps a private directory for the node specs, and
when the connection ends (the program ended, or the launcher died) it ends what is left of the
program on its host and removes the directory. The agent forks the nodes from itself (a node
costs milliseconds, not an ssh session and a fresh interpreter) and sends their output and exit
codes back over its session. Only nodes shown in tmux windows run in ssh sessions of their own.

The launcher serves the program's coordinator on the address the hosts see it at; servers on a
host bind that host's address on a port the kernel picks and publish the endpoint to the
coordinator. All of it requires the program's auth token, which travels inside the spec files
(mode 600 in the private directory), never on a command line.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import courier

from launchpad.address import AddressTable
from launchpad.launch import launcher
from launchpad.launch.controller import Controller
from launchpad.launch.ssh import protocol
from launchpad.process import spec as specs
from launchpad.process.coordinator import COORDINATOR_LOSS_TIMEOUT, Coordinator, serve_coordinator
from launchpad.process.output import TERMINALS, Output
from launchpad.program import Program

# sshd refuses more sessions per connection than MaxSessions (10 by default). Nodes in tmux windows
# run in sessions of their own: a connection then carries the agent's session and at most this
# many nodes, and a host with more nodes gets more connections. Forked nodes need no session.
NODES_PER_CONNECTION = 8


@dataclasses.dataclass(frozen=True)
class SshHost:
    """A host to run nodes on, reached with the system `ssh` client.

    Attributes:
      host: what ssh connects to: a name, an address or a `Host` alias of `~/.ssh/config`.
      user: login user (default: ssh's choice, from the config or the local user name).
      port: ssh port (default: ssh's choice).
      identity_file: private key to log in with (default: ssh's choice).
      python: the interpreter on the host, with launchpad and its dependencies installed.
      workdir: directory the nodes run in (default: the login directory).
      env: environment variables for the nodes, e.g. {'PYTHONPATH': '/src'}. They are part of
        the remote command line (visible in `ps` there): put no secrets in them.
      address: the address other hosts reach this host's servers at (default: the address ssh
        connected to, as seen by the host).
      ssh_options: more arguments for ssh, e.g. ['-o', 'ProxyJump=gateway'].
      connect_timeout: seconds ssh waits for the connection.
    """
    host: str
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    python: str = 'python3'
    workdir: Optional[str] = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    address: Optional[str] = None
    ssh_options: Sequence[str] = ()
    connect_timeout: float = 10.0

    def __post_init__(self):
        if not isinstance(self.host, str) or not self.host or self.host.startswith('-'):
            raise ValueError(f'SshHost needs a host name or address, got {self.host!r}.')
        if not isinstance(self.python, str) or not self.python:
            raise ValueError(f'SshHost({self.host!r}): python must name an interpreter on the '
                             f'host, got {self.python!r}.')
        if not self.connect_timeout > 0:
            raise ValueError(f'SshHost({self.host!r}): connect_timeout must be positive, got '
                             f'{self.connect_timeout!r}.')
        if self.port is not None and not (isinstance(self.port, int) and 0 < self.port < 65536):
            raise ValueError(f'SshHost({self.host!r}): port must be an int in 1..65535, '
                             f'got {self.port!r}.')
        for key, value in dict(self.env).items():
            if not (isinstance(key, str) and key.isidentifier() and isinstance(value, str)):
                raise ValueError(f'SshHost({self.host!r}): env must map variable names to str '
                                 f'values, got {key!r}: {value!r}.')
        if isinstance(self.ssh_options, str):
            raise TypeError(f'SshHost({self.host!r}): ssh_options is a list of arguments, '
                            f'e.g. {shlex.split(self.ssh_options)!r}.')
        object.__setattr__(self, 'env', dict(self.env))
        object.__setattr__(self, 'ssh_options', tuple(self.ssh_options))

    def __str__(self) -> str:
        return f'{self.user}@{self.host}' if self.user else self.host

    def ssh_argv(self) -> List[str]:
        """The ssh arguments that reach this host, without a command."""
        argv = ['ssh', '-T', '-o', 'BatchMode=yes',
                '-o', f'ConnectTimeout={max(1, round(self.connect_timeout))}']
        if self.user:
            argv += ['-l', self.user]
        if self.port:
            argv += ['-p', str(self.port)]
        if self.identity_file:
            argv += ['-i', self.identity_file]
        return argv + list(self.ssh_options)

    def _connection_key(self) -> tuple:
        return (self.host, self.user, self.port, self.identity_file, self.python, self.workdir,
                tuple(sorted(self.env.items())), self.address, self.ssh_options)

    def __hash__(self) -> int:
        return hash(self._connection_key())


class SshHosts:
    """The hosts of a group: its nodes are placed on them round-robin.

    `SshHosts(['a', 'b'], python='/opt/venv/bin/python')` applies the keyword arguments (fields of
    `SshHost`) to every host given by name; hosts given as `SshHost` are used as they are.
    """

    def __init__(self, hosts: Iterable[Union[SshHost, str]], **options: Any):
        if isinstance(hosts, (str, SshHost)):
            hosts = [hosts]
        self.hosts: List[SshHost] = [
            host if isinstance(host, SshHost) else SshHost(host, **options) for host in hosts]
        if not self.hosts:
            raise ValueError('SshHosts needs at least one host.')

    def __repr__(self) -> str:
        return f'SshHosts({[str(host) for host in self.hosts]!r})'


class SshPreflightError(RuntimeError):
    """Some hosts cannot run the program; the message lists each with its problem and fix."""

    def __init__(self, problems: Mapping[str, Tuple[str, str]]):
        self.problems = dict(problems)
        lines = [f'{len(self.problems)} host(s) cannot run the program; nothing was started:']
        for host, (problem, fix) in self.problems.items():
            lines += [f'  {host}: {problem}', f'    fix: {fix}']
        super().__init__('\n'.join(lines))


def _hosts_of(label: str, resources: Any) -> List[SshHost]:
    if isinstance(resources, SshHosts):
        return resources.hosts
    if isinstance(resources, (SshHost, str)):
        return SshHosts([resources]).hosts
    if isinstance(resources, (list, tuple)):
        if not resources:
            raise ValueError(f'Group {label!r} has an empty list of hosts; give it at least one.')
        return SshHosts(resources).hosts
    raise TypeError(f'ssh takes lp.SshHost or lp.SshHosts resources; group {label!r} got '
                    f'{resources!r}.')


def _endpoint(host: str, port: int) -> str:
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


# --- The launcher side -----------------------------------------------------------------------

class _Connection:
    """One multiplexed ssh connection to a host; its primary session runs the host agent."""

    def __init__(self, host: SshHost, control_path: str):
        self.host = host
        self.control_path = control_path
        self.nodes: List[int] = []  # indices of the executables it runs
        self.hello: Optional[dict] = None
        self._events: 'queue.Queue[Optional[dict]]' = queue.Queue()
        self._stderr: List[str] = []
        self.forked: Dict[int, _ForkedNode] = {}  # the nodes the agent forks, by index
        self._send_lock = threading.Lock()
        env = ' '.join(shlex.quote(f'{k}={v}') for k, v in host.env.items())
        command = (f'exec env {env} {shlex.join(protocol.agent_argv(host.python))} '
                   f'{shlex.quote(host.workdir or "")}')
        argv = host.ssh_argv() + [
            '-M', '-S', control_path, '-o', 'ControlPersist=no',
            '-o', 'ServerAliveInterval=5', '-o', 'ServerAliveCountMax=3', host.host, command]
        # The master ends when the agent does, also after the launcher died; the last one to end
        # removes the launch's local directory, which holds nothing but the control sockets.
        self.process = subprocess.Popen(
            ['sh', '-c', 'ssh "$@"; code=$?; rm -f "$0"; rmdir "${0%/*}" 2>/dev/null; exit $code',
             control_path] + argv[1:],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True)
        self._readers = [
            threading.Thread(target=self._read_events, daemon=True, name=f'lp-ssh-{host}'),
            threading.Thread(target=self._read_errors, daemon=True, name=f'lp-ssh-{host}-err')]
        for reader in self._readers:
            reader.start()

    def _read_events(self) -> None:
        stream = self.process.stdout
        for line in iter(stream.readline, b''):
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
            else:
                self._events.put(message)
        for node in self.forked.values():
            node.end(255)  # as ssh reports a session that ended with its connection
        self._events.put(None)

    def _read_errors(self) -> None:
        for line in iter(self.process.stderr.readline, b''):
            text = line.decode(errors='replace').rstrip()
            self._stderr.append(text)
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
        return self.hello['directory']

    def node_argv(self, index: int) -> List[str]:
        argv, env = protocol.node_command(self.directory, index, self.host.python, self.host.env)
        command = shlex.join(['env'] + [f'{k}={v}' for k, v in env.items()] + argv)
        if self.host.workdir:
            command = f'cd {shlex.quote(self.host.workdir)} && exec {command}'
        else:
            command = f'exec {command}'
        return self.host.ssh_argv() + ['-S', self.control_path, '-o', 'ControlMaster=no',
                                       self.host.host, command]

    def kill(self, indices: Sequence[int]) -> None:
        if self.send('kill', list(indices)) and self.expect('killed', 10.0) is None:
            logging.warning('Could not confirm that nodes %s on %s were killed.', list(indices),
                            self.host)

    def close(self, timeout: float = 10.0) -> None:
        """Ends the agent's session: it ends the rest of the program there and removes its files."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        for reader in self._readers:
            reader.join(2.0)
        if self.hello is not None and self.expect('closed', 0) is None:
            logging.warning('Could not confirm that %s on %s was removed (the connection ended '
                            'early); remove it by hand if it is still there.', self.directory,
                            self.host)

    def diagnose(self) -> Optional[Tuple[str, str]]:
        """(problem, fix) if this host cannot run nodes, after the agent answered or failed."""
        host, python = self.host, self.host.python
        errors = '\n'.join(line for line in self._stderr if line.strip())
        last = errors.splitlines()[-1] if errors else ''
        if self.hello is None:
            code = self.process.poll()
            ssh_command = shlex.join(host.ssh_argv() + [host.host, 'true'])
            if code is None:
                return (f'no answer within {host.connect_timeout + protocol.AGENT_START_TIMEOUT:.0f} s',
                        f'check that the host is up and that `{python}` starts there in time.')
            if code == 255:
                return (f'cannot connect with ssh: {last or "ssh exited with status 255"}',
                        f'make `{ssh_command}` work from this machine without a prompt '
                        '(launchpad runs ssh in batch mode: use keys or an ssh agent).')
            if code == 127 or 'No such file or directory' in last:
                return (f'the interpreter {python!r} was not found ({last})',
                        f'install Python {_python_version()} there, or pass SshHost(..., '
                        "python='/path/to/python3').")
            if 'ModuleNotFoundError' in errors or 'ImportError' in errors:
                return (f'{python} cannot import launchpad and its dependencies: {last}',
                        f'install launchpad there for {python} (pip install launchpad) or put '
                        "your checkout on its path with SshHost(..., env={'PYTHONPATH': ...}).")
            return (f'the host agent failed (exit status {code}): {last or "no error output"}',
                    'see the error; the host agent is started with `' +
                    shlex.join(protocol.agent_argv(python)) + '`.')
        hello = self.hello
        if tuple(hello['python']) != sys.version_info[:2]:
            return (f'{python} is Python {".".join(map(str, hello["python"]))}, the launcher '
                    f'runs Python {_python_version()}; node code travels pickled and needs the '
                    'same version',
                    f"pass SshHost(..., python=...) naming a Python {_python_version()} there.")
        if hello['spec_fields'] != protocol.spec_fields():
            return (f'its launchpad ({hello["launchpad"]}) is not the version the launcher runs',
                    'install the same launchpad version on both sides.')
        if not hello['workdir_ok']:
            return (f'the working directory {host.workdir!r} does not exist there',
                    'create it, or pass an existing SshHost(..., workdir=...).')
        if len(hello['ssh_connection'].split()) != 4 and host.address is None:
            return ('cannot tell which address the host has (SSH_CONNECTION is not set)',
                    "pass SshHost(..., address='<an address other hosts reach it at>').")
        return None

    @property
    def launcher_address(self) -> str:
        """The launcher's address as the host sees it."""
        return self.hello['ssh_connection'].split()[0]

    @property
    def bind_host(self) -> str:
        """Where servers on this host listen."""
        return self.host.address or self.hello['ssh_connection'].split()[2]


class _ForkedNode:
    """A node the host agent forked (`poll` and `kill` like Popen): its output arrives through
    the agent's connection and goes to `fd`, which `Output` gave it."""

    def __init__(self, fd: int, reader: Optional[threading.Thread]):
        self._fd: Optional[int] = fd
        self._reader = reader
        self._code: Optional[int] = None
        self._lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self._lock:
            view = memoryview(data)
            while view and self._fd is not None:
                view = view[os.write(self._fd, view):]

    def end(self, code: int) -> None:
        with self._lock:
            if self._code is None:
                self._code = code
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def poll(self) -> Optional[int]:
        if self._code is not None and self._reader is not None:
            self._reader.join(2.0)  # its output is printed before it counts as ended
        return self._code

    def kill(self) -> None:
        """Gives up on it here; the agent kills it on its host."""
        self.end(-signal.SIGKILL)


def _python_version() -> str:
    return '.'.join(map(str, sys.version_info[:2]))


class _SshRunner:
    """The node sessions of one launch, and the connections that carry them."""

    def __init__(self, connections: List[_Connection], local_dir: str):
        self.connections = connections
        self.local_dir = local_dir
        self.server: Optional[courier.Server] = None
        self.output: Optional[Output] = None
        self.processes: Dict[str, Any] = {}
        self.placement: Dict[str, Tuple[_Connection, int]] = {}
        self._released = threading.Event()
        threading.Thread(target=self._heartbeat, daemon=True, name='lp-ssh-heartbeat').start()

    def _heartbeat(self) -> None:
        while not self._released.wait(protocol.HEARTBEAT_INTERVAL):
            for connection in list(self.connections):
                connection.send('ping', None)

    def expect_fork(self, name: str, connection: _Connection, index: int) -> None:
        """Gets ready for a node that the agent forks, its output going to the terminal."""
        stdout_fd, reader = self.output.open_for(name, title=f'{connection.host.host} {name}')
        self.processes[name] = connection.forked[index] = _ForkedNode(stdout_fd, reader)

    def start_session(self, name: str, connection: _Connection, index: int) -> None:
        """Starts a node in an ssh session of its own, in a tmux window."""
        self.processes[name] = self.output.start_command(name, connection.node_argv(index),
                                                         dict(os.environ), os.getcwd())

    def poll(self) -> Dict[str, Optional[int]]:
        return {name: process.poll() for name, process in self.processes.items()}

    def kill(self, names: Sequence[str]) -> None:
        by_connection: Dict[int, List[int]] = {}
        for name in names:
            connection, index = self.placement[name]
            by_connection.setdefault(id(connection), []).append(index)
        _in_parallel([lambda c=c: c.kill(by_connection[id(c)]) for c in self.connections
                      if id(c) in by_connection])
        deadline = time.monotonic() + 2.0
        for name in names:  # their sessions end now; make sure the local clients do too
            process = self.processes.get(name)
            if process is None:
                continue
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if process.poll() is None:
                process.kill()

    def release(self) -> None:
        self._released.set()
        try:
            if self.server is not None:
                self.server.Stop()
            _in_parallel([connection.close for connection in self.connections])
            if self.output is not None:
                self.output.close()
        finally:
            shutil.rmtree(self.local_dir, ignore_errors=True)


def _in_parallel(calls: Sequence) -> None:
    threads = [threading.Thread(target=call, daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@dataclasses.dataclass
class SshOptions:
    """The ssh launcher's keyword arguments of `lp.launch`.

    Attributes:
      coordinator_host: the address the launcher serves the program's coordinator on (default:
        the address the hosts see the launcher at).
    """
    coordinator_host: Optional[str] = None


class SshLauncher(launcher.Launcher):
    """Runs every executable in a Python process on an SSH host of its group (options:
    `SshOptions`)."""

    foreground = True
    resource_types = (SshHost, SshHosts, str, list, tuple)
    terminals = TERMINALS
    options = SshOptions

    def launch(self, program: Program, options: launcher.LaunchOptions) -> Controller:
        if shutil.which('ssh') is None:
            raise FileNotFoundError('The ssh launcher runs the OpenSSH client, and `ssh` is not on '
                                    'PATH; install it (e.g. apt-get install openssh-client).')
        missing = sorted(set(program.groups) - set(options.resources))
        if missing:
            raise ValueError(
                f'Groups {missing} have no hosts; give every group its hosts, e.g. '
                f"resources={{{missing[0]!r}: lp.SshHost('hostname')}}.")
        hosts = {label: _hosts_of(label, resources)
                 for label, resources in options.resources.items()}
        executables = launcher.executables_of(program, options)
        local_dir = tempfile.mkdtemp(prefix=protocol.DIR_PREFIX)
        runner = _SshRunner([], local_dir)
        try:
            return self._launch(program, options, executables, hosts, runner)
        except BaseException:
            runner.kill([name for name, code in runner.poll().items() if code is None])
            runner.release()
            raise

    def _launch(self, program, options, executables, hosts, runner) -> Controller:
        # Place the executables round-robin over their group's hosts. In tmux windows every
        # node runs in an ssh session, at most NODES_PER_CONNECTION to a connection.
        in_sessions = options.terminal == 'tmux_session'
        per_connection = NODES_PER_CONNECTION if in_sessions else len(executables)
        connections: Dict[tuple, List[_Connection]] = {}
        placed: List[Tuple[_Connection, int]] = []
        turn: Dict[str, int] = {}
        for i, (label, _) in enumerate(executables):
            group_hosts = hosts[label]
            host = group_hosts[turn.get(label, 0) % len(group_hosts)]
            turn[label] = turn.get(label, 0) + 1
            pool = connections.setdefault(host._connection_key(), [])  # pylint: disable=protected-access
            if not pool or len(pool[-1].nodes) >= per_connection:
                pool.append(_Connection(host, os.path.join(runner.local_dir,
                                                           f'c{len(runner.connections)}')))
                runner.connections.append(pool[-1])
            pool[-1].nodes.append(i)
            placed.append((pool[-1], i))
        _preflight(runner.connections)

        token = secrets.token_hex(16)
        coordinator = Coordinator([executable.name for _, executable in executables])
        bind_host = options.settings.coordinator_host or _coordinator_host(runner.connections)
        try:
            runner.server = serve_coordinator(coordinator, _endpoint(bind_host, 0),
                                               auth_token=token, tls=options.tls)
        except OSError as e:
            raise OSError(f'Cannot serve the program\'s coordinator on {bind_host}: {e}. Pass '
                          "lp.launch(..., coordinator_host='<an address of this machine that "
                          "every host reaches>').") from e
        port = int(runner.server.address.rsplit(':', 1)[1])

        table = AddressTable(published={
            address.id: _endpoint(connection.bind_host, 0)
            for (connection, _), (_, executable) in zip(placed, executables)
            for address in executable.addresses})
        packer = specs.Packer(program.name, options.launch_type, table, '',
                              notice_period=options.notice_period, tls=options.tls)
        files: Dict[int, Dict[str, bytes]] = {id(c): {} for c in runner.connections}
        for (connection, i), (_, executable) in zip(placed, executables):
            # Each host reaches the coordinator at the address it sees the launcher at.
            coordinator_host = options.settings.coordinator_host or connection.launcher_address
            packer.coordinator_address = _endpoint(coordinator_host, port)
            files[id(connection)][protocol.spec_name(i)] = specs.pack(packer.spec(
                executable.name, executable.run, env={courier.AUTH_TOKEN_ENV: token},
                cleanup_dir=connection.directory))
        runner.output = Output(options.terminal, program.name, runner.local_dir)
        for (connection, i), (_, executable) in zip(placed, executables):
            runner.placement[executable.name] = (connection, i)
            if not in_sessions:
                runner.expect_fork(executable.name, connection, i)
        for connection in runner.connections:
            connection.send('files', {
                'files': files[id(connection)], 'start': [] if in_sessions else connection.nodes,
                'grace': COORDINATOR_LOSS_TIMEOUT + options.notice_period})
        for connection in runner.connections:
            if connection.expect('ready', protocol.AGENT_START_TIMEOUT) is None:
                raise RuntimeError(f'The connection to {connection.host} ended while starting the '
                                   f'program: {" ".join(connection._stderr[-3:])}')  # pylint: disable=protected-access
        if in_sessions:
            for (connection, i), (_, executable) in zip(placed, executables):
                runner.start_session(executable.name, connection, i)
        return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period)


def _preflight(connections: List[_Connection]) -> None:
    """Waits for every agent to answer; raises SshPreflightError listing every host that cannot."""
    deadline = time.monotonic() + max(c.host.connect_timeout for c in connections) + \
        protocol.AGENT_START_TIMEOUT
    problems: Dict[str, Tuple[str, str]] = {}
    for connection in connections:
        connection.hello = connection.expect('hello', max(0.0, deadline - time.monotonic()))
        if connection.hello is None:
            try:  # it ended: let its stderr arrive before diagnosing
                connection.process.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
            for reader in connection._readers:  # pylint: disable=protected-access
                reader.join(1.0)
        problem = connection.diagnose()
        if problem is not None:
            problems.setdefault(str(connection.host), problem)
    if problems:
        raise SshPreflightError(problems)
    loopback = [str(c.host) for c in connections if c.bind_host in ('127.0.0.1', '::1')]
    if loopback and len(loopback) < len(connections):
        logging.warning('Servers on %s listen on loopback, which the other hosts cannot reach; '
                        "pass SshHost(..., address='<its network address>') if they call them.",
                        ', '.join(sorted(set(loopback))))


def _coordinator_host(connections: List[_Connection]) -> str:
    """Where to serve the coordinator: the address the hosts see the launcher at, or every
    address if they see it at different ones."""
    seen = {connection.launcher_address for connection in connections}
    if len(seen) == 1:
        return seen.pop()
    return '::' if any(':' in address for address in seen) else '0.0.0.0'
