"""The coordinator pod's `Runner` for a program that no launcher follows (a detached launch, or
manifests applied with kubectl): the controller runs in the coordinator pod and applies the
nodes' restart policies itself, through the API.

`InClusterRunner` lists the program's node pods for the controller (an ended container is an exit
code; a pod seen once and then gone, e.g. deleted or evicted, is a kill), creates a failed node's
pod again from the manifest the launcher left in the ConfigMap RUN-pods (mounted at
`names.PODS_DIR`), and deletes the pods of nodes still running after a stop's notice period. The
coordinator pod's service account needs `get`, `list` and `create` on pods, and `delete` on the
node pods by name (`manifests.coordinator_rbac_manifests`).

Runs in the coordinator pod (`pod.py`), on the controller's monitor thread.
"""
from __future__ import annotations

import base64
import copy
import json
import logging
import os
import signal
import time
import zlib
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

from launchpad.launch.runner import Runner
from launchpad.launch.kubernetes import names
from launchpad.launch.kubernetes.api import KubernetesError, recreate_pod, terminated

POD_MANIFESTS_KEY = 'pods'  # the key of RUN-pods' binaryData, and the file it is mounted as


def pack_pod_manifests(pods: Mapping[str, Mapping[str, Any]]) -> str:
    """Pod name -> its document, as the ConfigMap RUN-pods holds it (zlib-compressed JSON in
    base64: node pods differ little, so a thousand fit in its 1 MiB)."""
    return base64.b64encode(zlib.compress(json.dumps(pods).encode(), 9)).decode()


def read_pod_manifests(path: str = os.path.join(names.PODS_DIR, POD_MANIFESTS_KEY)
                       ) -> Dict[str, Dict[str, Any]]:
    """The pod manifests `pack_pod_manifests` packed, from the ConfigMap's file in this pod."""
    with open(path, 'rb') as f:
        return json.loads(zlib.decompress(f.read()))


def exit_code(pod: Mapping[str, Any]) -> Optional[int]:
    """The node's exit code once its pod has ended, else None (1 if it ended before the node
    container ran, e.g. an init container failed)."""
    ended = terminated(pod, names.NODE_CONTAINER)
    if ended is not None:
        return int(ended.get('exitCode', 1))
    if (pod.get('status') or {}).get('phase') in ('Failed', 'Succeeded'):
        return 1
    return None


class InClusterRunner(Runner):
    """The node pods of a program, for a controller in its coordinator pod (see the module
    docstring).

    `api`: a `KubernetesApi` of the program's namespace; `manifests`: pod name -> its document
    as the launch created it; `node_pods`: node name -> its pod name.
    """

    POLL_SECONDS = 1.0

    def __init__(self, api, run: str, manifests: Mapping[str, Mapping[str, Any]],
                 node_pods: Mapping[str, str], *, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._run = run
        self._manifests = dict(manifests)
        self._node_pods = dict(node_pods)
        self._clock = clock
        self._codes: Dict[str, Optional[int]] = {name: None for name in node_pods}
        self._ended: Dict[str, str] = {}  # node -> how its pod ended, for its failure message
        self._seen: set = set()  # nodes whose pod the API listed since it was (re)created
        self._listed_at: Optional[float] = None
        self._unlisted = False  # the last listing failed (said once)
        self._owners: Optional[list] = None  # the coordinator pod's owner references

    def poll(self) -> Dict[str, Optional[int]]:
        """Node name -> its pod's exit code (None while it runs); lists the pods at most once
        per POLL_SECONDS. A pod not listed yet (the launcher may still be creating it) runs."""
        now = self._clock()
        if self._listed_at is not None and now - self._listed_at < self.POLL_SECONDS:
            return dict(self._codes)
        self._listed_at = now
        try:
            listed = self._api.list_pods(names.selector(self._run, role='node'))
        except KubernetesError as e:  # e.g. the API server restarts: the pods run on
            if not self._unlisted:
                logging.warning('Cannot list the node pods (%s); trying again.', e)
            self._unlisted = True
            return dict(self._codes)
        self._unlisted = False
        pods = {pod['metadata']['name']: pod for pod in listed}
        for name, pod_name in self._node_pods.items():
            if self._codes[name] is not None:
                continue
            pod = pods.get(pod_name)
            if pod is None:
                if name in self._seen:
                    self._codes[name] = -signal.SIGKILL
                    self._ended[name] = f'its pod {pod_name} was deleted'
                continue
            self._seen.add(name)
            self._codes[name] = exit_code(pod)
            if self._codes[name] is not None:
                ended = terminated(pod, names.NODE_CONTAINER) or {}
                self._ended[name] = (f'its pod {pod_name} ended ({ended.get("reason") or "Error"}'
                                     f', exit code {self._codes[name]})')
        return dict(self._codes)

    def last_output(self, name: str) -> str:
        """How the node's pod ended (the coordinator pod does not read pod logs)."""
        return self._ended.get(name, '')

    def restart(self, name: str) -> None:
        """Creates the node's pod again from its manifest (same name, so same DNS name), owned
        as the coordinator pod is, once the old one is gone."""
        pod_name = self._node_pods[name]
        document = copy.deepcopy(self._manifests[pod_name])
        owners = self._owner_references()
        if owners:
            document['metadata']['ownerReferences'] = owners
        recreate_pod(self._api, document, clock=self._clock)
        self._codes[name] = None
        self._ended.pop(name, None)
        self._seen.add(name)  # created: from now on, its absence is a deletion
        print(f'created the pod {pod_name} of {name} again', flush=True)

    def kill(self, names_: Sequence[str]) -> None:
        """Deletes the named nodes' pods at once."""
        for name in names_:
            self._api.delete('Pod', self._node_pods[name], grace_period_seconds=0)

    def _owner_references(self) -> list:
        if self._owners is None:
            coordinators = self._api.list_pods(names.selector(self._run, role='coordinator'))
            self._owners = [dict(owner) for pod in coordinators[:1]
                            for owner in pod['metadata'].get('ownerReferences') or []]
        return self._owners
