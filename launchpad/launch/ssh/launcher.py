"""The ssh launcher: places a program's nodes on its hosts and runs them there through their agents.

Runs on the launching machine. `lp.launch(..., launch_type='ssh')` places every node on a host of
its group, opens the connections (`connection`), checks every host (`preflight`), serves the
program's coordinator, ships each host its node specs and has its agent (`agent`, on the host)
fork the nodes; nodes shown in tmux windows run in ssh sessions of their own instead.

Threads of one launch, all on the launching machine:

    caller of lp.launch:  place -> connect -> preflight -> serve the coordinator -> ship the
                          specs -> wait for every agent's 'ready' -> return the Controller
    lp-ssh-heartbeat:     a ping to every agent each HEARTBEAT_INTERVAL s, until release
    the Controller's:     poll, kill and release of the runner; kill and release talk to the
                          connections in parallel, a short-lived thread each
    per connection:       its ssh process and two reader threads (see `connection`)
    lp-ssh-reach-HOST:    a detached program's supervisor reaching a lost host's agent again,
                          until the supervisor grace has passed (`_SshRunner._reach_again`)
"""
from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import courier
from courier.transport import tcp_address

from launchpad import runtime
from launchpad.address import AddressTable
from launchpad.launch.controller import Controller
from launchpad.launch.runner import ProcessRunner
from launchpad.launch.launcher import (Launcher, LaunchOptions, executables_of, log_dir_of,
                                       launcher_context, policies_of, stop_order_of)
from launchpad.launch.ssh import detach, masters, move, protocol
from launchpad.launch.ssh.connection import Connection, ForkedNode, coordinator_host
from launchpad.launch.ssh.hosts import SshHost, SshHosts, SshOptions, connection_key, hosts_of
from launchpad.launch.ssh.preflight import preflight
from launchpad.process import spec as specs
from launchpad.process.coordinator import COORDINATOR_LOSS_TIMEOUT, Coordinator, serve_coordinator
from launchpad.process.devices import Allocator, Inventory
from launchpad.process.devices import preflight as preflight_devices
from launchpad.process.output import TERMINALS, Output
from launchpad.program import Program
from launchpad.resources import Resources

# sshd refuses more sessions per connection than MaxSessions (10 by default). Nodes in tmux windows
# run in sessions of their own: a connection then carries the agent's session and at most this
# many nodes, and a host with more nodes gets more connections. Forked nodes need no session.
NODES_PER_CONNECTION = 8


class _SshRunner(ProcessRunner):
    """The nodes of one launch (a `NodeProcess` each), and the connections that carry them.

    Attributes:
      connections: the connections to the hosts, in the order they were opened.
      local_dir: the launch's local directory (the control sockets, tmux's files).
      server: the coordinator's server, once it serves.
      output: where the nodes' output goes, once the launch has it.
      placement: node name -> (its connection, its index in the launch).
      devices: host name -> the allocator of its GPUs and cores (from its agent's hello).
      requested: group label -> the `lp.Resources` each of its nodes gets, for groups given one.
    """

    def __init__(self, connections: List[Connection], local_dir: str):
        super().__init__()
        self.connections = connections
        self.local_dir = local_dir
        self.server: Optional[courier.Server] = None
        self.output: Optional[Output] = None
        self.placement: Dict[str, Tuple[Connection, int]] = {}
        self.devices: Dict[str, Allocator] = {}
        self.requested: Dict[str, Resources] = {}
        self.coordinator: Optional[Coordinator] = None
        self.log_dir: Optional[str] = None  # where a detached program's node output goes
        # A detached program's supervisor: how it persists it, how long agents keep its nodes.
        self.persist: Optional[Callable[[Callable[[], dict]], None]] = None
        self.supervisor_grace, self.run_dir = 0.0, ''  # (run_dir: its files on its host)
        self.masters: Optional[str] = None  # its master connections' directory (`masters`)
        self.opened: 'weakref.WeakSet[Connection]' = weakref.WeakSet()  # (for `fence`)
        self.bind_host = ''  # where the coordinator is served
        self.context: Optional[runtime.NodeContext] = None  # the launching process's
        # A detached program's supervisor: its claim on the agents and the copies it keeps
        # with them, and whether it took over from one on another host (`move`).
        self.mobility: Optional[move.Mobility] = None
        self.moved = False
        self.reached: List[Connection] = []  # the agents it reached when it re-adopted the nodes
        self._restarts: Dict[str, int] = {}
        # What nodes are packed with, set by the launch: the packer, the program's token, the
        # options, the coordinator's port, the hosts of each group and each group's next host.
        self.packer: Optional[specs.Packer] = None
        self.token = ''
        self.options: Optional[LaunchOptions] = None
        self.port = 0
        self.hosts: Dict[str, List[SshHost]] = {}
        self.turn: Dict[str, int] = {}
        self.next_index = 0
        self._released = threading.Event()
        self._swap = threading.Lock()  # a connection reached again replaces a lost one
        threading.Thread(target=self._heartbeat, daemon=True, name='lp-ssh-heartbeat').start()

    def connect(self, host: SshHost, name: str, reattach: Optional[dict] = None,
                forward: bool = False) -> Connection:
        """A new connection to `host`; a detached program's over its master (`masters`)."""
        master = (masters.socket_path(self.masters, host, self.hosts)
                  if self.masters and os.path.isdir(self.masters) else None)  # (ssh needs it)
        connection = Connection(host, os.path.join(self.local_dir, name), reattach=reattach,
                                detached=bool(self.supervisor_grace), claim=self.claim,
                                master=master, forward=forward)
        self.opened.add(connection)
        return connection

    def _heartbeat(self) -> None:
        while not self._released.wait(protocol.HEARTBEAT_INTERVAL):
            for connection in list(self.connections):
                connection.send('ping', None)

    def poll(self) -> Dict[str, Optional[int]]:
        codes = super().poll()
        if self.persist is not None and self.coordinator is not None:  # (none before launch)
            self.persist(self.supervised_state)
            if self.mobility is not None:
                self.mobility.refresh(list(self.connections))
        return codes

    @property
    def claim(self) -> Optional[dict]:
        """What a detached program's supervisor claims its agents with (`protocol`)."""
        return None if self.mobility is None else self.mobility.claim

    def tell(self, connection: Connection) -> None:
        """Tells a detached program's agent where its nodes reach the coordinator, and gives
        it the copies that a supervisor on its host would start from (`move`)."""
        if self.mobility is not None:
            self.mobility.share(connection, self.coordinator_address(connection), self.run_dir)

    def coordinator_address(self, connection: Connection) -> str:
        """Where the nodes on `connection`'s host reach the coordinator (an address given at
        launch was the first supervisor host's)."""
        given = None if self.moved else self.options.settings.coordinator_host
        return tcp_address(given or connection.launcher_address, self.port)

    def fence(self, host: SshHost, refused: dict) -> None:
        """The agent on `host` refused this supervisor: a newer one holds the program, and this
        one leaves it (`move.leave`), with every connection it opened (one still connecting to
        another host would start a master connection that no one ends)."""
        with self._swap:
            self._released.set()
        move.leave(self.run_dir, self.local_dir, list(self.opened),
                   move.refusal_message(host, refused))

    def supervised_state(self) -> dict:
        """What a new supervisor of a detached program needs to re-adopt its running nodes
        (`readopt`): the coordinator (node states, restart budgets, groups), the packer (the
        addresses), where each node runs, and what reaches each host's agent again."""
        with self._swap:  # (not while a connection reached again replaces a lost one)
            connections, placement = list(self.connections), dict(self.placement)
        number = {id(connection): i for i, connection in enumerate(connections)}
        return {'coordinator': self.coordinator, 'commands': {}, 'ssh': {
            'connections': [(c.host, list(c.nodes), c.hello) for c in connections],
            'placement': {name: (number[id(connection)], index)
                          for name, (connection, index) in placement.items()},
            'packer': self.packer, 'token': self.token, 'port': self.port,
            'bind_host': self.bind_host, 'hosts': self.hosts, 'turn': self.turn,
            'next_index': self.next_index, 'requested': self.requested,
            'devices': self.devices, 'restarts': self._restarts, 'run_dir': self.run_dir,
            'epoch': self.mobility and self.mobility.epoch, 'supervisor': socket.gethostname()}}

    def readopt(self, state: dict, run_dir: str) -> None:
        """Reaches again the agents of the nodes in `state` (`supervised_state`) and takes over
        those nodes, restarting none; a node whose agent is gone counts as ended with 255.

        Raises:
          move.SupervisionMovedError: an agent refused it (a newer supervisor holds it).
        """
        saved = state['ssh']
        self.mobility.epoch = (saved.get('epoch') or 0) + 1
        self.moved = saved.get('supervisor', socket.gethostname()) != socket.gethostname()
        self.packer, self.token, self.port = saved['packer'], saved['token'], saved['port']
        self.bind_host, self.hosts, self.turn = saved['bind_host'], saved['hosts'], saved['turn']
        self.next_index, self.requested = saved['next_index'], saved['requested']
        self.devices, self._restarts = saved['devices'], saved['restarts']
        self.run_dir, began = run_dir, time.monotonic()
        for i, (host, nodes, hello) in enumerate(saved['connections']):
            connection = self.connect(host, f'c{i}', reattach=hello, forward=not self.moved)
            connection.nodes, connection.hello = nodes, hello
            self.connections.append(connection)
        answers = {}
        _in_parallel([lambda c=c: answers.__setitem__(
            id(c), c.hello_again(protocol.AGENT_START_TIMEOUT)) for c in self.connections])
        sessions = ' '.join('-' if c.session_at is None else f'{c.session_at - began:.2f}'
                            for c in self.connections)
        logging.info('Reached %d of %d agents again after %.2f s (ssh sessions up after: %s s), '
                     '%d over master connections that ran already.',
                     len(list(filter(None, answers.values()))), len(answers),
                     time.monotonic() - began, sessions,
                     sum(c.over_running_master for c in self.connections))
        for connection in self.connections:
            if connection.refused is not None:
                raise move.SupervisionMovedError(move.refusal_message(connection.host,
                                                                      connection.refused))
        for name, (number, index) in saved['placement'].items():
            connection = self.connections[number]
            self.placement[name] = (connection, index)
            self.expect_fork(name, connection, index)
            hello = answers[id(connection)]
            code = None if hello is None else hello['nodes'].get(str(index), 255)
            if code is not None:
                connection.forked[index].end(code)
        for connection in self.connections:
            if answers[id(connection)] is None:  # (its nodes end with 255 if it is gone)
                self._lost(connection)
            else:
                connection.hello = answers[id(connection)]
                self.reached.append(connection)
                self.watch(connection)
                connection.send('resume', None)

    def watch(self, connection: Connection) -> None:
        """Once `connection`'s agent runs a detached program's nodes: if the connection is
        lost, the agent keeps them for the supervisor grace, and this supervisor reaches it
        again meanwhile (`_reach_again`) rather than taking them for ended."""
        if self.supervisor_grace:
            connection.on_lost = self._lost

    def _lost(self, connection: Connection) -> None:
        threading.Thread(target=self._reach_again, args=(connection,), daemon=True,
                         name=f'lp-ssh-reach-{connection.host}').start()

    def _reach_again(self, lost: Connection) -> None:
        """Reaches the agent of lost connection `lost` again through a new one that takes its
        place, trying until the supervisor grace has passed; its nodes end with 255 if the
        agent is gone or cannot be reached by then."""
        deadline = time.monotonic() + self.supervisor_grace
        attempt, gone = 0, lost.agent_gone()
        if lost.refused is not None:
            self.fence(lost.host, lost.refused)
        if not gone:
            lost.abandon()  # (if it still lingers, the agent waits for the next one meanwhile)
            logging.warning('Lost the connection to %s; reaching its agent again, which keeps '
                            'its nodes for up to %g s.', lost.host, self.supervisor_grace)
        while not (gone or self._released.is_set() or time.monotonic() > deadline):
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            attempt += 1
            connection = self.connect(lost.host, f'{os.path.basename(lost.control_path)}.'
                                      f'{attempt}', reattach=lost.hello)
            hello = connection.hello_again(min(protocol.AGENT_START_TIMEOUT,
                                               max(1.0, deadline - time.monotonic())))
            if hello is not None:
                self._take_over(lost, connection, hello)
                return
            gone = connection.agent_gone()
            if connection.refused is not None:
                self.fence(lost.host, connection.refused)
            connection.abandon()
        if self._released.is_set():
            return  # (the program ended meanwhile; its agent ends it there after the grace)
        logging.warning('The agent on %s was not reached again; its nodes count as ended.',
                        lost.host)
        for node in lost.forked.values():
            node.end(255)

    def _take_over(self, lost: Connection, connection: Connection, hello: dict) -> None:
        """Puts `connection`, which reached the agent of `lost` again, in its place (or closes
        it if the program ended meanwhile: the agent then ends what is left there)."""
        with self._swap:
            if self._released.is_set():
                connection.close()
                return
            connection.nodes, connection.forked, connection.hello = (lost.nodes, lost.forked,
                                                                     hello)
            for index, node in connection.forked.items():  # (those that ended meanwhile)
                code = hello['nodes'].get(str(index), 255)
                if code is not None:
                    node.end(code)
            self.connections[self.connections.index(lost)] = connection
            for name, (placed, index) in list(self.placement.items()):
                if placed is lost:
                    self.placement[name] = (connection, index)
            self.watch(connection)
            connection.send('resume', None)
            self.tell(connection)
        logging.warning('Reached the agent on %s again; its nodes run on.', lost.host)

    def expect_fork(self, name: str, connection: Connection, index: int) -> None:
        """Gets ready for a node that the agent forks, its output going to the terminal."""
        stdout_fd, reader = self.output.open_for(name, title=f'{connection.host.host} {name}')
        self.processes[name] = connection.forked[index] = ForkedNode(stdout_fd, reader,
                                                                     self._exit_heard)

    def _exit_heard(self) -> None:
        if self.coordinator is not None:
            self.coordinator.notify_change()

    def start_session(self, name: str, connection: Connection, index: int,
                      window: Optional[str] = None) -> None:
        """Starts a node in an ssh session of its own, in a tmux window."""
        self.processes[name] = self.output.start_command(window or name,
                                                         connection.node_argv(index),
                                                         dict(os.environ), os.getcwd())

    def restart(self, name: str) -> None:
        """Has the node's host agent fork it again (in a tmux window: a new ssh session)."""
        connection, index = self.placement[name]
        self._restarts[name] = self._restarts.get(name, 0) + 1
        if isinstance(self.processes[name], ForkedNode):
            self.expect_fork(name, connection, index)
            if not connection.send('start', [index]):
                raise RuntimeError(f'the connection to {connection.host} is gone')
        else:
            connection.kill([index])  # what is left of its last run
            self.start_session(name, connection, index, f'{name}~{self._restarts[name]}')

    def host_in_turn(self, label: str) -> SshHost:
        """The host of group `label` whose turn it is (round-robin)."""
        group_hosts = self.hosts[label]
        return group_hosts[self.turn.get(label, 0) % len(group_hosts)]

    def next_host(self, label: str) -> SshHost:
        """The host of group `label` whose turn it is; the turn passes to the next."""
        host = self.host_in_turn(label)
        self.turn[label] = self.turn.get(label, 0) + 1
        return host

    def publish(self, connection: Connection, executable) -> None:
        """Where the servers of `executable` bind on its host: the address its host has towards
        the launcher, on a port the kernel picks (every node is published before any is packed,
        so that each spec holds the whole table)."""
        self.packer.address_table.published.update(
            {address.id: tcp_address(connection.bind_host, 0) for address in executable.addresses})

    def devices_of(self, connection: Connection) -> Allocator:
        """The allocator of the GPUs and cores of `connection`'s host (one per machine, however
        many connections reach it)."""
        inventory = Inventory.from_json(connection.hello['devices'])
        if inventory.host not in self.devices:
            self.devices[inventory.host] = Allocator(
                dataclasses.replace(inventory, host=str(connection.host)))
        return self.devices[inventory.host]

    def release_ended(self) -> None:
        """Frees the GPUs and cores of the nodes that ended for good (removed ones)."""
        status = self.coordinator.status()
        for allocator in self.devices.values():
            allocator.release_ended(status)

    def admit(self, connection: Connection, index: int, label: str, executable,
              policy=None) -> bytes:
        """Packs `executable` of group `label` (`policy`: an added node's) as node `index` of
        `connection`, with the GPUs and cores it gets there, and gets ready for its process:
        every node's one step before its host's agent starts it."""
        self.packer.coordinator_address = (
            protocol.coordinator_endpoint if self.mobility is not None  # (`tell` keeps it)
            else self.coordinator_address(connection))
        requested = self.requested.get(label)
        given = None if requested is None else self.devices_of(connection).assign(
            executable.name, requested)
        spec = specs.pack(self.packer.admit(executable, policy,
                                            env={courier.AUTH_TOKEN_ENV: self.token},
                                            cleanup_dir=connection.directory, resources=given))
        if given is not None:  # for `status` and the dashboard
            self.coordinator.set_node_resources(executable.name, **given.describe())
        self.placement[executable.name] = (connection, index)
        if self.options.terminal != 'tmux_session':
            self.expect_fork(executable.name, connection, index)
        return spec

    def send_files(self, connection: Connection, files: Dict[str, bytes],
                   start: Sequence[int]) -> bool:
        """Ships spec files to `connection`'s agent, which forks nodes `start`; False if the
        connection is gone."""
        return connection.send('files', {
            'files': files, 'start': list(start), 'supervisor_grace': self.supervisor_grace,
            'run_dir': self.run_dir,
            'grace': COORDINATOR_LOSS_TIMEOUT + self.options.notice_period})

    def check_add(self, label: str) -> None:
        """Nodes in tmux windows cannot be added, nor nodes of a group without hosts."""
        if self.options.terminal == 'tmux_session':
            raise NotImplementedError('nodes shown in tmux windows (terminal=\'tmux_session\') '
                                      'cannot be added to a running ssh program; use another '
                                      'terminal')
        if label not in self.hosts:
            raise ValueError(f'Group {label!r} has no ssh hosts: a group that is not in the '
                             'program at launch needs its hosts in resources= all the same.')
        connection = self.connection_to(self.host_in_turn(label))
        if label in self.requested and connection is not None:
            self.release_ended()
            self.devices_of(connection).check(label, self.requested[label])

    def connection_to(self, host: SshHost) -> Optional[Connection]:
        """The open connection to `host`, if there is one."""
        return next((c for c in self.connections
                     if connection_key(c.host) == connection_key(host)), None)

    def add_executable(self, label: str, executable, policy) -> None:
        """Starts a node added to the running program on the next host of its group, forked by
        that host's agent as the launch's nodes were; a host without a connection yet gets one,
        checked as at launch."""
        self.check_add(label)
        host = self.next_host(label)
        connection = self.connection_to(host)
        if connection is None:
            connection = self.connect(host, f'c{len(self.connections)}')
            self.connections.append(connection)
            preflight([connection])
            self.tell(connection)
        index = self.next_index
        self.next_index += 1
        connection.nodes.append(index)
        self.publish(connection, executable)
        self.release_ended()
        spec = self.admit(connection, index, label, executable, policy)
        if not self.send_files(connection, {protocol.spec_name(index): spec}, [index]):
            raise RuntimeError(f'the connection to {connection.host} is gone')
        if connection.expect('ready', protocol.AGENT_START_TIMEOUT) is None:
            raise RuntimeError(f'The connection to {connection.host} ended while starting '
                               f'{executable.name}: {" ".join(connection.stderr_lines[-3:])}')
        self.watch(connection)

    def kill(self, names: Sequence[str]) -> None:
        """Has the agents kill the named nodes on their hosts, then ends what is left of them
        here."""
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
        """Stops the heartbeat and the coordinator, closes the connections (each agent ends what is
        left on its host) and removes the local directory."""
        with self._swap:  # (a connection reached again from now on is closed at once)
            self._released.set()
            connections = list(self.connections)
        if self.context is not None:  # handles no longer dereference here
            runtime.clear_process_context(self.context)
            self.context.stop.trigger()
        try:
            if self.server is not None:
                self.server.Stop()
            _in_parallel([connection.close for connection in connections])
            if self.masters is not None:  # (a detached program's: it has ended)
                masters.end_all(self.run_dir)
            if self.output is not None:
                self.output.close()
        finally:
            shutil.rmtree(self.local_dir, ignore_errors=True)


def _in_parallel(calls: Sequence[Callable[[], None]]) -> None:
    """Makes every call, each in a thread of its own, and returns when all returned."""
    threads = [threading.Thread(target=call, daemon=True) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class SshLauncher(Launcher):
    """Runs every executable in a Python process on an SSH host of its group (options:
    `SshOptions`)."""

    foreground = True
    resource_types = (SshHost, SshHosts, str, list, tuple, Resources)
    terminals = TERMINALS
    options = SshOptions

    def group_resources(self, label: str, resources):
        """The group's hosts as given: an `lp.Resources` alone names none."""
        if isinstance(resources, Resources):
            raise TypeError(f'Group {label!r} got {resources!r} but no hosts; give both: '
                            f"lp.SshHosts(['host1', 'host2'], resources={resources!r}).")
        return resources

    def launch(self, program: Program, options: LaunchOptions) -> Controller:
        missing = sorted(set(program.groups) - set(options.resources))
        if missing:
            raise ValueError(
                f'Groups {missing} have no hosts; give every group its hosts, e.g. '
                f"resources={{{missing[0]!r}: lp.SshHost('hostname')}}.")
        hosts = {label: hosts_of(label, resources)
                 for label, resources in options.resources.items()}
        settings = options.settings or SshOptions()
        supervisor_host = None
        if (settings.detach or settings.supervisor_host is not None
                or settings.supervisor_grace is not None):
            supervisor_host = detach.supervisor_host_of(program, hosts, settings,
                                                        options.terminal)
        if shutil.which('ssh') is None:
            raise FileNotFoundError('The ssh launcher runs the OpenSSH client, and `ssh` is not on '
                                    'PATH; install it (e.g. apt-get install openssh-client).')
        if supervisor_host is not None:
            return detach.start(program, options, supervisor_host, hosts)
        return launch_supervised(program, options)

    def _launch(self, program, options, executables, hosts, runner) -> Controller:
        # Place the executables round-robin over their group's hosts. In tmux windows every
        # node runs in an ssh session, at most NODES_PER_CONNECTION to a connection.
        runner.options, runner.hosts = options, hosts
        runner.requested = {label: resources.resources
                            for label, resources in options.resources.items()
                            if isinstance(resources, SshHosts) and resources.resources is not None}
        in_sessions = options.terminal == 'tmux_session'
        per_connection = NODES_PER_CONNECTION if in_sessions else len(executables)
        connections: Dict[tuple, List[Connection]] = {}
        placed: List[Tuple[Connection, int]] = []
        for i, (label, _) in enumerate(executables):
            host = runner.next_host(label)
            pool = connections.setdefault(connection_key(host), [])
            if not pool or len(pool[-1].nodes) >= per_connection:
                pool.append(runner.connect(host, f'c{len(runner.connections)}'))
                runner.connections.append(pool[-1])
            pool[-1].nodes.append(i)
            placed.append((pool[-1], i))
        runner.next_index = len(executables)
        preflight(runner.connections)
        preflight_devices([(runner.devices_of(connection), executable.name, runner.requested[label])
                           for (connection, _), (label, executable) in zip(placed, executables)
                           if label in runner.requested])

        runner.token = secrets.token_hex(16)
        policies = policies_of(program, executables)
        coordinator = runner.coordinator = Coordinator(
            [executable.name for _, executable in executables], policies=policies,
            groups=program.group_limits(),
            stop_order=stop_order_of(program, executables, options.notice_period))
        bind_host = runner.bind_host = (options.settings.coordinator_host
                                        or coordinator_host(runner.connections))
        try:
            runner.server = serve_coordinator(coordinator, tcp_address(bind_host, 0),
                                               auth_token=runner.token, tls=options.tls)
        except OSError as e:
            raise OSError(f'Cannot serve the program\'s coordinator on {bind_host}: {e}. Pass '
                          "lp.launch(..., coordinator_host='<an address of this machine that "
                          "every host reaches>').") from e
        runner.port = int(runner.server.address.rsplit(':', 1)[1])
        runner.packer = specs.Packer(program.name, options.launch_type, AddressTable(), '',
                                     notice_period=options.notice_period, tls=options.tls,
                                     policies=policies)
        # Nodes ride out a network cut as long as their agent does (see protocol), and a
        # detached program's nodes the loss of their supervisor.
        runner.packer.coordinator_grace = max(protocol.LAUNCHER_SILENCE_TIMEOUT,
                                              runner.supervisor_grace)
        runner.output = Output(options.terminal, program.name, runner.local_dir,
                               log_dir=runner.log_dir or log_dir_of(options))
        for (connection, _), (_, executable) in zip(placed, executables):
            runner.publish(connection, executable)
        files: Dict[int, Dict[str, bytes]] = {id(c): {} for c in runner.connections}
        for (connection, i), (label, executable) in zip(placed, executables):
            files[id(connection)][protocol.spec_name(i)] = runner.admit(connection, i, label,
                                                                        executable)
        for connection in runner.connections:
            runner.tell(connection)
            runner.send_files(connection, files[id(connection)],
                              [] if in_sessions else connection.nodes)
        for connection in runner.connections:
            if connection.expect('ready', protocol.AGENT_START_TIMEOUT) is None:
                raise RuntimeError(f'The connection to {connection.host} ended while starting the '
                                   f'program: {" ".join(connection.stderr_lines[-3:])}')
        for connection in runner.connections:
            runner.watch(connection)
        if in_sessions:
            for (connection, i), (_, executable) in zip(placed, executables):
                runner.start_session(executable.name, connection, i)
        runner.context = launcher_context(program.name, options, runner.packer.address_table,
                                          coordinator, runner.token, runner._released)
        return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period, auth_token=runner.token)


def launch_supervised(program: Program, options: LaunchOptions,
                      supervision=None, run_dir: str = '') -> Controller:
    """Launches `program` from this process: attached to it, or, on one of the program's hosts,
    as the supervisor of a detached program (`launchpad.launch.supervisor`) with `supervision`
    (`processes.Supervision`: its nodes' output goes to files, its state is persisted and its
    nodes outlive it for the supervisor grace, after which the agents remove its `run_dir`)."""
    hosts = {label: hosts_of(label, resources) for label, resources in options.resources.items()}
    executables = executables_of(program, options)
    # (No owners file in it: the last ssh wrapper out removes it with rmdir, see Connection.)
    runner = _SshRunner([], tempfile.mkdtemp(prefix=protocol.DIR_PREFIX))
    if supervision is not None:
        runner.log_dir, runner.persist = supervision.log_dir, supervision.persist
        runner.supervisor_grace, runner.run_dir = supervision.grace, run_dir
        runner.masters = masters.directory(run_dir)
        runner.mobility = move.Mobility(run_dir, lambda: getattr(runner.persist, 'last', None))
    try:
        return SshLauncher()._launch(  # pylint: disable=protected-access
            program, options, executables, hosts, runner)
    except BaseException:
        runner.kill([name for name, code in runner.poll().items() if code is None])
        runner.release()
        raise


def readopt(program: Program, options: LaunchOptions, supervision, state: dict,
            run_dir: str) -> Controller:
    """Takes over the running nodes of a detached program whose supervisor died, from what it
    persisted (`_SshRunner.supervised_state`), through their hosts' agents; restarts none. On
    another host than its own (`move`), it serves the coordinator where the hosts see this one,
    and tells the agents."""
    runner = _SshRunner([], tempfile.mkdtemp(prefix=protocol.DIR_PREFIX))
    runner.log_dir, runner.persist = supervision.log_dir, supervision.persist
    runner.supervisor_grace, runner.options = supervision.grace, options
    runner.masters = masters.directory(run_dir)
    runner.mobility = move.Mobility(run_dir, lambda: getattr(runner.persist, 'last', None))
    coordinator = runner.coordinator = state['coordinator']
    try:
        runner.output = Output('output_to_files', program.name, runner.local_dir,
                               log_dir=supervision.log_dir)
        runner.readopt(state, run_dir)
        reached = runner.reached
        if runner.moved:
            runner.bind_host = coordinator_host(reached) if reached else '0.0.0.0'
        runner.server = serve_coordinator(
            coordinator, tcp_address(runner.bind_host, 0 if runner.moved else runner.port),
            auth_token=runner.token, tls=options.tls)
        runner.port = int(runner.server.address.rsplit(':', 1)[1])
        for connection in reached:
            runner.tell(connection)
    except BaseException:  # (no `release`: it would end the nodes; a next supervisor may do)
        runner._released.set()  # pylint: disable=protected-access
        for connection in runner.connections:  # (the agents keep the nodes for the next one)
            connection.abandon()
        shutil.rmtree(runner.local_dir, ignore_errors=True)
        raise
    runner.context = launcher_context(program.name, options, runner.packer.address_table,
                                      coordinator, runner.token, runner._released)  # pylint: disable=protected-access
    return Controller(program.name, coordinator, runner, launch_type=options.launch_type,
                      notice_period=options.notice_period, auth_token=runner.token)
