"""What the launcher and the host agent share: names, timeouts and the framing of their messages.

Imported on both sides: by the launcher on the launching machine and by the agent
(`launchpad.launch.ssh.agent`) on each host. It imports neither side.

The agent runs as the primary session of the launch's ssh connection to a host, and the two talk
over that session's standard streams:

- launcher -> agent (the agent's stdin): commands, each an 8-byte big-endian length and a pickle
  of `(kind, body)`: `('files', {'files': {name: bytes}, 'start': [index, ...], 'grace': s})`
  writes the node specs and forks the nodes listed in `start`; `('kill', [index, ...] or None)`
  kills nodes; `('start', [index, ...])` forks ended nodes again (restarts, after killing what is
  left of them); `('ping', None)` is the heartbeat; `('close', None)`: the launcher is done
  (the agent ends what is left and removes its directory); `('resume', None)`: a new
  supervisor of a detached program is ready for the events it missed. A detached program's
  supervisor also sends `('claim', {'epoch': n, 'owner': str})` first (see below),
  `('coordinator', address)`, where the agent's nodes reach the coordinator from now on
  (COORDINATOR_FILE), and `('copy', {'program_id': id, 'files': {name: bytes}})`, its launch
  file and persisted state, which a supervisor started on this host from them takes over with
  (MOVE_SCRIPT).
- agent -> launcher (the agent's stdout): events, each a line `AGENT_LINE + json`, followed by
  `size` bytes of node output for an `output` event. Events: `hello` (the preflight facts, see
  `agent.main`), `ready` (specs written and nodes forked), `output` (`node`, `size`), `exited`
  (`node`, `code`), `killed` and `closed` (the agent is done and removed its directory). Lines
  without the prefix are not ours (e.g. printed by a login script) and are only logged.

A detached program's agent (`--detached`) outlives its supervisor's session: the session only
relays to the agent's socket (`launchpad.observe.relay`), and a new supervisor reaches it there
with `relay_argv`. It then says hello again, with `nodes` (index -> exit code, or None while the
node runs), and after `resume` sends the events it kept meanwhile.

Fencing: only one supervisor acts on a detached program's agents. Every supervisor claims
them with an epoch one above the state it started from; an agent takes a claim whose epoch is
above the last it took, or equal from the same owner (a supervisor reaching it again, or the
next one its keeper started on the same host), says `refused` (with the new claim's `epoch`
and `owner`) to the connection it had and drops it; it answers any other claim with `refused`
(the claim it holds) and closes that connection. A supervisor that is refused leaves without
touching the nodes: supervision has moved on (`attach --recover --host`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import struct
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from launchpad.process import spec as specs

# The module the agent runs as: `python -m AGENT_MODULE WORKDIR`.
AGENT_MODULE = 'launchpad.launch.ssh.agent'

# Seconds a host gets, after ssh connected, to start the agent and answer the preflight.
AGENT_START_TIMEOUT = 30.0

# The launcher writes to every agent at least this often; an agent that hears nothing for
# LAUNCHER_SILENCE_TIMEOUT seconds takes the launcher for gone (as when its input ends), which
# also covers a network that went away without closing the connection. A host cut off the
# network for less rides it out: its agent, its ssh connection and its nodes (which cannot
# reach the coordinator meanwhile) wait that long, and TCP's backoff can add half again to a
# cut before the first packet gets through.
HEARTBEAT_INTERVAL = 2.0
LAUNCHER_SILENCE_TIMEOUT = 30.0
SERVER_ALIVE_INTERVAL = 5  # ssh's keepalive: it gives up after LAUNCHER_SILENCE_TIMEOUT

DIR_KIND = 'ssh'  # launchpad.process.tempdirs' kind of those directories
DIR_PREFIX = 'launchpad-ssh-'  # of the private directory on each host and the launcher's own
SOCKET_NAME = 'agent.sock'  # a detached program's agent listens here, in its private directory
PENDING_LIMIT = 16 << 20  # bytes of node output an agent keeps for a supervisor to come

# In a detached program's agent directory: where its nodes reach the coordinator now
# (`coordinator_endpoint`), copies of the supervisor's launch file and state, the claim the agent
# holds ('EPOCH OWNER'), and MOVE_SCRIPT.format(id=...), which starts a supervisor on this host
# from those copies (`python -m launchpad.launch attach --recover PROGRAM --host HOST`).
COORDINATOR_FILE = 'coordinator'
LAUNCH_COPY, STATE_COPY, CLAIM_FILE = 'launch.pkl', 'state.pkl', 'claim'
MOVE_SCRIPT = 'move-{id}'
MOVE_ARGV = ['-m', 'launchpad.launch.supervisor', 'move']  # + the agent's directory
# On a host, the shell words that match the move scripts of program {id} of every agent there.
MOVE_SCRIPTS = '"${{TMPDIR:-/tmp}}"/' + DIR_PREFIX + '*/' + MOVE_SCRIPT

AGENT_LINE = b'LPAGENT '
NODE_ENV = 'LAUNCHPAD_SSH_NODE'  # marks every process of a node (and its children) on a host

_LENGTH = struct.Struct('>Q')


def agent_argv(python: str, detached: bool = False) -> List[str]:
    """The command line that starts the agent with `python` (the working directory follows);
    `detached`: one that outlives its session (a detached program's)."""
    return [python, '-m', AGENT_MODULE] + (['--detached'] if detached else [])


def relay_argv(python: str, hello: Mapping[str, Any]) -> List[str]:
    """The command line that reaches again the detached agent that said `hello`."""
    return [python, f'{hello["launchpad"]}/observe/relay.py', '--plain',
            f'{hello["directory"]}/{SOCKET_NAME}']


def spec_name(index: int) -> str:
    """The file name of node `index`'s spec in the private directory."""
    return f'{index}.spec'


def node_marker(directory: str, index: int) -> str:
    """The value of NODE_ENV in every process of node `index` of the private `directory`."""
    return f'{directory}/{index}'


def node_command(directory: str, index: int, python: Optional[str] = None,
                 base_env: Optional[Mapping[str, str]] = None) -> Tuple[List[str], Dict[str, str]]:
    """The command line and environment of node `index` on a host: the worker on its spec in
    the private `directory`, the node marked with NODE_ENV (`base_env`, default ours, below)."""
    argv = specs.worker_argv(f'{directory}/{spec_name(index)}', python)
    env = specs.node_environment(base=base_env, extra={NODE_ENV: node_marker(directory, index)})
    return argv, env


def coordinator_endpoint() -> str:
    """Where a detached program's node reaches its coordinator: what its host's agent was
    told last (COORDINATOR_FILE). Its spec carries this function instead of an address, which
    courier calls again once the address it gave stopped answering, so that the nodes follow
    their supervision to another host."""
    directory = os.path.dirname(os.environ[NODE_ENV])
    with open(os.path.join(directory, COORDINATOR_FILE)) as f:
        return f.read().strip()


def write_atomically(path: str, data: bytes) -> None:
    """Writes `data` to `path`, readable by this user only, whole or not at all."""
    temporary = f'{path}.tmp'
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'wb') as f:
        f.write(data)
    os.replace(temporary, path)


def spec_fields() -> List[str]:
    """The fields of a node spec: the two sides' launchpad versions match if theirs do."""
    return [field.name for field in dataclasses.fields(specs.WorkerSpec)]


def pack_command(kind: str, body: Any) -> bytes:
    """A launcher -> agent command, framed."""
    data = pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


def unpack_commands(buffer: bytearray) -> Iterator[Tuple[str, Any]]:
    """Takes each complete command off the front of `buffer` (what the agent read so far)."""
    while len(buffer) >= _LENGTH.size:
        (size,) = _LENGTH.unpack(buffer[:_LENGTH.size])
        end = _LENGTH.size + size
        if len(buffer) < end:
            return
        kind, body = pickle.loads(buffer[_LENGTH.size:end])
        del buffer[:end]
        yield kind, body


def pack_event(message: Mapping[str, Any], data: bytes = b'') -> bytes:
    """An agent -> launcher event line, followed by `data` (whose size the message gives)."""
    return AGENT_LINE + json.dumps(message).encode() + b'\n' + data


def unpack_event(line: bytes) -> Optional[dict]:
    """The event of a line the agent wrote, or None if the line is not an event."""
    if not line.startswith(AGENT_LINE):
        return None
    return json.loads(line[len(AGENT_LINE):])
