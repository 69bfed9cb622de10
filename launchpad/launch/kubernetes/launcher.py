"""The launching machine's side of the kubernetes platform: `KubernetesLauncher` creates a launch's
objects through the API, `PodRunner` follows its pods for the controller (and creates a failed
node's pod again when its restart policy says so), and `program_to_manifests` writes the objects as
YAML instead.

Runs on the launching machine and needs nothing there but the API server (see the package
docstring). Threads, in an attached launch:

  * the controller's monitor thread calls `PodRunner.poll` about every 0.2 s; at most once a second
    (`POLL_SECONDS`) it lists the program's pods, turns ended containers into exit codes and
    failures (reading log tails and events), and sends the stop by deleting the coordinator pod;
  * one daemon thread per started pod (`lp-log-POD`) copies its container's log to stdout behind
    the pod's name until the container ends; the coordinator pod's also passes the group sizes
    nodes ask for (`lp.resize`) to the controller, which adds and removes pods on its monitor
    thread (`add_executable`, `remove`).

A detached launch starts no log thread and deletes nothing when the launcher ends; it returns a
controller that reaches the coordinator pod through the API's exec (`reach`), or, if it cannot,
one that follows the pods.
"""
from __future__ import annotations

import atexit
import json
import logging
import signal
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from launchpad.launch import detached
from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import reach
from launchpad.launch.runner import Runner
from launchpad.launch.kubernetes.api import KubernetesApi, recreate_pod, terminated
from launchpad.launch.kubernetes.config import KubernetesConfig, KubernetesResources
from launchpad.launch.kubernetes.manifests import LaunchPlan, grace_period, plan_launch, to_yaml
from launchpad.launch.kubernetes.names import (COORDINATOR_CONTAINER, NODE_CONTAINER,
                                               ROLE_LABEL, SIZE_REQUEST)
from launchpad.launch.kubernetes.probes import ProbingMirror
from launchpad.launch.launcher import LaunchOptions, Launcher
from launchpad.process.coordinator import Coordinator
from launchpad.process.output import copy_lines, prefix_for
from launchpad.program import Program
from launchpad.resources import Resources

_IMAGE_PULL_FAILURES = ('ErrImagePull', 'ImagePullBackOff', 'InvalidImageName',
                        'ErrImageNeverPull')
# Seconds a detached launch waits for its coordinator pod to serve the program (`reach`).
REACH_TIMEOUT = 120.0
_CONFIG_FAILURES = ('CreateContainerConfigError', 'CreateContainerError', 'RunContainerError')


class KubernetesLauncher(Launcher):
    """Runs every executable in a pod of a Kubernetes cluster (see the package docstring)."""

    foreground = True
    resource_types = (KubernetesResources, Resources)
    terminals = ('current_terminal',)  # pod logs stream here; read them with kubectl otherwise
    options = KubernetesConfig
    tls_refusal = ('encrypt pod-to-pod traffic with your cluster\'s network policy or service mesh '
                   '(calls still carry the program\'s auth token).')

    def group_resources(self, label: str, resources) -> KubernetesResources:
        """An `lp.Resources` as the pod request it maps to."""
        if isinstance(resources, Resources):
            return KubernetesResources.from_resources(resources)
        return resources

    def __init__(self, api_factory: Optional[Callable[[KubernetesConfig], Any]] = None):
        self._api_factory = api_factory or (
            lambda config: KubernetesApi(config.namespace, kubeconfig=config.kubeconfig,
                                         context=config.context))

    def launch(self, program: Program, options: LaunchOptions) -> Controller:
        config = options.settings
        api = self._api_factory(config)
        api.check_namespace()
        plan = plan_launch(program, options, attached=not config.detach)
        _create(api, plan, nodes_owned_by_coordinator=config.detach)
        mirror = ProbingMirror(api, plan.coordinator_pod, config.python, list(plan.node_pods),
                               policies=plan.policies)
        runner = PodRunner(api, plan, mirror, config, options.notice_period)
        if config.detach:
            print(_detached_summary(plan), flush=True)
            attached = _reach(api, plan, config)
            if attached is not None:
                return attached
            atexit.register(runner.let_go)
        # Attached, the script stays alive until the program ends (streaming logs, deleting
        # the objects at the end) and Ctrl-C stops the program; detached, it returns at once.
        return KubernetesController(program.name, mirror, runner,
                                    launch_type=options.launch_type,
                                    notice_period=options.notice_period, poll_interval=0.2,
                                    detached=config.detach)


class KubernetesAttachedController(detached.AttachedController):
    """The controller `lp.launch(..., detach=True)` returns: an `lp.AttachedController`, which
    reaches the program's coordinator pod through the API's exec, as `lp.attach` does (`reach`).

    Attributes:
      namespace: the program's namespace.
      run: the launch's name, which labels its objects (`kubectl delete configmap RUN`).
    """

    def __init__(self, entry, namespace: str, run: str):
        super().__init__(entry)
        self.namespace = namespace
        self.run = run


def _reach(api, plan: LaunchPlan, config: KubernetesConfig
           ) -> Optional[KubernetesAttachedController]:
    """The detached program's controller through its coordinator pod, registered on this
    machine; None (said in a warning) if the pod cannot be reached from here."""
    if getattr(api, 'exec_command', None) is None:
        return None
    try:
        entry = reach.adopt(api, plan.coordinator_pod, plan.run, config.python, REACH_TIMEOUT,
                            job=any(d['kind'] == 'Job' for d in plan.documents))
    except (TimeoutError, PermissionError, ValueError, TypeError) as e:
        logging.warning('`python -m launchpad.launch` and lp.attach cannot reach program %s '
                        'from this machine: %s', plan.run, e)
        return None
    controller = KubernetesAttachedController(entry, plan.namespace, plan.run)
    print(f'Supervised in its coordinator pod {plan.coordinator_pod}; its id is {entry.id}.\n'
          f'{detached.commands(entry.id)}', file=sys.stderr, flush=True)
    return controller


class KubernetesController(Controller):
    """The controller of a program launched on Kubernetes. Detached, its coordinator pod
    supervises it: this one follows its pods, and neither resizes its groups nor runs its
    scaling policy (the coordinator pod does)."""

    def attach(self, program, resources) -> None:
        if not self.detached:
            super().attach(program, resources)
        program.controller = self

    def add_node(self, node, label: Optional[str] = None):
        self._refuse_if_detached()
        return super().add_node(node, label)

    def remove_node(self, name: str) -> None:
        self._refuse_if_detached()
        super().remove_node(name)

    def resize(self, label: str, size: int) -> None:
        self._refuse_if_detached()
        super().resize(label, size)

    def _refuse_if_detached(self) -> None:
        if self.detached:
            raise RuntimeError(f'Program {self.program_name!r} runs detached, supervised by its '
                               'coordinator pod, not by this process: a node\'s lp.resize or its '
                               'scaling policy resizes it.')


def _create(api, plan: LaunchPlan, *, nodes_owned_by_coordinator: bool = False) -> None:
    """Creates the root object, then everything else owned by it (node pods by the coordinator
    pod, or its Job, if `nodes_owned_by_coordinator`: deleting the program then deletes them
    once the coordinator has stopped them); undoes it all on an error."""
    created: List[Mapping[str, Any]] = []
    try:
        root = api.create(plan.documents[0])
        created.append(plan.documents[0])
        plan.owner = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': plan.run,
                      'uid': root['metadata']['uid']}
        coordinator = None
        for document in plan.documents[1:]:
            is_node_pod = (document['kind'] == 'Pod'
                           and document['metadata']['labels'].get(ROLE_LABEL) == 'node')
            owner = coordinator if is_node_pod and coordinator is not None else plan.owner
            document['metadata']['ownerReferences'] = [owner]
            made = api.create(document)
            created.append(document)
            if nodes_owned_by_coordinator and document['metadata']['name'] == \
                    plan.coordinator_pod and document['kind'] in ('Pod', 'Job'):
                coordinator = {'apiVersion': document['apiVersion'], 'kind': document['kind'],
                               'name': plan.coordinator_pod, 'uid': made['metadata']['uid']}
    except BaseException:
        _delete(api, created, 'after the failed launch')
        raise


def _create_owned(api, plan: LaunchPlan, documents, created: List[Mapping[str, Any]]) -> None:
    """Creates `documents`, owned by the launch's root, adding each to `created`."""
    for document in documents:
        document['metadata']['ownerReferences'] = [plan.owner]
        api.create(document)
        created.append(document)


def _delete(api, documents: Sequence[Mapping[str, Any]], when: str) -> None:
    """Deletes `documents` (pods at once), last first, logging what could not be deleted."""
    for document in reversed(documents):
        try:
            api.delete(document['kind'], document['metadata']['name'], grace_period_seconds=0)
        except Exception as e:  # pylint: disable=broad-except
            logging.error('Could not delete %s %s %s: %s', document['kind'],
                          document['metadata']['name'], when, e)


def program_to_manifests(program: Program, *, image: str, path: Optional[str] = None,
                         resources: Optional[Mapping[str, Union[KubernetesResources,
                                                                 Resources]]] = None,
                         notice_period: float = 10.0, **options) -> str:
    """The YAML of the objects that run `program` on Kubernetes (written to `path` if given).

    Takes the keyword arguments of `lp.launch(..., launch_type='kubernetes')`. Apply the result
    with `kubectl apply -f FILE`; delete it with the command in its first comment.
    """
    launch_options = LaunchOptions('kubernetes', dict(resources or {}),
                                   notice_period=notice_period, extra={'image': image, **options})
    KubernetesLauncher().check(program, launch_options)
    config = launch_options.settings
    plan = plan_launch(program, launch_options)
    header = (f'# launchpad program {program.name!r}, launch {plan.run}.\n'
              f'# Follow: {plan.logs_command()}\n'
              f'# Delete: kubectl -n {plan.namespace} delete pods,services,configmaps,secrets'
              f'{",serviceaccounts,roles,rolebindings" if config.create_rbac else ""} '
              f'-l {plan.selector()}\n')
    text = header + to_yaml(plan.documents)
    if path is not None:
        with open(path, 'w') as f:
            f.write(text)
    return text


class PodRunner(Runner):
    """Follows the program's pods through the API for the controller, and restarts a node by
    creating its pod again.

    It reports what the pods show to `mirror`, the launcher's own view of the program's state: the
    program's coordinator runs in its pod, which the launcher may not be able to reach.
    """

    POLL_SECONDS = 1.0
    LOG_DRAIN_SECONDS = 10.0  # how long release() waits, in all, for the logs' last lines
    FOLLOWER_WAIT = 2.0  # how long a poll waits, in all, for those of the pods that ended in it

    def __init__(self, api, plan: LaunchPlan, mirror: Coordinator, config: KubernetesConfig,
                 notice_period: float, *, clock: Callable[[], float] = time.monotonic):
        self._api = api
        self._plan = plan
        self._mirror = mirror
        self._config = config
        self._grace = grace_period(notice_period)
        self._clock = clock
        self._codes: Dict[str, Optional[int]] = {name: None for name in plan.node_pods}
        self._listed_at: Optional[float] = None
        self._stop_sent = False
        self._unschedulable_since: Dict[str, float] = {}
        self._followers: Dict[str, threading.Thread] = {}
        self._followers_due: Optional[float] = None  # (`_join_follower`, in this poll)
        self._colors = {pod: i for i, pod in enumerate([plan.coordinator_pod]
                                                       + list(plan.node_pods.values()))}
        self._notice_period = notice_period
        self._leaving: Dict[str, str] = {}  # leave pod -> the node it removes
        # Removed nodes to kill once the coordinator has told them -> when (at the latest
        # pending_timeout after the kill was due, should their leave pod never run).
        self._kill_later: Dict[str, float] = {}
        self._calling = threading.Lock()  # held by the monitor thread's API calls in `poll`
        self._let_go = False
        self._uids: Dict[str, Optional[str]] = {}  # node -> the uid of its pod, as last listed
        # Detached: restarting nodes -> the uid of the pod that ended, until the coordinator
        # pod has created a new one.
        self._replaced: Dict[str, Optional[str]] = {}

    def check_add(self, label: str) -> None:
        """Any group of an attached launch can grow."""
        if self._config.detach:
            raise NotImplementedError('a detached Kubernetes launch cannot add nodes: no '
                                      'launcher stays to create their pods')

    def add_executable(self, label: str, executable, policy) -> None:
        """Creates the pod of a node added to the running program, made as the launch made its
        pods (labels, owner, DNS name, image, env, token; `LaunchPlan.add_node`); its first init
        container joins it to the coordinator pod before the node starts."""
        self.check_add(label)
        created: List[Mapping[str, Any]] = []
        try:
            _create_owned(self._api, self._plan,
                          self._plan.add_node(label, executable, policy), created)
        except BaseException:
            _delete(self._api, created, f'after failing to add {executable.name}')
            self._plan.forget(executable.name)
            raise
        self._codes[executable.name] = None
        self._colors[self._plan.node_pods[executable.name]] = len(self._colors)

    def remove(self, name: str) -> None:
        """Tells the coordinator pod that node `name` is removed, through a short pod of the
        program (`pod.py leave`): the launcher may not reach the coordinator, its pods can. The
        node's worker sees the removal where it watches for the stop, runs its stop handlers and
        ends within the notice period; its pod is then deleted (or `kill` deletes it)."""
        document = self._plan.leave_pod(name)
        try:
            _create_owned(self._api, self._plan, [document], [])
        except Exception as e:  # pylint: disable=broad-except
            logging.error('Could not create the pod that tells the coordinator %s is removed '
                          '(%s): it is killed after the notice period.', name, e)
            return
        self._leaving[document['metadata']['name']] = name

    def poll(self) -> Dict[str, Optional[int]]:
        """Node name -> its pod's exit code (None while it runs); sends the stop once asked."""
        now = self._clock()
        with self._calling:
            if self._let_go:
                return dict(self._codes)
            if self._listed_at is None or now - self._listed_at >= self.POLL_SECONDS:
                self._listed_at = now
                self._refresh(now)
        if self._mirror.stopping and not self._stop_sent:
            self._stop_sent = True
            # The coordinator turns SIGTERM into the program's stop signal and keeps serving
            # until the nodes have ended or the grace period is over.
            self._api.delete(self._coordinator_kind(), self._plan.coordinator_pod,
                             grace_period_seconds=self._grace)
        return dict(self._codes)

    def let_go(self) -> None:
        """Stops following a detached launch's pods (when this process exits: an API call in
        flight on the monitor thread while the interpreter finalizes aborts it); waits for the
        call in flight."""
        with self._calling:
            self._let_go = True

    def restart(self, name: str) -> None:
        """Creates the node's pod again (same name, so same DNS name), once the old one is gone;
        in a detached launch the coordinator pod does that, and this waits for its new pod."""
        pod_name = self._plan.node_pods[name]
        if self._config.detach:
            self._replaced[name] = self._uids.get(name)
        else:
            recreate_pod(self._api, self._plan.pod_document(pod_name), clock=self._clock)
        self._codes[name] = None
        self._followers.pop(pod_name, None)  # the new container's log is followed anew
        self._unschedulable_since.pop(name, None)

    def kill(self, names: Sequence[str]) -> None:
        """Deletes the named nodes' pods at once, and the coordinator pod unless every named
        node is one being removed (past its notice period). A removed node whose leave pod has
        not told the coordinator yet gets its notice period from when it has."""
        for name in names:
            if (not self._mirror.stopping and self._mirror.has_left(name)
                    and name in self._leaving.values()):
                self._kill_later[name] = self._clock() + self._config.pending_timeout
                continue
            self._api.delete('Pod', self._plan.node_pods[name], grace_period_seconds=0)
        if not names or not all(self._mirror.has_left(name) for name in names):
            self._api.delete(self._coordinator_kind(), self._plan.coordinator_pod,
                             grace_period_seconds=0)

    def _coordinator_kind(self) -> str:
        """'Job' if the coordinator pod is a Job's (`coordinator_job`: deleting the Job ends
        its pod, whose coordinator then stops the program), else 'Pod'."""
        return next((d['kind'] for d in self._plan.documents if d['kind'] == 'Job'), 'Pod')

    def release(self) -> None:
        """Deletes every object of the launch, unless it is detached."""
        if self._config.detach:
            return
        # The ended pods' last lines are printed before wait() returns: a log stream can lag its
        # container's end by seconds on a loaded node, more than the poll's short join allows.
        deadline = time.monotonic() + self.LOG_DRAIN_SECONDS
        for thread in self._followers.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        problems = []
        for pod_name in self._leaving:
            self._api.delete('Pod', pod_name, grace_period_seconds=0)
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
        self._followers_due = None
        pods = {pod['metadata']['name']: pod for pod in self._api.list_pods(self._plan.selector())}
        self._follow(self._plan.coordinator_pod, COORDINATOR_CONTAINER,
                     pods.get(self._plan.coordinator_pod))
        for name, pod_name in list(self._plan.node_pods.items()):
            if self._codes[name] is None:
                pod = pods.get(pod_name)
                uid = (pod or {}).get('metadata', {}).get('uid')
                if name in self._replaced:
                    if pod is None or uid == self._replaced[name]:
                        continue  # the coordinator pod has not created it again yet
                    del self._replaced[name]
                self._uids[name] = uid
                self._codes[name] = self._inspect(name, pod_name, pod, now)
                if self._codes[name] is not None and self._mirror.has_left(name):
                    _delete(self._api, self._plan.forget(name), f'of removed node {name}')
        self._end_leave_pods(pods)
        coordinator = pods.get(self._plan.coordinator_pod)  # (a Job's pods: the Job remakes them)
        if ((coordinator is None or terminated(coordinator, COORDINATOR_CONTAINER))
                and self._coordinator_kind() == 'Pod'
                and not self._mirror.stopping and None in self._codes.values()):
            self._mirror.request_stop(f'the coordinator pod {self._plan.coordinator_pod} ended')

    def _end_leave_pods(self, pods: Mapping[str, Mapping[str, Any]]) -> None:
        """Deletes the leave pods that ended, saying why if one failed."""
        for pod_name, name in list(self._leaving.items()):
            pod = pods.get(pod_name)
            ended = terminated(pod, NODE_CONTAINER) if pod is not None else None
            if pod is not None and ended is None:
                continue
            if ended is not None and ended.get('exitCode') != 0:
                logging.error('Could not tell the coordinator that %s is removed (pod %s '
                              'exited with code %s): it is killed after the notice period.\n%s',
                              name, pod_name, ended.get('exitCode'),
                              self._api.read_log(pod_name, NODE_CONTAINER, tail_lines=30))
            del self._leaving[pod_name]
            self._api.delete('Pod', pod_name, grace_period_seconds=0)
            if name in self._kill_later:
                self._kill_later[name] = min(self._kill_later[name],
                                             self._clock() + self._notice_period)
        for name, due in list(self._kill_later.items()):
            if self._clock() >= due:
                del self._kill_later[name]
                if self._codes.get(name) is None:
                    logging.warning('Killing %s: still running %g s after its removal.', name,
                                    self._notice_period)
                    self._api.delete('Pod', self._plan.node_pods[name], grace_period_seconds=0)

    def _inspect(self, name: str, pod_name: str, pod: Optional[Mapping[str, Any]],
                 now: float) -> Optional[int]:
        """The node's exit code once its pod has ended (failing the program if it failed; a
        removed node's end is no failure)."""
        if pod is not None and self._mirror.has_left(name):
            ended = terminated(pod, NODE_CONTAINER)
            if ended is not None:
                self._join_follower(pod_name)
                return int(ended.get('exitCode', 1))
        if pod is None and self._mirror.has_left(name):
            return -signal.SIGKILL  # killed after its notice period
        if pod is None:
            self._fail(name, f'its pod {pod_name} was deleted')
            return -signal.SIGKILL
        self._follow(pod_name, NODE_CONTAINER, pod)
        status = pod.get('status') or {}
        ended = terminated(pod, NODE_CONTAINER)
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
            ended = terminated(pod, init['name'], init=True)
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
                source = self._api.open_log(pod_name, container)
                if pod_name == self._plan.coordinator_pod:
                    source = _SizeRequests(source, self._mirror)
                copy_lines(source, prefix)
            except Exception as e:  # pylint: disable=broad-except
                logging.debug('Stopped following the log of %s: %s', pod_name, e)

        thread = threading.Thread(target=copy, name=f'lp-log-{pod_name}', daemon=True)
        self._followers[pod_name] = thread
        thread.start()

    def _join_follower(self, pod_name: str) -> None:
        """Waits for the log follower of a pod that ended, so that its last lines are printed
        before it counts as ended: the followers of the pods that ended in one poll wait
        together, FOLLOWER_WAIT seconds in all (each its own, one after another, added up)."""
        thread = self._followers.get(pod_name)
        if thread is None:
            return
        if self._followers_due is None:
            self._followers_due = time.monotonic() + self.FOLLOWER_WAIT
        thread.join(max(0.0, self._followers_due - time.monotonic()))


class _SizeRequests:
    """The coordinator pod's log as `copy_lines` reads it, passing the group sizes that nodes
    ask for (`lp.resize`; `names.SIZE_REQUEST` lines) on to the launcher's coordinator, whose
    controller resizes the group."""

    def __init__(self, source, mirror: Coordinator):
        self._source = source
        self._mirror = mirror
        self._marker = SIZE_REQUEST.encode()

    def readline(self) -> bytes:
        line = self._source.readline()
        if line.startswith(self._marker):
            try:
                label, size = json.loads(line[len(self._marker):])
                self._mirror.request_size(label, size)
            except (ValueError, TypeError) as e:
                logging.error('Unreadable group size request in the coordinator\'s log: %r (%s)',
                              line, e)
        return line

    def close(self) -> None:
        self._source.close()


def _delete_command(plan: LaunchPlan) -> str:
    return f'kubectl -n {plan.namespace} delete configmap {plan.run}'


def _detached_summary(plan: LaunchPlan) -> str:
    kinds: Dict[str, int] = {}
    for document in plan.documents:
        kinds[document['kind']] = kinds.get(document['kind'], 0) + 1
    created = ', '.join(f'{count} {kind}' for kind, count in kinds.items())
    return (f'Launched {plan.run} in namespace {plan.namespace} ({created}).\n'
            f'  Follow: kubectl -n {plan.namespace} get pods -l {plan.selector()} --watch\n'
            f'  Logs:   {plan.logs_command()}\n'
            f'  Delete: {_delete_command(plan)}   (every other object is owned by it)')
