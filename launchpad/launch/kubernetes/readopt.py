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

The coordinator also keeps that state in the Secret RUN-state, from which the next pod of its
Job re-adopts the nodes when the pod itself is lost (`coordinator_job`).

Runs in the coordinator pod (`pod.py`).
"""
from __future__ import annotations

import base64
import os
import pickle
from typing import Any, Callable, Dict, Optional

from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import coordinator_job, in_cluster

STATE_FILE = 'state.pkl'  # the supervisors' name (`supervisor.STATE_FILE`)


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATE_FILE)


def read_state(state_dir: Optional[str], api: Any = None,
               run: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The state an earlier coordinator container of this pod kept in `state_dir`, else (with
    `api`) the one an earlier pod of the program `run` kept in its Secret, or None if there is
    none (the program's first coordinator)."""
    try:
        if state_dir is not None and os.path.exists(state_path(state_dir)):
            with open(state_path(state_dir), 'rb') as f:
                data = f.read()
        elif api is not None:
            data = coordinator_job.read_state(api, run)
            if data is None:
                return None
            print('reading the state an earlier coordinator pod kept in the Secret '
                  f'{coordinator_job.state_secret_name(run)}', flush=True)
        else:
            return None
        state = pickle.loads(data)
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
               scaler: Any = None, secret: Optional[Callable[[bytes], None]] = None) -> None:
    """Makes `runner` write the program's state to `state_dir` as it changes, and give it to
    `secret` (which keeps it outside the pod: `coordinator_job.write_state`); `scaler`: one
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
    kept = [None, '']  # the state given to `secret` last, and its last error

    def keep() -> None:
        persist(lambda: {'coordinator': coordinator, 'commands': {}, 'runner': runner.state()})
        last = persist.last
        if secret is None or last is None or last is kept[0]:
            return
        try:
            secret(last)
        except Exception as e:  # pylint: disable=broad-except  (tried again at the next change)
            if str(e) != kept[1]:
                print(f'cannot keep the program\'s state outside this pod ({e}): losing the pod '
                      'would leave its nodes without a coordinator', flush=True)
            kept[1] = str(e)
        else:
            kept[:] = [last, '']

    runner.persist = keep
