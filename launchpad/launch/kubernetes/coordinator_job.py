"""A detached Kubernetes program survives the loss of its coordinator pod (deleted, evicted, its
Kubernetes node lost), not only the death of the coordinator process (`readopt`).

  * The coordinator pod of a program no launcher follows (`CoordinatorSettings.recreates_pods`)
    is the pod of a Job (`job`): one pod at a time, `restartPolicy: OnFailure` (a dead coordinator
    process restarts in the same pod), and a new pod when the pod is lost, up to BACKOFF_LIMIT
    failures in all. Its pod keeps the hostname RUN-coordinator in the program's subdomain, so the
    nodes reach the new pod where they reached the old one once its DNS name follows it.
  * The node pods are owned by the Job, not by its pod, so that they outlive the pod (deleting the
    program still deletes them: the root owns the Job).
  * The program's state (`readopt`) is also kept in the Secret RUN-state (`STATE_KEY`, compressed),
    which a new pod's coordinator reads when its emptyDir is empty; it re-adopts the node pods
    from it, restarting none.
  * A pod being deleted gets SIGTERM: the coordinator stops the program only if the Job is gone
    too (the program was deleted, `pod_lost_only`); otherwise it exits without a word to the nodes,
    which wait for the next coordinator up to the supervisor grace, then stop with their notice
    (also what happens past the Job's back-off limit).

Runs on the launching machine (`job`, `state_secret`, `rbac_rules`) and in the coordinator pod.
"""
from __future__ import annotations

import base64
import copy
import zlib
from typing import Any, Dict, List, Mapping, Optional

from launchpad.launch.kubernetes import names
from launchpad.launch.kubernetes.api import KubernetesError

BACKOFF_LIMIT = 6  # failures of the coordinator (process deaths and lost pods) before the Job fails
STATE_KEY = 'state'  # the key of the Secret RUN-state's data
MAX_STATE_BYTES = 1_000_000  # a Secret holds at most 1 MiB


def state_secret_name(run: str) -> str:
    return f'{run}-state'


def job(pod: Mapping[str, Any]) -> Dict[str, Any]:
    """The Job whose pod is the coordinator pod `pod` (a Pod document: its name becomes the
    Job's, its hostname stays)."""
    meta = copy.deepcopy(dict(pod['metadata']))
    template = {'metadata': {'labels': dict(meta['labels'])}, 'spec': copy.deepcopy(pod['spec'])}
    return {'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': meta,
            'spec': {'backoffLimit': BACKOFF_LIMIT, 'template': template}}


def as_pod(document: Dict[str, Any]) -> Dict[str, Any]:
    """The coordinator's pod as `document` (its Pod, or its Job) makes it."""
    if document['kind'] != 'Job':
        return document
    return {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': document['metadata'],
            'spec': document['spec']['template']['spec']}


def state_secret(meta: Mapping[str, Any]) -> Dict[str, Any]:
    """The Secret RUN-state, empty until the coordinator writes the program's state there."""
    return {'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque', 'metadata': dict(meta),
            'data': {}}


def rbac_rules(run: str) -> List[Dict[str, Any]]:
    """What the coordinator pod's Role needs beside the pods: write its state, read its Job."""
    return [{'apiGroups': [''], 'resources': ['secrets'], 'verbs': ['get', 'patch'],
             'resourceNames': [state_secret_name(run)]},
            {'apiGroups': ['batch'], 'resources': ['jobs'], 'verbs': ['get'],
             'resourceNames': [f'{run}-coordinator']}]


def write_state(api, run: str, state: bytes) -> None:
    """Keeps `state` (the pickle `readopt` writes) in the Secret RUN-state; raises ValueError if
    it does not fit there, KubernetesError if the API refuses."""
    packed = zlib.compress(state, 6)
    if len(packed) > MAX_STATE_BYTES:
        raise ValueError(f'the program\'s state takes {len(packed) / 2**20:.1f} MiB compressed, '
                         'more than a Secret holds')
    api.patch_secret(state_secret_name(run), {STATE_KEY: base64.b64encode(packed).decode()})


def read_state(api, run: str) -> Optional[bytes]:
    """The state kept in the Secret RUN-state (a pickle), or None if none was written yet."""
    secret = api.read('Secret', state_secret_name(run))
    data = ((secret or {}).get('data') or {}).get(STATE_KEY)
    return zlib.decompress(base64.b64decode(data)) if data else None


def pod_lost_only(api, job_name: str) -> bool:
    """Whether the Job `job_name` lives on (it is neither gone nor being deleted): this pod's
    SIGTERM is then the loss of the pod only, not the end of the program. If the API cannot
    say, the program is not stopped (its nodes stop after the grace if no pod follows)."""
    try:
        found = api.read('Job', job_name)
    except KubernetesError as e:
        print(f'cannot read the Job {job_name} ({e}); leaving the program to the next pod',
              flush=True)
        return True
    return found is not None and not found['metadata'].get('deletionTimestamp')


def coordinator_pod_name(api, run: str) -> Optional[str]:
    """The name of the coordinator pod that runs now (a Job's pods have generated names), or
    None if none does."""
    pods = [pod for pod in api.list_pods(names.selector(run, role='coordinator'))
            if not pod['metadata'].get('deletionTimestamp')
            and (pod.get('status') or {}).get('phase', 'Running') == 'Running']
    return pods[-1]['metadata']['name'] if pods else None


def recovery(api, job_name: str) -> str:
    """What `attach --recover` says of a detached program whose coordinator pod is the Job
    `job_name`'s: Kubernetes makes its pods, nothing is started here."""
    found = api.read('Job', job_name)
    if found is None:
        return (f'Its coordinator Job {job_name} is gone (the program was deleted); its nodes '
                'stop within the supervisor grace.')
    status = found.get('status') or {}
    conditions = {c['type']: c for c in status.get('conditions') or [] if c.get('status') == 'True'}
    failed, limit = status.get('failed', 0), found['spec'].get('backoffLimit', BACKOFF_LIMIT)
    if 'Complete' in conditions:
        return f'Its coordinator Job {job_name} has completed: the program ended.'
    if 'Failed' in conditions:
        return (f'Its coordinator Job {job_name} failed ({conditions["Failed"].get("reason")}): '
                f'its coordinator failed {failed} times, more than its back-off limit '
                f'({limit}). The nodes stop after the supervisor grace; launch the program '
                'again.')
    running = coordinator_pod_name(api, job_name[:-len('-coordinator')])
    lost = (f'its coordinator failed or lost its pod {failed} time{"s" * (failed != 1)} '
            f'(back-off limit {limit})'
            if failed else 'its coordinator pod was never lost')
    return (f'Kubernetes supervises it: {lost}; '
            + (f'its pod {running} runs now (it re-adopts the nodes from the state kept in '
               f'the Secret {job_name[:-len("-coordinator")]}-state).' if running else
               'no pod of it runs right now: the Job makes the next one after its back-off.'))


def recovery_of_entry(entry) -> Optional[str]:
    """`recovery` for a registered program (`registry.Entry`) reached through its coordinator
    Job's pod, else None (`detached` recovers other programs)."""
    relay = entry.relay or []
    if len(relay) < 9 or relay[3] != 'launchpad-exec' or not relay[7].startswith('job/'):
        return None
    from launchpad.launch.kubernetes.api import KubernetesApi  # pylint: disable=import-outside-toplevel
    kubeconfig, context, namespace, job_name = relay[4], relay[5], relay[6], relay[7][4:]
    return recovery(KubernetesApi(namespace, kubeconfig=kubeconfig, context=context or None),
                    job_name)
