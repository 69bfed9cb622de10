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

Where each part runs:

  on the launching machine: `hosts` (SshHost, SshHosts), `launcher` (SshLauncher, SshOptions and
    the runner), `connection` (one ssh connection and its agent's messages), `preflight`
    (SshPreflightError and the diagnosis of each host);
  on each host: `agent`, started as `python -m launchpad.launch.ssh.agent WORKDIR`, and for
    a detached program's new supervisor `launchpad.observe.relay --plain`, which reaches that
    agent again;
  on both: `protocol`, the names, timeouts and message framing the two sides share; a detached
    program's `detach` (its supervisor on one of the hosts) and `move` (that supervision
    moving to another host);
  on a detached program's supervisor's host: `masters`, the ssh master connections to the
    hosts, which outlive a supervisor so that the next one opens no new connection.

This package imports the launcher side only; the agent is never imported here, so that it runs
as a module without a second copy of itself.
"""
from launchpad.launch.ssh.hosts import SshHost, SshHosts
from launchpad.launch.ssh.launcher import SshLauncher, SshOptions
from launchpad.launch.ssh.preflight import SshPreflightError

__all__ = ['SshHost', 'SshHosts', 'SshLauncher', 'SshOptions', 'SshPreflightError']
