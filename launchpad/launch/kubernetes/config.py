"""The kubernetes launcher's options: `KubernetesResources` (one group's pods) and
`KubernetesConfig` (the keyword arguments of `lp.launch`).

Used on the launching machine, where `lp.launch` checks them before anything is created.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from launchpad.launch import detached
from launchpad.launch.kubernetes import names
from launchpad.resources import Resources


@dataclasses.dataclass
class KubernetesResources:
    """The Kubernetes resources of one group's pods.

    Attributes:
      cpu: CPU request, e.g. 2 or '500m'.
      memory: memory request and limit, e.g. '8Gi'.
      gpus: NVIDIA GPUs, requested as the `nvidia.com/gpu` limit.
      node_selector: node labels the pods must run on, e.g. {'cloud.google.com/gke-nodepool': 'gpu'}.
      tolerations: Kubernetes tolerations (dicts as in a pod spec).
      env: extra environment variables: values, or sources as in a pod spec's `valueFrom`, e.g.
        {'WANDB_API_KEY': {'secretKeyRef': {'name': 'wandb', 'key': 'api-key'}}}.
      args: absl flag values for the group's processes, as {name: value} or ['--name=value'].
    """
    cpu: Union[str, float, None] = None
    memory: Optional[str] = None
    gpus: int = 0
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    env: Mapping[str, Union[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    args: Union[Mapping[str, object], Sequence[str], None] = None

    @classmethod
    def from_resources(cls, resources: Resources, **fields: Any) -> 'KubernetesResources':
        """The pod request of an `lp.Resources` (cpu, memory, whole GPUs), with `fields` of its
        own (node_selector, tolerations, ...): what a group given `lp.Resources` gets."""
        own = resources.platform_fields('Kubernetes', cpus='cpu', gpus='gpus', memory='memory',
                                        mib='Mi')
        return cls(**{**own, **fields, 'env': {**own['env'], **fields.get('env', {})}})

    def to_container_resources(self) -> Dict[str, Dict[str, str]]:
        """The node container's `resources` (requests and limits; empty ones left out)."""
        requests, limits = {}, {}
        if self.cpu is not None:
            requests['cpu'] = str(self.cpu)
        if self.memory is not None:
            requests['memory'] = limits['memory'] = str(self.memory)
        if self.gpus:
            limits['nvidia.com/gpu'] = str(int(self.gpus))
        return {key: value for key, value in (('requests', requests), ('limits', limits)) if value}


@dataclasses.dataclass
class KubernetesConfig:
    """Options of the kubernetes launcher (the keyword arguments of `lp.launch`).

    Attributes:
      image: the container image, holding Python, launchpad, its dependencies and your code.
      namespace: where the program's objects are created.
      image_pull_policy: 'IfNotPresent', 'Always' or 'Never'.
      service_account: the pods' service account (default: the namespace's default one, without
        an API token; with `create_rbac` the coordinator pod uses the account it creates).
      create_rbac: create a ServiceAccount, Role and RoleBinding for the coordinator pod.
      python: the interpreter inside the image.
      port: the first port of each pod's servers (the J-th address of a pod uses port + J).
      cluster_domain: the cluster's DNS domain.
      name: the launch name (default: the program name and six random hex digits).
      detach: create the objects, print how to follow and delete them, and do not delete them when
        the launcher ends.
      kubeconfig: the kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
      context: the kubeconfig context (default: the current one).
      pending_timeout: seconds a pod may stay unschedulable before the program fails.
      coordinator_wait: seconds a node pod waits for the coordinator before failing.
      checkpoint_volume: the volume that holds the nodes' checkpoint directories
        (`lp.get_context().checkpoint_dir`), as a pod spec's volume source, e.g.
        {'persistentVolumeClaim': {'claimName': 'checkpoints'}}: every node pod mounts it, and
        each launch keeps its checkpoints under its launch name there (give `name=` to resume
        a program's checkpoints in a new launch). None: nodes have no checkpoint directory.
      runs_volume: the volume where a detached program's coordinator pod keeps its run file
        (`python -m launchpad.launch sql`, `dashboard RUN`), as a pod spec's volume source like
        `checkpoint_volume` (the same one may serve both): under `<launch name>/run.sqlite`
        there. None: a detached program keeps no run file (a warning says so). An attached
        launch keeps it in the launching process's run directory and needs none.
      supervisor_grace: with `detach`, seconds the nodes run on without their coordinator
        before they stop with their notice period (default `detached.SUPERVISOR_GRACE`,
        180 s). A detached program's coordinator pod restarts its container when the
        coordinator dies (SIGKILL, out of memory), and the new one re-adopts the running nodes
        from the state the old one kept in the pod (`readopt`).
    """
    image: str = ''
    namespace: str = 'default'
    image_pull_policy: str = 'IfNotPresent'
    service_account: Optional[str] = None
    create_rbac: bool = False
    python: str = 'python3'
    port: int = 7100
    cluster_domain: str = 'cluster.local'
    name: Optional[str] = None
    detach: bool = False
    kubeconfig: Optional[str] = None
    context: Optional[str] = None
    pending_timeout: float = 600.0
    coordinator_wait: float = 600.0
    checkpoint_volume: Optional[Mapping[str, Any]] = None
    runs_volume: Optional[Mapping[str, Any]] = None
    supervisor_grace: Optional[float] = None

    def __post_init__(self):
        for option, volume in (('checkpoint_volume', self.checkpoint_volume),
                               ('runs_volume', self.runs_volume)):
            if volume is not None and (not isinstance(volume, Mapping) or len(volume) != 1
                                       or 'name' in volume):
                raise ValueError(
                    f'{option} must be one volume source as in a pod spec, such as '
                    f"{{'persistentVolumeClaim': {{'claimName': 'checkpoints'}}}}, got "
                    f'{volume!r}.')
        detached.supervisor_grace(self.detach, self.supervisor_grace)  # raises if it is bad
        if not self.image:
            raise ValueError("The kubernetes launcher needs image=: a container image with Python, "
                             "launchpad and your code, e.g. lp.launch(program, "
                             "launch_type='kubernetes', image='registry.example/me/agent:v1').")
        if self.image_pull_policy not in ('IfNotPresent', 'Always', 'Never'):
            raise ValueError(f'image_pull_policy must be IfNotPresent, Always or Never, not '
                             f'{self.image_pull_policy!r}.')
        if not names.DNS_LABEL.fullmatch(self.namespace):
            raise ValueError(f'namespace {self.namespace!r} is not a valid Kubernetes name '
                             '(lowercase letters, digits and dashes).')
        if not 1 <= self.port <= 65535 - 100:
            raise ValueError(f'port must be between 1 and 65435, not {self.port}.')

