"""The preflight of an ssh launch: can every host run the program? All problems in one error.

Runs on the launching machine, on what each host's agent said in its hello (or on how its
connection failed) before anything of the program starts.
"""
from __future__ import annotations

import logging
import shlex
import sys
import time
from typing import Dict, List, Mapping, Optional, Tuple

from launchpad.launch.ssh import protocol
from launchpad.launch.ssh.connection import Connection


class SshPreflightError(RuntimeError):
    """Some hosts cannot run the program; the message lists each with its problem and fix."""

    def __init__(self, problems: Mapping[str, Tuple[str, str]]):
        self.problems = dict(problems)
        lines = [f'{len(self.problems)} host(s) cannot run the program; nothing was started:']
        for host, (problem, fix) in self.problems.items():
            lines += [f'  {host}: {problem}', f'    fix: {fix}']
        super().__init__('\n'.join(lines))


def preflight(connections: List[Connection]) -> None:
    """Waits for every agent to answer; raises SshPreflightError listing every host that cannot."""
    deadline = time.monotonic() + max(c.host.connect_timeout for c in connections) + \
        protocol.AGENT_START_TIMEOUT
    problems: Dict[str, Tuple[str, str]] = {}
    for connection in connections:
        connection.hello = connection.expect('hello', max(0.0, deadline - time.monotonic()))
        if connection.hello is None:  # it ended: let its stderr arrive before diagnosing
            connection.wait_ended(2.0)
        problem = _diagnose(connection)
        if problem is not None:
            problems.setdefault(str(connection.host), problem)
    if problems:
        raise SshPreflightError(problems)
    loopback = [str(c.host) for c in connections if c.bind_host in ('127.0.0.1', '::1')]
    if loopback and len(loopback) < len(connections):
        logging.warning('Servers on %s listen on loopback, which the other hosts cannot reach; '
                        "pass SshHost(..., address='<its network address>') if they call them.",
                        ', '.join(sorted(set(loopback))))


def _diagnose(connection: Connection) -> Optional[Tuple[str, str]]:
    """(problem, fix) if the host of `connection` cannot run nodes, once its agent answered or
    failed."""
    host, python = connection.host, connection.host.python
    errors = '\n'.join(line for line in connection.stderr_lines if line.strip())
    last = errors.splitlines()[-1] if errors else ''
    if connection.hello is None:
        code = connection.process.poll()
        ssh_command = shlex.join(host.ssh_argv() + [host.host, 'true'])
        if code is None:
            return (f'no answer within '
                    f'{host.connect_timeout + protocol.AGENT_START_TIMEOUT:.0f} s',
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
                    f'install launchpad there for {python} (pip install launchpad-ml) or put '
                    "your checkout on its path with SshHost(..., env={'PYTHONPATH': ...}).")
        return (f'the host agent failed (exit status {code}): {last or "no error output"}',
                'see the error; the host agent is started with `' +
                shlex.join(protocol.agent_argv(python)) + '`.')
    hello = connection.hello
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


def _python_version() -> str:
    return '.'.join(map(str, sys.version_info[:2]))
