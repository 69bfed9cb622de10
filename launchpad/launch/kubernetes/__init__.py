"""`kubernetes`: every executable of a program runs in its own pod of a Kubernetes cluster.

    lp.launch(program, launch_type='kubernetes', image='registry.example/team/agent:v3',
              namespace='research', resources={'learner': lp.KubernetesResources(gpus=1)})

Objects. A launch named RUN (the program name and six random hex digits) creates, all labelled
`launchpad.dev/program=RUN`:
  * ConfigMap RUN: the program's root object; every other object names it as its owner, so
    `kubectl delete configmap RUN` deletes the whole program (the launcher does this when it ends);
  * Secret RUN-token: the program's courier auth token, given to every pod as COURIER_AUTH_TOKEN;
  * Service RUN: headless, so pod P has the stable DNS name P.RUN.NAMESPACE.svc.CLUSTER_DOMAIN;
  * Pod RUN-coordinator: the program's coordinator, served with courier (see below);
  * per executable, Pod RUN-GROUP-K running `[python] + WORKER_ARGV + [spec]`, and ConfigMap(s)
    RUN-GROUP-K-spec-N holding its pickled `WorkerSpec`.
Every pod has a network namespace of its own, so the address table is static: the J-th address of
a pod is `POD_DNS_NAME:port+J` (a fixed port cannot collide with another pod's). Pods use
`restartPolicy: Never`: a node that fails ends the program, as on every other platform.

Where the coordinator lives. Nodes must reach the coordinator for published addresses, the stop
signal and failure reports, and pods generally cannot reach the machine that launched them (it sits
behind NAT, a VPN or a laptop's sleep). So the coordinator runs in the cluster, in a small pod of its
own that nodes reach through the Service like any other node; each node pod first waits for it in an
init container. The launcher then needs nothing but the API server: it follows pod phases, exit
codes, events and logs there, and stops the program by deleting the coordinator pod gracefully (its
SIGTERM handler raises the stop signal; nodes get the notice period; pods that outlive it are
deleted). The program therefore survives the launcher going away (`detach=True` relies on that),
and `lp.stop()` in any pod ends it without the launcher.

Executables. Kubernetes caps a ConfigMap's data at 1 MiB (1,048,576 bytes, the API server's
validation limit, below etcd's 1.5 MiB request limit). Each executable gets ConfigMaps of its own,
holding at most `SPEC_CHUNK_BYTES` each; a spec larger than one chunk is split over up to
`MAX_SPEC_CHUNKS` ConfigMaps and joined again by an init container. Larger executables are refused
with an error: build big data into the image or load it from a volume inside the node.

RBAC. Node pods use no API. The coordinator pod lists the program's pods (`get`, `list` on pods)
to notice a pod that dies without reporting (killed for memory, evicted); without that permission it
says so in its log and relies on an attached launcher to notice. `create_rbac=True` creates a
ServiceAccount, Role and RoleBinding granting exactly that (`coordinator_rbac_manifests`); the
launching user needs create/get/list/delete on pods, configmaps, secrets and services (and on
serviceaccounts, roles and rolebindings with `create_rbac=True`), get on pods/log and list on events.

`program_to_manifests` writes the same objects as YAML for `kubectl apply` (without owner
references, which need the root's uid: delete them with `kubectl delete ... -l
launchpad.dev/program=RUN`).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import secrets
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from launchpad.address import AddressTable
import courier

from launchpad.launch import launcher
from launchpad.launch.controller import Controller
from launchpad.process import coordinator as coordination
from launchpad.process import spec as specs
from launchpad.process.coordinator import Coordinator
from launchpad.process.output import copy_lines, prefix_for
from launchpad.program import Program
from launchpad.launch.kubernetes.api import KubernetesApi, KubernetesError, NotFound
from launchpad.launch.kubernetes.api import terminated as _terminated
from launchpad.launch.kubernetes.config import KubernetesConfig, KubernetesResources
from launchpad.launch.kubernetes.names import (COORDINATOR_CONTAINER, INSTALL_HINT,
                                               NODE_CONTAINER, NODE_LABEL,
                                               NODE_NAME_ANNOTATION, PARTS_DIR, PROGRAM_LABEL,
                                               ROLE_LABEL, SPEC_DIR)
from launchpad.launch.kubernetes.names import DNS_LABEL as _DNS_LABEL
from launchpad.launch.kubernetes.names import slug as _slug

SPEC_CHUNK_BYTES = 1_000_000  # under the 1 MiB ConfigMap limit, leaving room for metadata
MAX_SPEC_CHUNKS = 16
_IMAGE_PULL_FAILURES = ('ErrImagePull', 'ImagePullBackOff', 'InvalidImageName',
                        'ErrImageNeverPull')
_CONFIG_FAILURES = ('CreateContainerConfigError', 'CreateContainerError', 'RunContainerError')


# ---------------------------------------------------------------------------------------------
# The objects of a launch.


@dataclasses.dataclass
class _PodPlan:
    name: str            # pod name and hostname
    node_name: str       # the executable's name, 'group/index'
    label: str
    ports: int           # how many addresses its servers bind
    spec: bytes = b''


@dataclasses.dataclass
class LaunchPlan:
    """Everything a launch creates, built before anything is created.

    Attributes:
      run: the launch name, the value of the program label.
      namespace: where everything goes.
      documents: the objects, root ConfigMap first, coordinator pod before node pods.
      node_pods: executable name -> its pod name.
      coordinator_pod: the coordinator's pod name.
    """
    run: str
    namespace: str
    documents: List[Dict[str, Any]]
    node_pods: Dict[str, str]
    coordinator_pod: str

    def selector(self) -> str:
        return f'{PROGRAM_LABEL}={self.run}'


def plan_launch(program: Program, options: launcher.LaunchOptions) -> LaunchPlan:
    """Builds (without creating) the objects that run `program`; packs every executable first.

    `options` were checked by `KubernetesLauncher.check` (their settings are a KubernetesConfig).
    """
    config: KubernetesConfig = options.settings
    resources = options.resources
    notice_period = options.notice_period
    executables = launcher.executables_of(program, options)
    run = config.name
    if run is None:
        run = _slug(program.name, 40)
        run = f'{run if run[0].isalpha() else "lp-" + run[:37]}-{secrets.token_hex(3)}'
    if not _DNS_LABEL.fullmatch(run) or not run[0].isalpha() or len(run) > 47:
        raise ValueError(f'The launch name {run!r} must be a DNS label of at most 47 characters '
                         'starting with a letter (lowercase letters, digits, dashes).')
    domain = f'{run}.{config.namespace}.svc.{config.cluster_domain}'
    coordinator_pod = f'{run}-coordinator'
    coordinator_address = f'{coordinator_pod}.{domain}:{config.port}'

    pods: List[_PodPlan] = []
    per_label: Dict[str, int] = {}
    slugs: Dict[str, str] = {}  # group label -> its part of pod names, distinct per group
    static = {}
    for label, executable in executables:
        index = per_label.get(label, 0)
        per_label[label] = index + 1
        if label not in slugs:
            base = _slug(label, 55 - len(run) - len(str(len(program.groups[label]))))
            slug, k = base, 1
            while slug in slugs.values():  # 'Replay_A' and 'replay-a' would give one name
                k += 1
                slug = f'{base[:max(1, len(base) - len(str(k)))]}{k}'
            slugs[label] = slug
        pod = f'{run}-{slugs[label]}-{index}'
        for j, address in enumerate(executable.addresses):
            static[address.id] = f'{pod}.{domain}:{config.port + j}'
        pods.append(_PodPlan(pod, executable.name, label, len(executable.addresses)))
    packer = specs.Packer(program.name, options.launch_type, AddressTable(static=static),
                          coordinator_address, notice_period=notice_period)
    for plan, (label, executable) in zip(pods, executables):
        group = resources.get(label) or KubernetesResources()
        plan.spec = specs.pack(packer.spec(executable.name, executable.run, args=group.args))
        chunks = math.ceil(len(plan.spec) / SPEC_CHUNK_BYTES)
        if chunks > MAX_SPEC_CHUNKS:
            raise ValueError(
                f'Node {executable.name} is {len(plan.spec) / 2**20:.1f} MiB once pickled; '
                f'Kubernetes keeps executables in ConfigMaps of at most 1 MiB, {MAX_SPEC_CHUNKS} '
                f'per node. Pass less data as node arguments: build large data into the image, or '
                f'load it inside the node from a volume or a store.')

    builder = _ManifestBuilder(program, config, run, notice_period)
    pod_of = {'coordinator': coordinator_pod, **{p.node_name: p.name for p in pods}}
    documents = [builder.root(pod_of), builder.secret(), builder.service()]
    if config.create_rbac:
        documents += coordinator_rbac_manifests(run, config.namespace)
    documents.append(builder.coordinator_pod(coordinator_pod, [p.node_name for p in pods]))
    for plan in pods:
        group = resources.get(plan.label) or KubernetesResources()
        configmaps = builder.spec_configmaps(plan)
        documents += configmaps
        documents.append(builder.node_pod(plan, group, [c['metadata']['name'] for c in configmaps],
                                          coordinator_pod))
    return LaunchPlan(run=run, namespace=config.namespace, documents=documents,
                      node_pods={p.node_name: p.name for p in pods},
                      coordinator_pod=coordinator_pod)


def coordinator_rbac_manifests(run: str, namespace: str) -> List[Dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding that let the coordinator pod list the program's pods."""
    labels = {PROGRAM_LABEL: run, 'app.kubernetes.io/managed-by': 'launchpad'}
    meta = {'name': run, 'namespace': namespace, 'labels': labels}
    return [
        {'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': dict(meta)},
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'Role', 'metadata': dict(meta),
         'rules': [{'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'list']}]},
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'RoleBinding',
         'metadata': dict(meta),
         'roleRef': {'apiGroup': 'rbac.authorization.k8s.io', 'kind': 'Role', 'name': run},
         'subjects': [{'kind': 'ServiceAccount', 'name': run, 'namespace': namespace}]},
    ]


class _ManifestBuilder:
    """Makes the documents of one launch; every object is labelled with the program."""

    def __init__(self, program: Program, config: KubernetesConfig, run: str,
                 notice_period: float):
        self._program = program
        self._config = config
        self._run = run
        self._grace = int(math.ceil(notice_period)) + 5
        self._coordinator_account = run if config.create_rbac else config.service_account

    def _meta(self, name: str, role: str, node: Optional[str] = None) -> Dict[str, Any]:
        labels = {PROGRAM_LABEL: self._run, ROLE_LABEL: role,
                  'app.kubernetes.io/managed-by': 'launchpad'}
        meta: Dict[str, Any] = {'name': name, 'namespace': self._config.namespace,
                                'labels': labels}
        if node is not None:
            labels[NODE_LABEL] = _slug(node, 63)
            meta['annotations'] = {NODE_NAME_ANNOTATION: node}
        return meta

    def root(self, pods: Mapping[str, str]) -> Dict[str, Any]:
        """The program's root object: what it is and which pod runs each node."""
        meta = self._meta(self._run, 'program')
        return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': meta, 'immutable': True,
                'data': {'program': self._program.name, 'image': self._config.image,
                         'pods': json.dumps(dict(pods), indent=1)}}

    def secret(self) -> Dict[str, Any]:
        token = secrets.token_hex(16)
        return {'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque', 'immutable': True,
                'metadata': self._meta(f'{self._run}-token', 'token'),
                'data': {'token': base64.b64encode(token.encode()).decode()}}

    def service(self) -> Dict[str, Any]:
        return {'apiVersion': 'v1', 'kind': 'Service', 'metadata': self._meta(self._run, 'dns'),
                'spec': {'clusterIP': 'None', 'publishNotReadyAddresses': True,
                         'selector': {PROGRAM_LABEL: self._run},
                         'ports': [{'name': 'courier', 'port': self._config.port,
                                    'protocol': 'TCP'}]}}

    def spec_configmaps(self, plan: _PodPlan) -> List[Dict[str, Any]]:
        chunks = [plan.spec[i:i + SPEC_CHUNK_BYTES]
                  for i in range(0, len(plan.spec), SPEC_CHUNK_BYTES)] or [b'']
        return [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'immutable': True,
                 'metadata': self._meta(f'{plan.name}-spec-{k}', 'spec', plan.node_name),
                 'binaryData': {'spec': base64.b64encode(chunk).decode()}}
                for k, chunk in enumerate(chunks)]

    def _env(self, extra: Mapping[str, str]) -> List[Dict[str, Any]]:
        env = [{'name': courier.AUTH_TOKEN_ENV, 'valueFrom': {'secretKeyRef': {
                   'name': f'{self._run}-token', 'key': 'token'}}}]
        env += [{'name': key, 'value': value}
                for key, value in specs.node_environment(base={}).items()]
        env += [{'name': str(key), 'valueFrom': dict(value)} if isinstance(value, Mapping)
                else {'name': str(key), 'value': str(value)} for key, value in extra.items()]
        return env

    def _container(self, name: str, command: List[str], env: List[Dict[str, Any]]
                   ) -> Dict[str, Any]:
        container = {'name': name, 'image': self._config.image,
                     'imagePullPolicy': self._config.image_pull_policy, 'command': command}
        if env:
            container['env'] = env
        return container

    def _pod_spec(self, containers, init_containers=(), volumes=(), *,
                  service_account: Optional[str]) -> Dict[str, Any]:
        spec: Dict[str, Any] = {
            'restartPolicy': 'Never', 'subdomain': self._run, 'enableServiceLinks': False,
            'terminationGracePeriodSeconds': self._grace, 'containers': list(containers)}
        if init_containers:
            spec['initContainers'] = list(init_containers)
        if volumes:
            spec['volumes'] = list(volumes)
        if service_account:
            spec['serviceAccountName'] = service_account
        else:  # the namespace's default account: no API token unless the user asks for one
            spec['automountServiceAccountToken'] = False
        return spec

    def coordinator_pod(self, name: str, node_names: List[str]) -> Dict[str, Any]:
        settings = {'run': self._run, 'namespace': self._config.namespace,
                    'nodes': node_names, 'port': self._config.port,
                    'notice_period': self._grace - 5}
        command = [self._config.python, '-c',
                   'from launchpad.launch.kubernetes import serve_coordinator; '
                   'serve_coordinator()', json.dumps(settings)]
        container = self._container(COORDINATOR_CONTAINER, command, self._env({}))
        container['ports'] = [{'name': 'courier', 'containerPort': self._config.port}]
        container['readinessProbe'] = {'tcpSocket': {'port': self._config.port},
                                       'periodSeconds': 2}
        container['resources'] = {'requests': {'cpu': '100m', 'memory': '256Mi'}}
        spec = self._pod_spec([container], service_account=self._coordinator_account)
        spec['hostname'] = name
        return {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': self._meta(name, 'coordinator'), 'spec': spec}

    def node_pod(self, plan: _PodPlan, group: KubernetesResources, configmaps: List[str],
                 coordinator_pod: str) -> Dict[str, Any]:
        python = self._config.python
        domain = f'{self._run}.{self._config.namespace}.svc.{self._config.cluster_domain}'
        wait = self._container('wait-for-coordinator', [
            python, '-c', WAIT_FOR_PORT_SCRIPT,
            f'{coordinator_pod}.{domain}', str(self._config.port),
            str(self._config.coordinator_wait)], [])
        init = [wait]
        if len(configmaps) == 1:
            volumes = [{'name': 'spec', 'configMap': {'name': configmaps[0]}}]
            mounts = [{'name': 'spec', 'mountPath': SPEC_DIR, 'readOnly': True}]
        else:
            parts = [f'part-{k:03d}' for k in range(len(configmaps))]
            volumes = [{'name': part, 'configMap': {'name': cm}}
                       for part, cm in zip(parts, configmaps)]
            volumes.append({'name': 'spec', 'emptyDir': {}})
            join = self._container('join-spec', [
                python, '-c', 'from launchpad.launch.kubernetes import join_parts; join_parts()',
                PARTS_DIR, f'{SPEC_DIR}/spec'], [])
            join['volumeMounts'] = [{'name': part, 'mountPath': f'{PARTS_DIR}/{part}',
                                     'readOnly': True} for part in parts]
            join['volumeMounts'].append({'name': 'spec', 'mountPath': SPEC_DIR})
            init.append(join)
            mounts = [{'name': 'spec', 'mountPath': SPEC_DIR, 'readOnly': True}]
        container = self._container(NODE_CONTAINER,
                                    specs.worker_argv(f'{SPEC_DIR}/spec', python),
                                    self._env(group.env))
        container['volumeMounts'] = mounts
        ports = [{'containerPort': self._config.port + j}
                 for j in range(plan.ports)]
        if ports:
            container['ports'] = ports
        container_resources = group.to_container_resources()
        if container_resources:
            container['resources'] = container_resources
        spec = self._pod_spec([container], init, volumes,
                              service_account=self._config.service_account)
        spec['hostname'] = plan.name
        if group.node_selector:
            spec['nodeSelector'] = dict(group.node_selector)
        if group.tolerations:
            spec['tolerations'] = [dict(t) for t in group.tolerations]
        return {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': self._meta(plan.name, 'node', plan.node_name), 'spec': spec}


def program_to_manifests(program: Program, *, image: str, path: Optional[str] = None,
                         resources: Optional[Mapping[str, KubernetesResources]] = None,
                         notice_period: float = 10.0, **options) -> str:
    """The YAML of the objects that run `program` on Kubernetes (written to `path` if given).

    Takes the keyword arguments of `lp.launch(..., launch_type='kubernetes')`. Apply the result
    with `kubectl apply -f FILE`; delete it with the command in its first comment.
    """
    launch_options = launcher.LaunchOptions('kubernetes', dict(resources or {}),
                                            notice_period=notice_period,
                                            extra={'image': image, **options})
    KubernetesLauncher().check(program, launch_options)
    config = launch_options.settings
    plan = plan_launch(program, launch_options)
    header = (f'# launchpad program {program.name!r}, launch {plan.run}.\n'
              f'# Follow: kubectl -n {plan.namespace} logs -f --prefix -l {plan.selector()} '
              f'--max-log-requests {len(plan.node_pods) + 1}\n'
              f'# Delete: kubectl -n {plan.namespace} delete pods,services,configmaps,secrets'
              f'{",serviceaccounts,roles,rolebindings" if config.create_rbac else ""} '
              f'-l {plan.selector()}\n')
    text = header + to_yaml(plan.documents)
    if path is not None:
        with open(path, 'w') as f:
            f.write(text)
    return text


def to_yaml(documents: Sequence[Mapping[str, Any]]) -> str:
    """`documents` as multi-document YAML, multi-line strings (scripts) as literal blocks."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(f'Kubernetes manifests need PyYAML: {INSTALL_HINT}') from e

    class Dumper(getattr(yaml, 'CSafeDumper', yaml.SafeDumper)):  # libyaml's is 50x faster
        pass

    def represent_str(dumper, text):
        style = '|' if '\n' in text else None
        return dumper.represent_scalar('tag:yaml.org,2002:str', text, style=style)

    Dumper.add_representer(str, represent_str)
    return yaml.dump_all(documents, Dumper=Dumper, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# The launcher side: create the objects, follow the pods, stop and delete.


class _PodRunner:
    """Follows the program's pods through the API for the controller (`launcher.Runner`)."""

    POLL_SECONDS = 1.0

    def __init__(self, api, plan: LaunchPlan, mirror: Coordinator, config: KubernetesConfig,
                 notice_period: float, *, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._plan = plan
        self._mirror = mirror
        self._config = config
        self._grace = int(math.ceil(notice_period)) + 5
        self._clock = clock
        self._codes: Dict[str, Optional[int]] = {name: None for name in plan.node_pods}
        self._listed_at: Optional[float] = None
        self._stop_sent = False
        self._unschedulable_since: Dict[str, float] = {}
        self._followers: Dict[str, threading.Thread] = {}
        self._colors = {pod: i for i, pod in enumerate([plan.coordinator_pod]
                                                       + list(plan.node_pods.values()))}

    def poll(self) -> Dict[str, Optional[int]]:
        now = self._clock()
        if self._listed_at is None or now - self._listed_at >= self.POLL_SECONDS:
            self._listed_at = now
            self._refresh(now)
        if self._mirror.stopping and not self._stop_sent:
            self._stop_sent = True
            # The coordinator turns SIGTERM into the program's stop signal and keeps serving
            # until the nodes have ended or the grace period is over.
            self._api.delete('Pod', self._plan.coordinator_pod, grace_period_seconds=self._grace)
        return dict(self._codes)

    def kill(self, names: Sequence[str]) -> None:
        for name in names:
            self._api.delete('Pod', self._plan.node_pods[name], grace_period_seconds=0)
        self._api.delete('Pod', self._plan.coordinator_pod, grace_period_seconds=0)

    def release(self) -> None:
        if self._config.detach:
            return
        problems = []
        for document in reversed(self._plan.documents):
            kind, name = document['kind'], document['metadata']['name']
            try:
                self._api.delete(kind, name, grace_period_seconds=0 if kind == 'Pod' else None)
            except Exception as e:  # pylint: disable=broad-except
                problems.append(f'{kind} {name}: {e}')
        if problems:
            logging.error('Could not delete every object of %s:\n  %s\nDelete them with: %s',
                          self._plan.run, '\n  '.join(problems), _delete_command(self._plan))

    def _refresh(self, now: float) -> None:
        pods = {pod['metadata']['name']: pod for pod in self._api.list_pods(self._plan.selector())}
        self._follow(self._plan.coordinator_pod, COORDINATOR_CONTAINER,
                     pods.get(self._plan.coordinator_pod))
        for name, pod_name in self._plan.node_pods.items():
            if self._codes[name] is None:
                self._codes[name] = self._inspect(name, pod_name, pods.get(pod_name), now)
        coordinator = pods.get(self._plan.coordinator_pod)
        if ((coordinator is None or _terminated(coordinator, COORDINATOR_CONTAINER))
                and not self._mirror.stopping and None in self._codes.values()):
            self._mirror.request_stop(f'the coordinator pod {self._plan.coordinator_pod} ended')

    def _inspect(self, name: str, pod_name: str, pod: Optional[Mapping[str, Any]],
                 now: float) -> Optional[int]:
        """The node's exit code once its pod has ended (failing the program if it failed)."""
        if pod is None:
            self._fail(name, f'its pod {pod_name} was deleted')
            return -signal.SIGKILL
        self._follow(pod_name, NODE_CONTAINER, pod)
        status = pod.get('status') or {}
        ended = _terminated(pod, NODE_CONTAINER)
        if ended is not None:
            self._join_follower(pod_name)
            code = int(ended.get('exitCode', 1))
            if code != 0:
                detail = ended.get('reason') or 'Error'
                if ended.get('message'):
                    detail += f': {ended["message"].strip()}'
                self._fail(name, f'its pod {pod_name} exited with code {code} ({detail})',
                           self._api.read_log(pod_name, NODE_CONTAINER, tail_lines=30))
            return code
        if status.get('phase') in ('Failed', 'Succeeded'):
            return self._failed_before_start(name, pod_name, pod)
        if status.get('phase') == 'Running':
            self._mirror.node_started(name, None, pod_name)
        problem = self._waiting_problem(pod_name, pod)
        if problem is None:
            problem = self._unschedulable(name, pod_name, status, now)
        if problem is not None:
            self._fail(name, problem)
            self._api.delete('Pod', pod_name, grace_period_seconds=0)
            return 1
        return None

    def _failed_before_start(self, name: str, pod_name: str, pod: Mapping[str, Any]) -> int:
        status = pod.get('status') or {}
        for init in (pod.get('spec') or {}).get('initContainers') or []:
            ended = _terminated(pod, init['name'], init=True)
            if ended is not None and ended.get('exitCode', 0) != 0:
                self._fail(name, f'init container {init["name"]} of pod {pod_name} exited with '
                                 f'code {ended.get("exitCode")} ({ended.get("reason", "Error")})',
                           self._api.read_log(pod_name, init['name'], tail_lines=30))
                return int(ended['exitCode'])
        self._fail(name, f'its pod {pod_name} ended before the node started: '
                         f'{status.get("reason", "")} {status.get("message", "")}'.strip())
        return 1

    def _waiting_problem(self, pod_name: str, pod: Mapping[str, Any]) -> Optional[str]:
        status = pod.get('status') or {}
        for container in ((status.get('initContainerStatuses') or [])
                          + (status.get('containerStatuses') or [])):
            waiting = (container.get('state') or {}).get('waiting') or {}
            reason = waiting.get('reason')
            if reason in _IMAGE_PULL_FAILURES:
                events = [e.get('message', '') for e in self._api.events(pod_name)
                          if e.get('type') == 'Warning']
                detail = events[-1] if events else waiting.get('message', reason)
                return (f'pod {pod_name} cannot pull image {container.get("image")!r} ({reason}: '
                        f'{detail}). Check the image name and tag, that the cluster can reach '
                        'its registry, and the namespace\'s imagePullSecrets.')
            if reason in _CONFIG_FAILURES:
                return (f'pod {pod_name} cannot start container {container.get("name")} '
                        f'({reason}: {waiting.get("message", "")}).')
        return None

    def _unschedulable(self, name: str, pod_name: str, status: Mapping[str, Any],
                       now: float) -> Optional[str]:
        for condition in status.get('conditions') or []:
            if (condition.get('type') == 'PodScheduled' and condition.get('status') == 'False'
                    and condition.get('reason') == 'Unschedulable'):
                since = self._unschedulable_since.setdefault(name, now)
                message = condition.get('message', '')
                if since == now:
                    logging.warning('%s: pod %s cannot be scheduled yet: %s', name, pod_name,
                                    message)
                if now - since >= self._config.pending_timeout:
                    return (f'pod {pod_name} could not be scheduled for '
                            f'{self._config.pending_timeout:g} s: {message}. Ask for fewer '
                            'resources (lp.KubernetesResources), fix its node_selector or '
                            'tolerations, or add nodes to the cluster.')
                return None
        self._unschedulable_since.pop(name, None)
        return None

    def _fail(self, name: str, message: str, log_tail: str = '') -> None:
        if not self._mirror.stopping:
            self._mirror.node_failed(name, message, log_tail)

    def _follow(self, pod_name: str, container: str, pod: Optional[Mapping[str, Any]]) -> None:
        """Copies the container's log to our stdout behind the pod's name, once it has started."""
        if self._config.detach or pod_name in self._followers or pod is None:
            return
        if (pod.get('status') or {}).get('phase') == 'Pending':
            return
        prefix = prefix_for(pod_name[len(self._plan.run) + 1:], self._colors[pod_name],
                            color=sys.stdout.isatty()).encode()

        def copy():
            try:
                copy_lines(self._api.open_log(pod_name, container), prefix)
            except Exception as e:  # pylint: disable=broad-except
                logging.debug('Stopped following the log of %s: %s', pod_name, e)

        thread = threading.Thread(target=copy, name=f'lp-log-{pod_name}', daemon=True)
        self._followers[pod_name] = thread
        thread.start()

    def _join_follower(self, pod_name: str) -> None:
        thread = self._followers.get(pod_name)
        if thread is not None:
            thread.join(2.0)  # its last lines are printed before it counts as ended


def _delete_command(plan: LaunchPlan) -> str:
    return f'kubectl -n {plan.namespace} delete configmap {plan.run}'


def _detached_summary(plan: LaunchPlan) -> str:
    kinds: Dict[str, int] = {}
    for document in plan.documents:
        kinds[document['kind']] = kinds.get(document['kind'], 0) + 1
    created = ', '.join(f'{count} {kind}' for kind, count in kinds.items())
    return (f'Launched {plan.run} in namespace {plan.namespace} ({created}).\n'
            f'  Follow: kubectl -n {plan.namespace} get pods -l {plan.selector()} --watch\n'
            f'  Logs:   kubectl -n {plan.namespace} logs -f --prefix -l {plan.selector()} '
            f'--max-log-requests {len(plan.node_pods) + 1}\n'
            f'  Delete: {_delete_command(plan)}   (every other object is owned by it)')


class KubernetesLauncher(launcher.Launcher):
    """Runs every executable in a pod of a Kubernetes cluster (see the module docstring)."""

    foreground = True
    resource_types = (KubernetesResources,)
    terminals = ('current_terminal',)  # pod logs stream here; read them with kubectl otherwise
    options = KubernetesConfig
    tls_refusal = ('encrypt pod-to-pod traffic with your cluster\'s network policy or service mesh '
                   '(calls still carry the program\'s auth token).')

    def __init__(self, api_factory: Optional[Callable[[KubernetesConfig], Any]] = None):
        self._api_factory = api_factory or (
            lambda config: KubernetesApi(config.namespace, kubeconfig=config.kubeconfig,
                                         context=config.context))

    def launch(self, program: Program, options: launcher.LaunchOptions) -> Controller:
        config = options.settings
        api = self._api_factory(config)
        api.check_namespace()
        plan = plan_launch(program, options)
        _create(api, plan)
        mirror = Coordinator(list(plan.node_pods))
        runner = _PodRunner(api, plan, mirror, config, options.notice_period)
        if config.detach:
            print(_detached_summary(plan), flush=True)
        # Attached, the script stays alive until the program ends (streaming logs, deleting
        # the objects at the end) and Ctrl-C stops the program; detached, it returns at once.
        return Controller(program.name, mirror, runner, launch_type=options.launch_type,
                          notice_period=options.notice_period, poll_interval=0.2,
                          detached=config.detach)


def _create(api, plan: LaunchPlan) -> None:
    """Creates the root object, then everything else owned by it; undoes it all on an error."""
    created: List[Mapping[str, Any]] = []
    try:
        root = api.create(plan.documents[0])
        created.append(plan.documents[0])
        owner = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': plan.run,
                 'uid': root['metadata']['uid']}
        for document in plan.documents[1:]:
            document['metadata']['ownerReferences'] = [owner]
            api.create(document)
            created.append(document)
    except BaseException:
        for document in reversed(created):
            try:
                api.delete(document['kind'], document['metadata']['name'], grace_period_seconds=0)
            except Exception as e:  # pylint: disable=broad-except
                logging.error('Could not delete %s %s after the failed launch: %s',
                              document['kind'], document['metadata']['name'], e)
        raise


# ---------------------------------------------------------------------------------------------
# What runs inside the pods.

# Init container: waits until HOST:PORT (argv) accepts connections. Plain Python without imports
# of launchpad, so that it starts at once.
WAIT_FOR_PORT_SCRIPT = """\
import socket, sys, time
host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + limit
while True:
    try:
        socket.create_connection((host, port), timeout=2.0).close()
        break
    except OSError as e:
        if time.monotonic() > deadline:
            sys.exit(f'launchpad: the coordinator {host}:{port} was not reachable within '
                     f'{limit:g} s ({e}); is its pod running?')
        time.sleep(0.2)
"""



def join_parts() -> None:
    """Init container: joins DIR/part-*/spec (argv[-2] is DIR) into file argv[-1]."""
    import os  # pylint: disable=import-outside-toplevel
    source, target = sys.argv[-2], sys.argv[-1]
    with open(target, 'wb') as out:
        for part in sorted(p for p in os.listdir(source) if p.startswith('part-')):
            with open(os.path.join(source, part, 'spec'), 'rb') as f:
                out.write(f.read())


class _PodCoordinator(Coordinator):
    """The coordinator of a program on Kubernetes: says in its log which node failed and why."""

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        print(f'node {name} failed: {message}', flush=True)
        super().node_failed(name, message, traceback_text)


def serve_coordinator() -> None:
    """The coordinator pod's main: serves the coordinator until every node has ended."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    settings = json.loads(sys.argv[-1])
    coordinator = _PodCoordinator(settings['nodes'])
    server = coordination.serve_coordinator(coordinator, f'0.0.0.0:{settings["port"]}')
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(
        target=coordinator.request_stop, args=('the coordinator pod was deleted',)).start())
    print(f'serving the coordinator of {len(settings["nodes"])} nodes on port '
          f'{settings["port"]}', flush=True)
    watcher = _PodWatcher(settings, coordinator)
    announced = False
    while coordinator.running():
        if coordinator.stopping and not announced:
            announced = True
            print(f'stopping the program: {coordinator.stop_reason}', flush=True)
        if (coordinator.stopping
                and time.monotonic() - coordinator.stop_time > settings['notice_period'] + 2):
            break
        watcher.check()
        coordinator.wait_for_change(1.0)
    time.sleep(1.0)  # the last answers reach their nodes
    server.Stop()
    failure = coordinator.failure
    print(f'the program ended{": " + str(failure).splitlines()[0] if failure else ""}', flush=True)


class _PodWatcher:
    """In the coordinator pod: notices node pods that died without reporting (needs RBAC)."""

    INTERVAL = 2.0

    def __init__(self, settings: Mapping[str, Any], coordinator: Coordinator):
        self._coordinator = coordinator
        self._selector = f'{PROGRAM_LABEL}={settings["run"]},{ROLE_LABEL}=node'
        self._checked_at = 0.0
        self._api = None
        try:
            self._api = KubernetesApi(settings['namespace'], in_cluster=True)
        except (ImportError, KubernetesError) as e:
            print(f'not watching the node pods ({e}); a pod that dies without reporting is '
                  'noticed by an attached launcher only.', flush=True)

    def check(self) -> None:
        if self._api is None or time.monotonic() - self._checked_at < self.INTERVAL:
            return
        self._checked_at = time.monotonic()
        try:
            pods = self._api.list_pods(self._selector)
        except KubernetesError as e:
            print(f'not watching the node pods any more: {e}', flush=True)
            self._api = None
            return
        for pod in pods:
            name = ((pod.get('metadata') or {}).get('annotations') or {}).get(NODE_NAME_ANNOTATION)
            ended = _terminated(pod, NODE_CONTAINER)
            if name in self._coordinator.running() and ended is not None:
                print(f'node {name}: its pod ended ({ended.get("reason", "")}, exit code '
                      f'{ended.get("exitCode")}) without reporting', flush=True)
                self._coordinator.executable_exited(name, int(ended.get('exitCode', 1)))
