"""The objects of a launch on Kubernetes, built before anything is created: `plan_launch` packs
every executable and makes the root ConfigMap, the token Secret, the headless Service, the RBAC
objects, the coordinator pod and each node's spec ConfigMaps and pod (as plain dicts);
`to_yaml` writes them for `kubectl apply`.

Runs on the launching machine (the launcher, and `program_to_manifests` without a cluster). What
the pods run is in `pod.py`; the names both share are in `names.py`.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import secrets
import zlib
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import courier

from launchpad import runtime
from launchpad.address import AddressTable
from launchpad.launch import detached
from launchpad.launch.kubernetes import coordinator_job, in_cluster, names
from launchpad.launch.kubernetes.config import KubernetesConfig, KubernetesResources
from launchpad.launch.launcher import LaunchOptions, executables_of, policies_of
from launchpad.policy import NodePolicy
from launchpad.process import spec as specs
from launchpad.program import Program

SPEC_CHUNK_BYTES = 1_000_000  # under the 1 MiB ConfigMap limit, leaving room for metadata
MAX_SPEC_CHUNKS = 16


@dataclasses.dataclass
class _PodPlan:
    """One node pod of a launch, before its documents are made."""
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
      documents: the objects, root ConfigMap first, coordinator pod (or its Job: a program no
        launcher follows, `coordinator_job`) before node pods.
      node_pods: executable name -> its pod name.
      coordinator_pod: the coordinator's pod name.
      policies: executable name -> its restart policy and progress deadline.
      added_pods: group label -> the pod names the coordinator pod gives the nodes it adds to
        the group (a detached launch: its Role names them, so they are as many as the group's
        `lp.Elastic.max_size`).
    """
    run: str
    namespace: str
    documents: List[Dict[str, Any]]
    node_pods: Dict[str, str]
    coordinator_pod: str
    policies: Dict[str, NodePolicy] = dataclasses.field(default_factory=dict)
    growth: Optional['_Growth'] = None
    owner: Optional[Dict[str, Any]] = None  # the root's owner reference, once it is created
    added_pods: Dict[str, List[str]] = dataclasses.field(default_factory=dict)

    def pod_document(self, pod_name: str) -> Dict[str, Any]:
        """The Pod `pod_name` as the launch creates it (the coordinator's: as its Job does)."""
        return coordinator_job.as_pod(next(
            document for document in self.documents if document['kind'] in ('Pod', 'Job')
            and document['metadata']['name'] == pod_name))

    def add_node(self, label: str, executable, policy: NodePolicy,
                 pod_name: Optional[str] = None) -> List[Dict[str, Any]]:
        """The spec ConfigMaps and Pod of an executable added to the running program, made as
        the launch made its pods (`plan_launch`), with the address table grown by the new pod's
        addresses; its first init container also joins it to the coordinator. They are added to
        `documents` (the caller creates them). `pod_name`: the pod's name (default: after the
        node's group and index)."""
        growth = self.growth
        if growth is None:
            raise RuntimeError(f'Launch {self.run} cannot grow: it was not planned to.')
        index = runtime.label_and_index(executable.name)[1]
        pod = _PodPlan(pod_name or f'{self.run}-{growth.slug(label)}-{index}', executable.name,
                       label, len(executable.addresses))
        endpoints = {address.id: f'{pod.name}.{growth.domain}:{growth.port + j}'
                     for j, address in enumerate(executable.addresses)}
        growth.packer.address_table.static.update(endpoints)
        documents = _node_documents(
            growth.builder, growth.packer, pod, executable,
            growth.resources.get(label) or KubernetesResources(), growth.coordinator_host,
            policy, names.Joining(executable.name, policy.to_json(), endpoints))
        self.documents += documents
        self.node_pods[executable.name] = pod.name
        self.policies[executable.name] = policy
        return documents

    def leave_pod(self, node_name: str) -> Dict[str, Any]:
        """The short pod that tells the coordinator `node_name` is removed (`pod.py leave`)."""
        growth = self.growth
        name = f'{self.node_pods[node_name]}-leave'
        if len(name) > 63:  # a hostname is one DNS label
            name = f'{self.run}-leave-{zlib.crc32(node_name.encode()):08x}'
        return growth.builder.leave_pod(name, node_name, growth.coordinator_host)

    def forget(self, node_name: str) -> List[Dict[str, Any]]:
        """Takes the Pod and ConfigMaps of a removed node out of `documents`; returns them."""
        pod = self.node_pods[node_name]
        gone = [d for d in self.documents
                if d['metadata']['name'] == pod or d['metadata']['name'].startswith(f'{pod}-spec-')]
        self.documents = [d for d in self.documents if d not in gone]
        return gone

    def selector(self) -> str:
        """The label selector of every object of the launch."""
        return names.selector(self.run)

    def logs_command(self) -> str:
        """The kubectl command that follows the logs of every pod of the launch."""
        return (f'kubectl -n {self.namespace} logs -f --prefix -l {self.selector()} '
                f'--max-log-requests {len(self.node_pods) + 1}')


@dataclasses.dataclass
class _Growth:
    """What a launch keeps to make pods for nodes added while it runs."""
    packer: specs.Packer
    builder: '_ManifestBuilder'
    slugs: Dict[str, str]  # group label -> its part of pod names
    domain: str
    coordinator_host: str
    port: int
    run_length: int
    resources: Mapping[str, KubernetesResources]

    def slug(self, label: str) -> str:
        """The group's part of pod names (as at launch; a group new to the program gets one)."""
        if label not in self.slugs:
            self.slugs[label] = _new_slug(label, self.slugs, 50 - self.run_length)
        return self.slugs[label]


def _new_slug(label: str, slugs: Mapping[str, str], limit: int) -> str:
    """The label as a DNS fragment distinct from the other groups' (`Replay_A`, `replay-a`)."""
    base = names.slug(label, limit)
    slug, k = base, 1
    while slug in slugs.values():
        k += 1
        slug = f'{base[:max(1, len(base) - len(str(k)))]}{k}'
    return slug


def _node_documents(builder: '_ManifestBuilder', packer: specs.Packer, pod: _PodPlan, executable,
                    group: KubernetesResources, coordinator_host: str,
                    policy: Optional[NodePolicy] = None,
                    joining: Optional[names.Joining] = None) -> List[Dict[str, Any]]:
    """The spec ConfigMaps and the Pod of one node: every node's one packing step, at launch or
    added to the running program (`policy`: an added node's; `joining`: how it joins)."""
    pod.spec = _pack(packer, executable, group, policy)
    configmaps = builder.spec_configmaps(pod)
    return configmaps + [builder.node_pod(pod, group, [c['metadata']['name'] for c in configmaps],
                                          coordinator_host, joining=joining)]


def _pack(packer: specs.Packer, executable, group: KubernetesResources,
          policy: Optional[NodePolicy]) -> bytes:
    """The executable's packed spec, refused if too large for the ConfigMaps it may take."""
    spec = specs.pack(packer.admit(executable, policy, args=group.args))
    if math.ceil(len(spec) / SPEC_CHUNK_BYTES) > MAX_SPEC_CHUNKS:
        raise ValueError(
            f'Node {executable.name} is {len(spec) / 2**20:.1f} MiB once pickled; '
            f'Kubernetes keeps executables in ConfigMaps of at most 1 MiB, {MAX_SPEC_CHUNKS} '
            f'per node. Pass less data as node arguments: build large data into the image, or '
            f'load it inside the node from a volume or a store.')
    return spec


def grace_period(notice_period: float) -> int:
    """Seconds a pod being deleted gets between SIGTERM and SIGKILL: the notice period (rounded
    up) and 5 s more, so that the coordinator pod outlives the nodes it gave the notice period."""
    return int(math.ceil(notice_period)) + 5


def plan_launch(program: Program, options: LaunchOptions, *,
                attached: bool = False) -> LaunchPlan:
    """Builds (without creating) the objects that run `program`; packs every executable first.

    `options` were checked by `KubernetesLauncher.check` (their settings are a KubernetesConfig).
    `attached`: a launcher stays to create failed node pods again. Without one, the coordinator
    pod does, from the node pods' manifests in ConfigMap RUN-pods, when it has a service account
    (`create_rbac=True`, or `service_account=` with the rights of
    `coordinator_rbac_manifests`); else every failure is final (a restart policy still says
    whether a node is dropped), and a warning says so.
    """
    config: KubernetesConfig = options.settings
    resources = options.resources
    notice_period = options.notice_period
    executables = executables_of(program, options)
    run = config.name
    if run is None:
        run = names.slug(program.name, 40)
        run = f'{run if run[0].isalpha() else "lp-" + run[:37]}-{secrets.token_hex(3)}'
    if not names.DNS_LABEL.fullmatch(run) or not run[0].isalpha() or len(run) > 47:
        raise ValueError(f'The launch name {run!r} must be a DNS label of at most 47 characters '
                         'starting with a letter (lowercase letters, digits, dashes).')
    domain = f'{run}.{config.namespace}.svc.{config.cluster_domain}'
    coordinator_pod = f'{run}-coordinator'
    coordinator_host = f'{coordinator_pod}.{domain}'
    coordinator_address = f'{coordinator_host}:{config.port}'

    pods: List[_PodPlan] = []
    per_label: Dict[str, int] = {}
    slugs: Dict[str, str] = {}  # group label -> its part of pod names, distinct per group
    static = {}
    for label, executable in executables:
        index = per_label.get(label, 0)
        per_label[label] = index + 1
        if label not in slugs:
            slugs[label] = _new_slug(
                label, slugs, 55 - len(run) - len(str(len(program.groups[label]))))
        pod = f'{run}-{slugs[label]}-{index}'
        for j, address in enumerate(executable.addresses):
            static[address.id] = f'{pod}.{domain}:{config.port + j}'
        pods.append(_PodPlan(pod, executable.name, label, len(executable.addresses)))
    policies = policies_of(program, executables)
    recreates_pods = not attached and bool(config.create_rbac or config.service_account)
    if not attached and config.runs_volume is None:
        logging.warning('No launcher follows this program, so it keeps no run file (`python -m '
                        'launchpad.launch sql`, `dashboard RUN` after it ends) unless its '
                        "coordinator pod has a volume to write it to: pass runs_volume=, e.g. "
                        "{'persistentVolumeClaim': {'claimName': 'runs'}}.")
    if not attached and not recreates_pods:
        _warn_about_restarts(policies)
        policies = {name: policy.without_restarts() for name, policy in policies.items()}
    packer = specs.Packer(program.name, options.launch_type, AddressTable(static=static),
                          coordinator_address, notice_period=notice_period, policies=policies,
                          checkpoint_root=f'{names.CHECKPOINT_DIR}/{run}'
                          if config.checkpoint_volume is not None else None,
                          # nodes wait that long for a restarted coordinator container
                          coordinator_grace=detached.supervisor_grace(
                              config.detach, config.supervisor_grace) if recreates_pods else None)
    builder = _ManifestBuilder(program, config, run, notice_period)
    node_documents = [
        _node_documents(builder, packer, plan, executable,
                        resources.get(label) or KubernetesResources(), coordinator_host)
        for plan, (label, executable) in zip(pods, executables)]
    growth = _Growth(packer, builder, slugs, domain, coordinator_host, config.port, len(run),
                     resources)
    plan = LaunchPlan(run=run, namespace=config.namespace, documents=[],
                      node_pods={p.node_name: p.name for p in pods},
                      coordinator_pod=coordinator_pod, policies=policies, growth=growth,
                      added_pods=_added_pods(program, run, growth, per_label)
                      if recreates_pods else {})
    pod_of = {'coordinator': coordinator_pod, **{p.node_name: p.name for p in pods}}
    documents = [builder.root(pod_of), builder.secret(), builder.service()]
    if config.create_rbac:
        documents += coordinator_rbac_manifests(
            run, config.namespace, [p.name for p in pods] if recreates_pods else None,
            [name for names_ in plan.added_pods.values() for name in names_])
    if recreates_pods:
        documents.append(builder.pod_manifests(
            [d for documents_of_node in node_documents for d in documents_of_node
             if d['kind'] == 'Pod'], in_cluster.Growth(program, plan, dict(resources))))
        documents.append(coordinator_job.state_secret(
            builder.meta(coordinator_job.state_secret_name(run), 'state')))
    addresses = {node.name: [address.id for address in node.addresses]
                 for node in program.get_all_nodes()}
    calls, group_calls = program.calls([p.node_name for p in pods])
    coordinator = builder.coordinator_pod(coordinator_pod, [p.node_name for p in pods],
                                          policies, addresses, recreates_pods,
                                          not attached and config.runs_volume is not None,
                                          calls=calls, group_calls=group_calls)
    documents.append(coordinator_job.job(coordinator) if recreates_pods else coordinator)
    for documents_of_node in node_documents:
        documents += documents_of_node
    plan.documents = documents
    return plan


def _added_pods(program: Program, run: str, growth: '_Growth',
                launched: Mapping[str, int]) -> Dict[str, List[str]]:
    """Group label -> the pod names for the nodes a coordinator pod adds to it, for each group
    that can grow by itself: as many as its `max_size`, numbered after its `launched` pods."""
    added = {}
    for label, elastic in program.elastic_groups.items():
        if elastic.make_node is None:
            continue
        if elastic.max_size is None:
            raise ValueError(
                f'Group {label!r} is elastic without a max_size: the coordinator pod of a '
                'detached Kubernetes program deletes only the pods its Role names, one for each '
                f'node it may add. Give it lp.Elastic(max_size=...), or launch it attached.')
        first = launched.get(label, 0)
        added[label] = [f'{run}-{growth.slug(label)}-{first + k}'
                        for k in range(elastic.max_size)]
        too_long = [name for name in added[label] if len(name) > 63]
        if too_long:
            raise ValueError(f'Pod names of group {label!r} such as {too_long[0]!r} are too long '
                             'for Kubernetes: choose a shorter name= or group label.')
    return added


def _warn_about_restarts(policies: Mapping[str, NodePolicy]) -> None:
    restarting = [name for name, policy in policies.items()
                  if policy.restart is not None and policy.restart.max_restarts != 0]
    if restarting:
        logging.warning(
            'No launcher follows this program and its coordinator pod has no service account to '
            'create pods with, so %s will not be restarted when %s. Pass create_rbac=True (or '
            'service_account= with the rights of coordinator_rbac_manifests) to have the '
            'coordinator pod restart them.', ', '.join(restarting),
            'it fails' if len(restarting) == 1 else 'they fail')


def coordinator_rbac_manifests(run: str, namespace: str,
                               node_pods: Optional[Sequence[str]] = None,
                               added_pods: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding that let the coordinator pod list the program's pods
    and, given the names of its `node_pods` (the coordinator restarts them: no launcher follows
    the program), create pods and delete those, and read pod logs (`pod_logs`). With
    `added_pods` (the pods of nodes it may add to elastic groups, `LaunchPlan.added_pods`) it
    may also delete those and read their logs, and create ConfigMaps and delete their spec
    ConfigMaps (POD-spec-0). RBAC cannot limit `create` or
    `list` to names or labels: they hold for every pod (or ConfigMap) of the namespace."""
    labels = {names.PROGRAM_LABEL: run, **names.MANAGED_BY}
    meta = {'name': run, 'namespace': namespace, 'labels': labels}
    rules = [{'apiGroups': [''], 'resources': ['pods'], 'verbs': ['get', 'list']}]
    if node_pods is not None:
        rules += [{'apiGroups': [''], 'resources': ['pods'], 'verbs': ['create']},
                  {'apiGroups': [''], 'resources': ['pods'], 'verbs': ['delete'],
                   'resourceNames': [*node_pods, *added_pods]}]
    if added_pods:
        rules += [{'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['create']},
                  {'apiGroups': [''], 'resources': ['configmaps'], 'verbs': ['delete'],
                   'resourceNames': [f'{pod}-spec-0' for pod in added_pods]}]
    if node_pods is not None:
        rules.append({'apiGroups': [''], 'resources': ['pods/log'], 'verbs': ['get'],
                      'resourceNames': [*node_pods, *added_pods]})
        rules += coordinator_job.rbac_rules(run)
    return [
        {'apiVersion': 'v1', 'kind': 'ServiceAccount', 'metadata': dict(meta)},
        {'apiVersion': 'rbac.authorization.k8s.io/v1', 'kind': 'Role', 'metadata': dict(meta),
         'rules': rules},
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
        self._grace = grace_period(notice_period)
        self._coordinator_account = run if config.create_rbac else config.service_account

    def meta(self, name: str, role: str, node: Optional[str] = None) -> Dict[str, Any]:
        """The metadata of an object of the launch: its name, namespace and labels."""
        labels = {names.PROGRAM_LABEL: self._run, names.ROLE_LABEL: role, **names.MANAGED_BY}
        meta: Dict[str, Any] = {'name': name, 'namespace': self._config.namespace,
                                'labels': labels}
        if node is not None:
            labels[names.NODE_LABEL] = names.slug(node, 63)
            meta['annotations'] = {names.NODE_NAME_ANNOTATION: node}
        return meta

    def root(self, pods: Mapping[str, str]) -> Dict[str, Any]:
        """The program's root object: what it is and which pod runs each node."""
        meta = self.meta(self._run, 'program')
        return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': meta, 'immutable': True,
                'data': {'program': self._program.name, 'image': self._config.image,
                         'pods': json.dumps(dict(pods), indent=1)}}

    def secret(self) -> Dict[str, Any]:
        """The program's courier auth token, random, for every pod's COURIER_AUTH_TOKEN."""
        token = secrets.token_hex(16)
        return {'apiVersion': 'v1', 'kind': 'Secret', 'type': 'Opaque', 'immutable': True,
                'metadata': self.meta(f'{self._run}-token', 'token'),
                'data': {'token': base64.b64encode(token.encode()).decode()}}

    def service(self) -> Dict[str, Any]:
        """The headless Service that gives every pod of the program a stable DNS name."""
        return {'apiVersion': 'v1', 'kind': 'Service', 'metadata': self.meta(self._run, 'dns'),
                'spec': {'clusterIP': 'None', 'publishNotReadyAddresses': True,
                         'selector': {names.PROGRAM_LABEL: self._run},
                         'ports': [{'name': 'courier', 'port': self._config.port,
                                    'protocol': 'TCP'}]}}

    def spec_configmaps(self, plan: _PodPlan) -> List[Dict[str, Any]]:
        """The node's packed spec, in ConfigMaps of at most SPEC_CHUNK_BYTES each."""
        chunks = [plan.spec[i:i + SPEC_CHUNK_BYTES]
                  for i in range(0, len(plan.spec), SPEC_CHUNK_BYTES)] or [b'']
        return [{'apiVersion': 'v1', 'kind': 'ConfigMap', 'immutable': True,
                 'metadata': self.meta(f'{plan.name}-spec-{k}', 'spec', plan.node_name),
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

    def pod_manifests(self, pods: Sequence[Mapping[str, Any]],
                      growth: in_cluster.Growth) -> Dict[str, Any]:
        """The ConfigMap RUN-pods: the node pods' manifests, from which the coordinator pod
        creates a failed node's pod again when no launcher follows the program, and the
        program with what makes pods (`growth`), from which it grows and shrinks its groups."""
        data = in_cluster.pack_pod_manifests({pod['metadata']['name']: pod for pod in pods})
        binary = {in_cluster.POD_MANIFESTS_KEY: data}
        packed = in_cluster.pack_growth(growth)
        if len(data) + len(packed) <= SPEC_CHUNK_BYTES:
            binary[in_cluster.GROWTH_KEY] = packed
        else:
            logging.warning(
                'The program takes %.1f MiB once pickled, more than its coordinator pod\'s '
                'ConfigMap holds beside the node pods\' manifests: without a launcher, its '
                'groups will not grow or shrink and it runs no scaling policy. Pass less data '
                'as node arguments, or launch it attached.', len(packed) / 2**20)
        if len(data) > SPEC_CHUNK_BYTES:
            raise ValueError(
                f'The manifests of the {len(pods)} node pods take {len(data) / 2**20:.1f} MiB, '
                'more than a ConfigMap holds, so the coordinator pod could not restart them '
                'without a launcher. Launch it attached (detach=False), or without a service '
                'account for the coordinator (no create_rbac=True or service_account=): its '
                'failures are then final.')
        return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'immutable': True,
                'metadata': self.meta(f'{self._run}-pods', 'pods'), 'binaryData': binary}

    def coordinator_pod(self, name: str, node_names: List[str],
                        policies: Mapping[str, NodePolicy],
                        addresses: Mapping[str, List[str]],
                        recreates_pods: bool = False, keeps_run: bool = False, *,
                        calls: Mapping[str, Iterable[str]] = None,
                        group_calls: Mapping[str, Iterable[str]] = None) -> Dict[str, Any]:
        """The pod that serves the program's coordinator (`pod.py coordinator`); with
        `recreates_pods`, it mounts the node pods' manifests (`pod_manifests`); with
        `keeps_run`, the volume `runs_volume` at RUNS_DIR, for the program's run file. `calls`
        and `group_calls` (`Program.calls`): the stop's order."""
        settings = names.CoordinatorSettings(
            run=self._run, namespace=self._config.namespace, nodes=node_names,
            port=self._config.port, notice_period=self._grace - 5,
            policies={node: policy.to_json() for node, policy in policies.items()},
            addresses={node: list(ids) for node, ids in addresses.items() if ids},
            recreates_pods=recreates_pods, program=self._program.name,
            runs_dir=names.RUNS_DIR if keeps_run else None,
            state_dir=names.STATE_DIR if recreates_pods else None,
            job=name if recreates_pods else None,
            calls={node: sorted(callees) for node, callees in (calls or {}).items() if callees},
            group_calls={node: sorted(labels) for node, labels in (group_calls or {}).items()
                         if labels})
        command = names.pod_command(self._config.python, names.COORDINATOR_COMMAND,
                                    settings.to_json())
        container = self._container(names.COORDINATOR_CONTAINER, command, self._env({}))
        container['ports'] = [{'name': 'courier', 'containerPort': self._config.port}]
        container['readinessProbe'] = {'tcpSocket': {'port': self._config.port},
                                       'periodSeconds': 2}
        container['resources'] = {'requests': {'cpu': '100m', 'memory': '256Mi'}}
        volumes = []
        if recreates_pods:
            volumes = [{'name': 'pods', 'configMap': {'name': f'{self._run}-pods'}}]
            container['volumeMounts'] = [{'name': 'pods', 'mountPath': names.PODS_DIR,
                                          'readOnly': True}]
        if keeps_run:
            volumes.append({'name': 'runs', **self._config.runs_volume})
            container.setdefault('volumeMounts', []).append(
                {'name': 'runs', 'mountPath': names.RUNS_DIR})
        if recreates_pods:  # the state a restarted container re-adopts the nodes from
            volumes.append({'name': 'state', 'emptyDir': {}})
            container['volumeMounts'].append({'name': 'state', 'mountPath': names.STATE_DIR})
        spec = self._pod_spec([container], volumes=volumes,
                              service_account=self._coordinator_account)
        if recreates_pods:  # a coordinator that dies (SIGKILL, out of memory) is restarted
            spec['restartPolicy'] = 'OnFailure'
        spec['hostname'] = name
        return {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': self.meta(name, 'coordinator'), 'spec': spec}

    def leave_pod(self, name: str, node_name: str, coordinator_host: str) -> Dict[str, Any]:
        """The short pod that tells the coordinator node `node_name` is removed."""
        container = self._container(names.NODE_CONTAINER, names.pod_command(
            self._config.python, names.LEAVE_COMMAND, coordinator_host, str(self._config.port),
            str(self._config.coordinator_wait), node_name), self._env({}))
        container['resources'] = {'requests': {'cpu': '50m', 'memory': '128Mi'}}
        spec = self._pod_spec([container], service_account=self._config.service_account)
        spec['hostname'] = name
        return {'apiVersion': 'v1', 'kind': 'Pod',
                'metadata': self.meta(name, names.LEAVE_ROLE, node_name), 'spec': spec}

    def node_pod(self, plan: _PodPlan, group: KubernetesResources, configmaps: List[str],
                 coordinator_host: str, joining: Optional[names.Joining] = None
                 ) -> Dict[str, Any]:
        """A node's pod: init containers wait for the coordinator (a node added to the running
        program joins it there) and join the spec's parts, then the worker runs the spec."""
        python = self._config.python
        joins = ['--join', joining.to_json()] if joining is not None else []
        wait = self._container(names.WAIT_CONTAINER, names.pod_command(
            python, names.WAIT_FOR_COMMAND, coordinator_host, str(self._config.port),
            str(self._config.coordinator_wait), *joins), self._env({}) if joins else [])
        init = [wait]
        if len(configmaps) == 1:
            volumes = [{'name': 'spec', 'configMap': {'name': configmaps[0]}}]
            mounts = [{'name': 'spec', 'mountPath': names.SPEC_DIR, 'readOnly': True}]
        else:
            parts = [f'part-{k:03d}' for k in range(len(configmaps))]
            volumes = [{'name': part, 'configMap': {'name': cm}}
                       for part, cm in zip(parts, configmaps)]
            volumes.append({'name': 'spec', 'emptyDir': {}})
            join = self._container(names.JOIN_CONTAINER, names.pod_command(
                python, names.JOIN_PARTS_COMMAND, names.PARTS_DIR, f'{names.SPEC_DIR}/spec'), [])
            join['volumeMounts'] = [{'name': part, 'mountPath': f'{names.PARTS_DIR}/{part}',
                                     'readOnly': True} for part in parts]
            join['volumeMounts'].append({'name': 'spec', 'mountPath': names.SPEC_DIR})
            init.append(join)
            mounts = [{'name': 'spec', 'mountPath': names.SPEC_DIR, 'readOnly': True}]
        container = self._container(names.NODE_CONTAINER,
                                    specs.worker_argv(f'{names.SPEC_DIR}/spec', python),
                                    self._env(group.env))
        if self._config.checkpoint_volume is not None:
            volumes.append({'name': 'checkpoints', **self._config.checkpoint_volume})
            mounts.append({'name': 'checkpoints', 'mountPath': names.CHECKPOINT_DIR})
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
                'metadata': self.meta(plan.name, 'node', plan.node_name), 'spec': spec}


def to_yaml(documents: Sequence[Mapping[str, Any]]) -> str:
    """`documents` as multi-document YAML, multi-line strings (the root's pod table) as literal
    blocks."""
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(f'Kubernetes manifests need PyYAML: {names.INSTALL_HINT}') from e

    class Dumper(getattr(yaml, 'CSafeDumper', yaml.SafeDumper)):  # libyaml's is 50x faster
        pass

    def represent_str(dumper, text):
        style = '|' if '\n' in text else None
        return dumper.represent_scalar('tag:yaml.org,2002:str', text, style=style)

    Dumper.add_representer(str, represent_str)
    return yaml.dump_all(documents, Dumper=Dumper, sort_keys=False)
