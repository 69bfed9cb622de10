"""A detached Kubernetes program whose coordinator dies (SIGKILL, out of memory) and comes back.

The coordinator pod of a program no launcher follows (`CoordinatorSettings.recreates_pods`)
has `restartPolicy: OnFailure`, so the kubelet starts its container again when the coordinator
dies, in the same pod: same name, same address, so the nodes reach the new one where they
reached the old one. The node pods run on meanwhile (calls between nodes go on, their reports
wait), for up to the supervisor grace (`KubernetesConfig.supervisor_grace`, their
`WorkerSpec.coordinator_grace`), after which they stop with their notice period.

While it runs, the coordinator keeps the program's state in the pod's emptyDir at `STATE_DIR`,
in the format and with the writer of the local_mp and SSH supervisors (`supervisor.Persister`):
the coordinator (every node's state, restarts, addresses, metrics, removals), the node pods
it made and knows (`InClusterRunner.state`), the scaler with its log, and the program with
the nodes added to it (`in_cluster.Growth`). A restarted container reads it (`read_state`)
and re-adopts the running node pods from it (`resume`): it creates none of them again, and
their restart budgets and group sizes go on from where they were.

Runs in the coordinator pod (`pod.py`). Not covered: the loss of the coordinator pod itself
(its Kubernetes node lost, the pod deleted): nothing creates it again, and its node pods,
which it owns, go with it.
"""
from __future__ import annotations

import base64
import os
import pickle
from typing import Any, Dict, Optional

from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import in_cluster

STATE_FILE = 'state.pkl'  # the supervisors' name (`supervisor.STATE_FILE`)


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATE_FILE)


def read_state(state_dir: Optional[str]) -> Optional[Dict[str, Any]]:
    """The state an earlier coordinator container of this pod kept in `state_dir`, or None if
    there is none (the pod's first coordinator)."""
    if state_dir is None or not os.path.exists(state_path(state_dir)):
        return None
    try:
        with open(state_path(state_dir), 'rb') as f:
            state = pickle.load(f)
        if state.get('program'):
            state['growth'] = in_cluster.unpack_growth(bytes(state['program']))
    except Exception as e:  # pylint: disable=broad-except  (a new start beats a crash loop)
        print(f'cannot re-adopt the nodes from the state an earlier coordinator kept ({e!r}); '
              'starting anew: running nodes join again, their restart counts start from 0',
              flush=True)
        return None
    return state


def resume(runner: in_cluster.InClusterRunner, state: Dict[str, Any]):
    """The coordinator that `state` (`read_state`) holds, with `runner` re-adopting the node
    pods it knew; the program it grew, if it kept one, replaces the launch's."""
    runner.restore(state['runner'])
    if state.get('growth') is not None:
        runner.growth = state['growth']
    return state['coordinator']


def keep_state(state_dir: str, controller: Controller, runner: in_cluster.InClusterRunner,
               scaler: Any = None) -> None:
    """Makes `runner` write the program's state to `state_dir` as it changes; `scaler`: one
    that a re-adopted state held (its log goes on)."""
    # (Imported only now: the coordinator serves the nodes first, which wait for it.)
    from launchpad.launch import supervisor  # pylint: disable=import-outside-toplevel

    class GrowthPersister(supervisor.Persister):
        """The supervisors' `Persister`, whose program is the coordinator pod's `Growth`."""

        @staticmethod
        def pickle_program(program) -> bytes:
            return b'' if program is None else base64.b64decode(in_cluster.pack_growth(program))

    # pylint: disable=protected-access  (the supervisors persist the scaler so too)
    if scaler is not None:
        controller._elastic._scaler = scaler
    persist = GrowthPersister(state_path(state_dir), runner.growth,
                              lambda: {'scaler': controller._elastic._scaler})
    coordinator = controller.coordinator
    runner.persist = lambda: persist(lambda: {'coordinator': coordinator, 'commands': {},
                                              'runner': runner.state()})
