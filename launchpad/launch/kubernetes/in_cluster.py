"""The coordinator pod's `Runner` for a program that no launcher follows (a detached launch, or
manifests applied with kubectl): the controller runs in the coordinator pod and applies the
nodes' restart policies itself, grows and shrinks the elastic groups and runs the scaling policy,
through the API.

`InClusterRunner` lists the program's node pods for the controller (an ended container is an exit
code; a pod seen once and then gone, e.g. deleted or evicted, is a kill), creates a failed node's
pod again from the manifest the launcher left in the ConfigMap RUN-pods (mounted at
`names.PODS_DIR`), and deletes the pods of nodes still running after a stop's notice period.
With the program and the launch's plan from that ConfigMap (`Growth`), it creates the spec
ConfigMap and pod of a node added to an elastic group, made as the launch made the group's pods
(`LaunchPlan.add_node`), under one of the names the launch set aside for it
(`LaunchPlan.added_pods`), and deletes a removed node's pod once it ended. Each deletion on
behalf of a node names the uid of the node's pod (a precondition): a name set aside for added
nodes passes from a removed node to a newer one, whose pod a late deletion for the removed
node must not hit. Node pods are owned by the coordinator pod's Job (`coordinator_job`), so that
they outlive the pod, and deleting the program deletes them.

The coordinator pod's service account needs `get`, `list` and `create` on pods, and `delete` on
the node pods by name; to grow groups, also `create` on ConfigMaps and `delete` on the added
nodes' spec ConfigMaps by name; to keep its state and see its Job, `get` and `patch` on the
Secret RUN-state and `get` on the Job (`manifests.coordinator_rbac_manifests`).

Runs in the coordinator pod (`pod.py`), on the controller's monitor thread.
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import json
import logging
import os
import pickle
import signal
import time
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from courier import serialization

from launchpad.launch.runner import Runner
from launchpad.launch.kubernetes import names
from launchpad.launch.kubernetes.api import KubernetesError, recreate_pod, terminated
from launchpad.launch.kubernetes.pod_logs import PodLogs

POD_MANIFESTS_KEY = 'pods'  # the key of RUN-pods' binaryData, and the file it is mounted as
GROWTH_KEY = 'growth'  # the same for the pickled `Growth`


@dataclasses.dataclass
class Growth:
    """What the coordinator pod grows and shrinks the program with: the program (its groups,
    node factories and scaling policy), the launch's `LaunchPlan` (without its documents: it
    makes a new node's pods as the launch made the others) and the groups' resources."""
    program: Any
    plan: Any
    resources: Dict[str, Any]


def pack_growth(growth: Growth) -> str:
    """`growth` as RUN-pods holds it (zlib-compressed cloudpickle, in base64); the plan goes
    without its documents, which the coordinator pod does not need, and the program without
    the controller running it (the coordinator pod keeps its grown program so: `readopt`)."""
    documents, growth.plan.documents = growth.plan.documents, []
    controller, growth.program.controller = getattr(growth.program, 'controller', None), None
    try:
        return base64.b64encode(zlib.compress(serialization.cloudpickle_dumps(growth))).decode()
    finally:
        growth.plan.documents, growth.program.controller = documents, controller


def unpack_growth(packed: bytes) -> Growth:
    """The `Growth` that `pack_growth` packed (as a ConfigMap's file holds it: decoded)."""
    return pickle.loads(zlib.decompress(packed))


def read_growth(path: str = os.path.join(names.PODS_DIR, GROWTH_KEY)) -> Optional[Growth]:
    """The `Growth` the launch packed, from the ConfigMap's file in this pod; None if it did
    not fit there."""
    if not os.path.exists(path):
        return None
    with open(path, 'rb') as f:
        return unpack_growth(f.read())


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


def _node_of(pod: Mapping[str, Any]) -> Optional[str]:
    """The node a pod runs, as its annotation names it (None without one)."""
    return ((pod.get('metadata') or {}).get('annotations') or {}).get(names.NODE_NAME_ANNOTATION)


class InClusterRunner(Runner):
    """The node pods of a program, for a controller in its coordinator pod (see the module
    docstring).

    `api`: a `KubernetesApi` of the program's namespace; `manifests`: pod name -> its document
    as the launch created it; `node_pods`: node name -> its pod name; `growth` (an attribute
    too): what adds nodes to elastic groups (None: none can be added); `job`: the coordinator
    pod's Job, which owns the node pods (`coordinator_job`), else the pod does.
    """

    @property
    def api(self):
        """The `KubernetesApi` of the program's namespace."""
        return self._api

    POLL_SECONDS = 1.0

    def __init__(self, api, run: str, manifests: Mapping[str, Mapping[str, Any]],
                 node_pods: Mapping[str, str], *, growth: Optional[Growth] = None,
                 clock: Callable[[], float] = time.monotonic, job: Optional[str] = None):
        self._api = api
        self._job = job
        self._run = run
        self._manifests = dict(manifests)
        self._node_pods = dict(node_pods)
        self.growth = growth
        self._clock = clock
        self.output = PodLogs(api, self._node_pods.get)  # (`logs`, `attach`, the dashboard)
        self._added: Dict[str, str] = {}  # pod of a node added here -> the node, until deleted
        self._leaving: set = set()  # removed nodes whose pods are deleted once they ended
        self._codes: Dict[str, Optional[int]] = {name: None for name in node_pods}
        self._ended: Dict[str, str] = {}  # node -> how its pod ended, for its failure message
        self._seen: set = set()  # nodes whose pod the API listed since it was (re)created
        self._uids: Dict[str, str] = {}  # node -> the uid of its pod, as listed or created
        self._listed_at: Optional[float] = None
        self._unlisted = False  # the last listing failed (said once)
        self._owners: Optional[list] = None  # the coordinator pod's owner references
        # Called on each poll to keep what a restarted coordinator container re-adopts from.
        self.persist: Optional[Callable[[], None]] = None

    def state(self) -> Dict[str, Any]:
        """What a restarted coordinator container needs of this runner to re-adopt the node
        pods (`restore`): their names and manifests, and what it knows of how they ended."""
        return {'manifests': self._manifests, 'node_pods': self._node_pods,
                'added': self._added, 'leaving': self._leaving, 'codes': self._codes,
                'ended': self._ended, 'seen': self._seen, 'uids': self._uids}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Takes over the node pods an earlier coordinator container of this pod ran (`state`
        is its `state()`); creates none of them again."""
        for key, value in state.items():
            setattr(self, f'_{key}', copy.deepcopy(value))

    def poll(self) -> Dict[str, Optional[int]]:
        """Node name -> its pod's exit code (None while it runs); lists the pods at most once
        per POLL_SECONDS. A pod not listed yet (the launcher may still be creating it) runs."""
        self._persist()
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
            if pod is not None and _node_of(pod) not in (None, name):
                pod = None  # the name passed to a newer node: this node's pod is gone
            if pod is None:
                if name in self._seen:
                    self._codes[name] = -signal.SIGKILL
                    self._ended[name] = f'its pod {pod_name} was deleted'
                continue
            self._seen.add(name)
            self._uids[name] = pod['metadata'].get('uid')
            self._codes[name] = exit_code(pod)
            if self._codes[name] is not None:
                ended = terminated(pod, names.NODE_CONTAINER) or {}
                self._ended[name] = (f'its pod {pod_name} ended ({ended.get("reason") or "Error"}'
                                     f', exit code {self._codes[name]})')
        for name in [name for name in self._leaving if self._codes.get(name) is not None]:
            self._forget(name)
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
        self._uids[name] = recreate_pod(self._api, document, clock=self._clock)['metadata']['uid']
        self._codes[name] = None
        self._ended.pop(name, None)
        self._seen.add(name)  # created: from now on, its absence is a deletion
        self._persist()
        print(f'created the pod {pod_name} of {name} again', flush=True)

    def kill(self, names_: Sequence[str]) -> None:
        """Deletes the named nodes' pods at once (only their own: `_delete_pod`)."""
        for name in names_:
            self._delete_pod(name)

    def check_add(self, label: str) -> None:
        """Raises, saying why, unless a node can be added to group `label` here now."""
        if self.growth is None:
            raise NotImplementedError(
                'its coordinator pod has not the program to make nodes from (it did not fit in '
                'a ConfigMap)')
        pods = self.growth.plan.added_pods.get(label)
        if pods is None:
            raise ValueError(
                f'Group {label!r} cannot grow without a launcher: only elastic groups with a '
                'make_node and a max_size have pod names in the coordinator pod\'s Role.')
        self._free_pod(label)

    def add_executable(self, label: str, executable, policy) -> None:
        """Creates the spec ConfigMap and the pod of a node added to group `label`, made as the
        launch made the group's pods, under a free name of those set aside for the group (a
        former member's objects of that name are deleted first), owned by the coordinator
        pod; its first init container joins it to the coordinator."""
        pod_name = self._free_pod(label)
        plan = self.growth.plan
        documents = plan.add_node(label, executable, policy, pod_name=pod_name)
        configmaps = [d for d in documents if d['kind'] == 'ConfigMap']
        if len(configmaps) > 1:
            plan.forget(executable.name)
            raise ValueError(
                f'Node {executable.name} takes {len(configmaps)} ConfigMaps once pickled; a node '
                'that the coordinator pod adds must fit in one (1 MB). Pass less data as node '
                'arguments: build large data into the image, or load it from a volume.')
        pod = documents[-1]
        try:
            for document in documents:
                document['metadata']['ownerReferences'] = self._owner_references()
            self._api.delete('ConfigMap', configmaps[0]['metadata']['name'])  # a former member's
            self._api.create(configmaps[0])
            uid = recreate_pod(self._api, pod, clock=self._clock)['metadata']['uid']
        except BaseException:
            plan.forget(executable.name)
            raise
        self._manifests[pod_name] = pod
        self._node_pods[executable.name] = pod_name
        self._added[pod_name] = executable.name
        self._codes[executable.name] = None
        self._uids[executable.name] = uid
        self._seen.add(executable.name)
        self._persist()
        print(f'created the pod {pod_name} of {executable.name}, added to group {label}',
              flush=True)

    def remove(self, name: str) -> None:
        """Node `name` is removed (the coordinator here tells it); its pod is deleted once it
        ended."""
        self._leaving.add(name)

    def _persist(self) -> None:
        if self.persist is not None:
            self.persist()

    def _free_pod(self, label: str) -> str:
        pods = self.growth.plan.added_pods[label]
        free = [pod for pod in pods if pod not in self._added]
        if not free:
            raise RuntimeError(
                f'Group {label!r} has no pod name left for another node: the {len(pods)} set '
                'aside for it (its max_size) are taken by nodes added to it, some of them '
                'perhaps removed but not ended yet. Try again after the notice period.')
        return free[0]

    def _forget(self, name: str) -> None:
        """Deletes removed node `name`'s pod (and spec ConfigMap, if added here): it ended."""
        self._leaving.discard(name)
        pod_name = self._node_pods[name]
        try:
            self._delete_pod(name)
            if self._added.pop(pod_name, None) is not None:
                self._api.delete('ConfigMap', f'{pod_name}-spec-0')
                self.growth.plan.forget(name)
        except KubernetesError as e:
            logging.warning('Could not delete the pod of removed node %s: %s', name, e)
        else:
            print(f'deleted the pod {pod_name} of removed node {name}', flush=True)

    def _delete_pod(self, name: str) -> None:
        """Deletes node `name`'s pod at once: the one of its uid if known, so never the pod of
        a newer node that took the name over."""
        self._api.delete('Pod', self._node_pods[name], grace_period_seconds=0,
                         **({'uid': self._uids[name]} if self._uids.get(name) else {}))

    def _owner_references(self) -> List[Dict[str, Any]]:
        """The coordinator pod (or its Job), as the owner of the node pods it creates."""
        if self._owners is None and self._job is not None:
            job = self._api.read('Job', self._job) or {'metadata': {}}
            self._owners = [{'apiVersion': 'batch/v1', 'kind': 'Job', 'name': self._job,
                             'uid': job['metadata'].get('uid')}]
        if self._owners is None:
            coordinators = self._api.list_pods(names.selector(self._run, role='coordinator'))
            self._owners = [{'apiVersion': 'v1', 'kind': 'Pod', 'name': pod['metadata']['name'],
                             'uid': pod['metadata']['uid']} for pod in coordinators[:1]]
        return [dict(owner) for owner in self._owners]
