"""A detached SSH program, supervised on one of its hosts: `lp.launch(program,
launch_type='ssh', detach=True, supervisor_host=...)`.

Runs on the launching machine. `start` sends the program's launch file
(`launchpad.launch.detached.launch_file`) over ssh to the supervisor's host, where
`python -m launchpad.launch.supervisor start` starts the keeper and the supervisor that detached
local_mp programs have (`launchpad.launch.supervisor`), in a session of their own. That
supervisor launches the program with the ssh launcher (`launcher.launch_supervised`): it
connects from its host to every host, serves the coordinator there and writes the nodes' output
to files there. Once every node runs, the host answers with the supervisor's registry entry,
which `start` registers on this machine with the ssh command that reaches it
(`registry.Entry.ssh`): `list`, `status`, `attach`, `stop` and `lp.attach` reach the supervisor
through an ssh tunnel (`launchpad.observe.tunnel`), so this machine may sleep, lose the network
or end the launching process meanwhile.

The hosts' agents of a detached program outlive their supervisor's ssh sessions (`agent`,
`--detached`): when the supervisor dies, the keeper on its host starts a new one, which reaches
them again and re-adopts the nodes from the state its predecessor persisted
(`launcher.readopt`); `python -m launchpad.launch attach --recover` starts one there when the
keeper is gone too (`recover`), and `attach --recover --host HOST` on another host when this
one is gone (`move`).
"""
from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
from typing import Dict, List

from launchpad.launch import detached
from launchpad.launch.ssh.hosts import SshHost, connection_key
from launchpad.observe import registry
from launchpad.observe import tunnel

_START_TIMEOUT = 330.0  # seconds for the host to launch every node (its own wait is 300 s)


def supervisor_host_of(program, hosts: Dict[str, List[SshHost]], settings,
                       terminal: str) -> SshHost:
    """The host that `settings` (`launcher.SshOptions`) names for the supervisor of `program`,
    checked; the first host of its first group by default.

    Raises:
      ValueError: the options do not make a detached program, or name no host of it.
    """
    if not settings.detach:
        given = 'supervisor_host' if settings.supervisor_host is not None else 'supervisor_grace'
        raise ValueError(f'{given}= applies to detached programs only; pass detach=True too, '
                         'or leave it out.')
    grace = settings.supervisor_grace
    if grace is not None and not (isinstance(grace, (int, float)) and grace > 0):
        raise ValueError(f'supervisor_grace={grace!r} must be a positive number of seconds.')
    if terminal == 'tmux_session':
        raise ValueError("terminal='tmux_session' cannot be detached: the output of a detached "
                         "program goes to files on its supervisor's host; leave terminal= out.")
    ordered = _ordered(program, hosts)
    wanted = settings.supervisor_host
    if wanted is None:
        return ordered[0]
    for host in ordered:
        if (connection_key(host) == connection_key(wanted) if isinstance(wanted, SshHost)
                else wanted in (host.host, str(host))):
            return host
    names = ', '.join(dict.fromkeys(str(host) for host in ordered))
    raise ValueError(f'supervisor_host={wanted!r} is not one of the program\'s hosts ({names}); '
                     'name one of them: the supervisor runs where the program runs, so that '
                     'the program does not depend on this machine.')


def _ordered(program, hosts: Dict[str, List[SshHost]]) -> List[SshHost]:
    """The hosts of `program`'s groups in the order of its groups."""
    return [host for label in program.groups if label in hosts for host in hosts[label]]


def start(program, options, host: SshHost,
          hosts: Dict[str, List[SshHost]]) -> detached.AttachedController:
    """Starts the supervisor of `program` on `host`, one of `hosts` (of each group), and returns
    once every node runs."""
    program_id = registry.new_id(program.name)
    tunnel.local_path(program_id)  # this machine reaches it through one: its socket must fit
    remote_options = dataclasses.replace(
        options, terminal='output_to_files',
        settings=dataclasses.replace(options.settings, detach=False, supervisor_host=None))
    grace = options.settings.supervisor_grace or detached.SUPERVISOR_GRACE
    header, payload = detached.launch_file(program, remote_options, grace, program_id, None, [])
    launch = pickle.dumps((header, payload), protocol=pickle.HIGHEST_PROTOCOL)
    command = host.command([host.python, '-m', detached.SUPERVISOR_MODULE, 'start'])
    try:
        started = subprocess.run(host.ssh_argv() + [host.host, command], input=launch,
                                 capture_output=True, timeout=_START_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise TimeoutError(f'The supervisor of detached program {program_id} on {host} did not '
                           f'start every node within {_START_TIMEOUT:g} s.') from e
    out = started.stdout.decode(errors='replace').strip().splitlines()
    if started.returncode != 0 or not out:
        errors = started.stderr.decode(errors='replace').strip().splitlines()[-25:]
        raise RuntimeError(f'The supervisor of detached program {program_id} could not launch '
                           f'it on {host} (exit {started.returncode}):\n' + '\n'.join(errors))
    answer = json.loads(out[-1])
    names = list(dict.fromkeys(each.host for each in _ordered(program, hosts)))
    entry = registry.Entry(**{**answer['entry'], 'ssh': host.ssh_argv() + [host.host],
                              'hosts': names})
    registry.register(entry)
    controller = detached.AttachedController(entry)
    print(f'Program {program.name!r} runs detached as {program_id}, supervised by pid '
          f'{entry.pid} on {entry.host}; node logs are in {answer["log_dir"]} there.\n'
          f'{detached.commands(program_id)}', file=sys.stderr, flush=True)
    return controller

