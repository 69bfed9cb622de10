"""The ssh platform's resources: the hosts a group's nodes run on (`lp.SshHost`, `lp.SshHosts`),
and its options (`SshOptions`, the keyword arguments of `lp.launch`).

Runs on the launching machine: the user builds these, and the launcher reads them.
"""
from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

from launchpad.resources import Resources


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

    def command(self, argv: Sequence[str]) -> str:
        """The remote shell command that runs `argv` on this host with `env`."""
        env = ' '.join(shlex.quote(f'{k}={v}') for k, v in self.env.items())
        return f'exec env {env} {shlex.join(argv)}'

    def __hash__(self) -> int:
        return hash(connection_key(self))


class SshHosts:
    """The hosts of a group: its nodes are placed on them round-robin.

    `SshHosts(['a', 'b'], python='/opt/venv/bin/python')` applies the keyword arguments (fields of
    `SshHost`) to every host given by name; hosts given as `SshHost` are used as they are.
    `resources=lp.Resources(gpus=1, cpus=4)` gives each node of the group its own GPUs and cores
    of the host it runs on.
    """

    def __init__(self, hosts: Iterable[Union[SshHost, str]], *,
                 resources: Optional[Resources] = None, **options: Any):
        if resources is not None and not isinstance(resources, Resources):
            raise TypeError(f'SshHosts(resources=...) takes an lp.Resources, got {resources!r}.')
        self.resources = resources
        if isinstance(hosts, (str, SshHost)):
            hosts = [hosts]
        self.hosts: List[SshHost] = [
            host if isinstance(host, SshHost) else SshHost(host, **options) for host in hosts]
        if not self.hosts:
            raise ValueError('SshHosts needs at least one host.')

    def __repr__(self) -> str:
        resources = '' if self.resources is None else f', resources={self.resources!r}'
        return f'SshHosts({[str(host) for host in self.hosts]!r}{resources})'


def hosts_of(label: str, resources: Any) -> List[SshHost]:
    """The hosts of group `label` from its resources: an SshHosts, an SshHost, a host name or a
    list of hosts or names."""
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


def connection_key(host: SshHost) -> tuple:
    """What makes two hosts share a connection: every field but `connect_timeout`."""
    return (host.host, host.user, host.port, host.identity_file, host.python, host.workdir,
            tuple(sorted(host.env.items())), host.address, host.ssh_options)


@dataclasses.dataclass
class SshOptions:
    """The ssh launcher's keyword arguments of `lp.launch`.

    Attributes:
      coordinator_host: the address the launcher serves the program's coordinator on (default:
        the address the hosts see the launcher at; with `detach`, where the supervisor's host
        sees itself).
      detach: run the program's supervision (its coordinator and controller, restarts, hang
        detection, elastic groups, metrics, its registry entry) in a daemon on one of the
        program's hosts, so that the program outlives this process and this machine's network
        (`launchpad.launch.ssh.detach`); `lp.launch` returns once every node runs.
      supervisor_host: with `detach`, the host the supervisor runs on: one of the program's
        hosts, by name (`SshHost.host`) or as an `lp.SshHost` (default: the first host of the
        program's first group).
      supervisor_grace: with `detach`, seconds the nodes run on without a supervisor (the
        keeper on its host starts a new one at once, which re-adopts them; if that host is
        gone, `python -m launchpad.launch attach --recover PROGRAM --host HOST` starts one on
        another, `launchpad.launch.ssh.move`) before they stop (default
        `detached.SUPERVISOR_GRACE`, 180 s).
    """
    coordinator_host: Optional[str] = None
    detach: bool = False
    supervisor_host: Union[str, SshHost, None] = None
    supervisor_grace: Optional[float] = None
