"""Moving a detached SSH program's supervision to another of its hosts.

A detached SSH program's supervisor runs on one of its hosts (`detach`). If that host is gone
for good (rebooted, powered off), its keeper cannot start a new supervisor there, so the
supervisor keeps what another host needs to take over on every host, with the agents:

- copies of its launch file and of its persisted state (`Mobility`): sent to each agent when
  it reaches it, then again when the state changed, at most every STATE_COPY_INTERVAL seconds;
  the agent keeps them in its directory with a script that starts a supervisor from them
  (`protocol.MOVE_SCRIPT`);
- where the nodes reach the coordinator: a file the agent keeps (`protocol.coordinator_endpoint`)
  rather than an address in the nodes' specs, so that nodes follow a supervisor elsewhere;
- a claim (an epoch, `protocol`): the agents take a newer supervisor's and refuse an older one,
  which then leaves (`leave`) without touching the nodes, so that two never act together.

`python -m launchpad.launch attach --recover PROGRAM --host HOST` on the launching machine
(`detached._recover_remote`) runs HOST's script over ssh: `python -m
launchpad.launch.supervisor move DIR` (`start_moved`) starts a keeper there from the copies,
whose supervisor re-adopts the nodes
(`launcher.readopt`): those running run on, not restarted; those of the lost host count as
ended with 255 once its agent stays out of reach for the supervisor grace, and their restart
policy decides.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from courier import serialization

from launchpad.launch import detached
from launchpad.launch.ssh import masters, protocol
from launchpad.observe import registry

STATE_COPY_INTERVAL = 2.0  # seconds between copies of a changed state to the agents


class SupervisionMovedError(RuntimeError):
    """An agent refused this supervisor's claim: a newer supervisor holds the program."""


def refusal_message(host: Any, refused: Dict[str, Any]) -> str:
    """Why a supervisor leaves: the agent on `host` answered its claim with `refused`."""
    return (f'the agent on {host} refused this supervisor: supervisor {refused["owner"]} '
            f'(epoch {refused["epoch"]}) supervises the program now; this one leaves it to it.')


class Mobility:
    """What lets a detached program's supervision move: the supervisor's claim on the agents,
    and the copies of its launch file and state it keeps with them, sent when it reaches an
    agent (`share`) and the state again once it changed (`refresh`, at most every
    STATE_COPY_INTERVAL seconds).

    Attributes:
      epoch: of its claim (`protocol`): 1 at launch, one above its state's when re-adopting.
      owner: names the supervisors of its run directory in its claim (its host and the
        directory): one its keeper starts again may claim what the one before claimed, even
        if that one died before its state said so.
    """

    def __init__(self, run_dir: str, last_state: Callable[[], Optional[bytes]]):
        self.epoch = 1
        self.owner = f'{socket.gethostname()}:{run_dir}'
        self._program_id = detached.read_header(run_dir)['program_id']
        with open(os.path.join(run_dir, detached.LAUNCH_FILE), 'rb') as f:
            self._launch = f.read()
        self._last_state = last_state
        self._sent: Optional[bytes] = None
        self._sent_at = 0.0

    @property
    def claim(self) -> Dict[str, Any]:
        return {'epoch': self.epoch, 'owner': self.owner}

    def share(self, connection, coordinator: str, run_dir: str) -> None:
        """Tells `connection`'s agent where its nodes reach the `coordinator` and where this
        supervisor's `run_dir` is (removed if none comes back), and sends it both copies."""
        connection.send('coordinator', {'address': coordinator, 'run_dir': run_dir})
        files = {protocol.LAUNCH_COPY: self._launch}
        state = self._last_state()
        if state is not None:
            files[protocol.STATE_COPY] = state
        connection.send('copy', {'program_id': self._program_id, 'files': files})

    def refresh(self, connections: List[Any]) -> None:
        """Sends the state to every agent if it changed since it last did, and long enough ago."""
        state = self._last_state()
        now = time.monotonic()
        if state is None or state is self._sent or now - self._sent_at < STATE_COPY_INTERVAL:
            return
        self._sent, self._sent_at = state, now
        body = {'program_id': self._program_id, 'files': {protocol.STATE_COPY: state}}
        for connection in connections:
            connection.send('copy', body)


def leave(run_dir: str, local_dir: str, connections: List[Any], why: str) -> None:
    """Ends this supervisor, fenced off by a newer one: its connections go without a word to
    the agents (the nodes run on), its master connections (`masters`), its run directory, its
    connections' `local_dir` and its registry entry go (the entry if still its own), and its
    keeper, seeing it exit 0, ends too."""
    logging.warning('%s', why)
    for connection in connections:
        connection.abandon()
    masters.end_all(run_dir)
    program_id = detached.read_header(run_dir)['program_id']
    for directory in (run_dir, local_dir):
        shutil.rmtree(directory, ignore_errors=True)
    try:
        own = json.loads((registry.directory() / f'{program_id}.json').read_text())
        if own.get('pid') == os.getpid():
            registry.unregister(program_id)
    except (OSError, ValueError):
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # pylint: disable=protected-access


def start_moved(directory: str) -> registry.Entry:
    """Starts a supervisor on this host from the copies in the agent `directory` (`python -m
    launchpad.launch.supervisor move DIR`); returns its registry entry once every node runs.
    Its claim's epoch is above any this agent took, so the agents take it over the old one's."""
    with open(os.path.join(directory, protocol.LAUNCH_COPY), 'rb') as f:
        header, payload = pickle.load(f)
    try:
        with open(os.path.join(directory, protocol.STATE_COPY), 'rb') as f:
            state = pickle.load(f)
    except FileNotFoundError:
        raise RuntimeError(f'no copy of the state of program {header["program_id"]} has reached '
                           'this host yet; try another host.') from None
    with open(os.path.join(directory, protocol.CLAIM_FILE)) as f:
        held = int(f.read().split()[0])
    # Two above what the agent holds: a supervisor that its old host's keeper starts again from
    # the state there claims at most one above, and is refused.
    state['ssh']['epoch'] = max(state['ssh'].get('epoch') or 0, held) + 1
    header['log_dir'] = detached.default_log_dir(header['program_id'])
    controller = detached.start_from(header, payload, serialization.cloudpickle_dumps(state),
                                     recoverable=True)
    return controller._entry  # pylint: disable=protected-access
