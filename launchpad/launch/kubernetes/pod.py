"""What runs inside a program's pods besides the nodes: `python -m launchpad.launch.kubernetes.pod`.

    coordinator SETTINGS      the coordinator pod's main: serves the program's coordinator until
                              the program ends (SETTINGS: `names.CoordinatorSettings` as JSON);
    wait-for HOST PORT LIMIT [--join JOINING]
                              a node pod's first init container: waits until the coordinator
                              accepts connections, and fails after LIMIT seconds; a node added
                              to the running program also joins it there (JOINING:
                              `names.Joining` as JSON), before the node starts;
    leave HOST PORT LIMIT NODE
                              a short pod the launcher creates to remove NODE: the coordinator
                              gives the node the stop (the launcher cannot reach the coordinator,
                              but a pod of the program can, as the joining nodes do);
    join-parts DIR FILE       a node pod's second init container when its executable is split over
                              several ConfigMaps: joins DIR/part-*/spec into FILE;
    probe SOCKET REQUEST      run in the coordinator container by the attached launcher (through
                              the API's exec: `probes`): asks the nodes live for their stacks,
                              calls or numbers through the coordinator, which serves probes on
                              the Unix socket SOCKET of its container only; prints the answers
                              as JSON (REQUEST: {"names", "kinds", "timeout"} as JSON).

`manifests.py` writes these commands (`names.pod_command`). The package does not import this
module, so that `-m` runs it as a fresh main module.

Threads of the coordinator pod:

  * the main thread runs `run_coordinator`: it announces the stop, gives up waiting for the nodes
    once the notice period is over, and every `PodWatcher.INTERVAL` seconds asks the API for node
    pods that ended without reporting (when the pod's service account may list pods);
  * in a program no launcher follows (`CoordinatorSettings.recreates_pods`: a detached launch),
    a `Controller` over an `InClusterRunner` does that instead, on its monitor thread: it also
    creates the pods of failed nodes again as their restart policies say, grows and shrinks
    elastic groups (nodes' `lp.resize`, the scaling policy), and deletes the pods still running
    a notice period after the stop; it keeps the program's state in the pod, from which a
    coordinator container started again after a death re-adopts the running node pods
    (`readopt`);
  * courier's server threads answer the nodes (each node keeps a `wait_for_stop` call open);
  * deleting the pod sends SIGTERM; its handler raises the stop signal from a new thread rather
    than take the coordinator's lock inside a signal handler (unless only the pod of the
    coordinator's Job is lost, `coordinator_job`: it then exits and the next pod takes over).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from launchpad.launch.controller import Controller
from launchpad.launch.kubernetes import coordinator_job, names, readopt
from launchpad.launch.kubernetes.api import KubernetesApi, KubernetesError, terminated
from launchpad.launch.kubernetes.in_cluster import (GROWTH_KEY, POD_MANIFESTS_KEY,
                                                    InClusterRunner, read_growth,
                                                    read_pod_manifests)
from launchpad.observe import registry
from launchpad.policy import NodePolicy
from launchpad.process import coordinator as coordination
from launchpad.process import faces
from launchpad.process.coordinator import Coordinator
from launchpad.process.stop_order import StopOrder


def wait_for(host: str, port: int, limit: float,
             joining: Optional[names.Joining] = None) -> None:
    """Returns once HOST:PORT accepts connections (after telling it that `joining` joins the
    program); exits with code 1 after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        try:
            socket.create_connection((host, port), timeout=2.0).close()
            if joining is not None:
                _coordinator(host, port).join(joining.node, joining.policy, joining.endpoints)
            return
        except OSError as e:
            if time.monotonic() > deadline:
                sys.exit(f'launchpad: the coordinator {host}:{port} was not reachable within '
                         f'{limit:g} s ({e}); is its pod running?')
            time.sleep(0.2)


def leave(host: str, port: int, limit: float, node: str) -> None:
    """Tells the coordinator at HOST:PORT that `node` is removed from the program."""
    wait_for(host, port, limit)
    _coordinator(host, port).leave(node)
    print(f'told the coordinator that {node} leaves the program', flush=True)


def _coordinator(host: str, port: int):
    import courier  # pylint: disable=import-outside-toplevel
    return courier.Client(f'{host}:{port}', call_timeout=30.0)  # COURIER_AUTH_TOKEN from the env


def serve_probes(coordinator: Coordinator, path: str):
    """Serves `coordinator.probe` on the Unix socket `path`, for commands run in this container
    (`probe`); returns the started server, or None (said in the log) if it cannot."""
    import courier  # pylint: disable=import-outside-toplevel
    try:
        if os.path.exists(path):
            os.unlink(path)  # an earlier coordinator's, in a restarted container
        server = courier.Server(address=f'unix:{path}', thread_pool_size=4)
        server.Bind('probe', coordinator.probe)
        server.Start()
    except OSError as e:
        print(f'cannot serve probes of the nodes ({e}): `stacks`, `waits` and `top` will not '
              'reach them', flush=True)
        return None
    return server


def probe(path: str, request: str) -> None:
    """Prints, as JSON, the coordinator's live answers of the nodes to `request` ({'names',
    'kinds', 'timeout'} as JSON), asked over its probe socket `path`."""
    import courier  # pylint: disable=import-outside-toplevel
    asked = json.loads(request)
    client = courier.Client(f'unix:{path}', call_timeout=float(asked['timeout']) + 10.0)
    print(json.dumps(client.probe(asked['names'], asked['kinds'], float(asked['timeout']))),
          flush=True)


def join_parts(source: str, target: str) -> None:
    """Writes the files `source`/part-*/spec, in the order of their names, into file `target`."""
    with open(target, 'wb') as out:
        for part in sorted(p for p in os.listdir(source) if p.startswith('part-')):
            with open(os.path.join(source, part, 'spec'), 'rb') as f:
                out.write(f.read())


class PodFace(faces.NodeFace, Protocol):
    """What the pods of a program call: the node face, and the joining and leaving of nodes
    (the launcher may not reach the coordinator pod, its pods can)."""

    def join(self, name: str, policy: dict, endpoints: Dict[str, str]) -> None:
        """Node `name`, added to the running program, joins it."""

    def leave(self, name: str) -> None:
        """Node `name` is removed from the program."""


class PodCoordinator(Coordinator):
    """The coordinator of a program on Kubernetes (it serves `PodFace`): says in its log which
    node failed and why. `followed`: an attached launcher reads its log (and resizes groups);
    `resizes`: the controller in this pod resizes them."""

    def __init__(self, *args, followed: bool = True, resizes: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._followed = followed
        self._resizes = resizes

    def node_failed(self, name: str, message: str, traceback_text: str = '') -> None:
        print(f'node {name} failed: {message}', flush=True)
        super().node_failed(name, message, traceback_text)

    def join(self, name: str, policy: dict, endpoints: Dict[str, str]) -> None:
        """Node `name`, added to the running program, joins it: it becomes a pending node with
        `policy`, a member of its group serving `endpoints` (address id -> host:port), which
        nodes started before it look up here. Its pod's init container calls this, again when
        the pod is created again for a restart (a known node is left as it is)."""
        if name not in self.status():
            self.add_nodes([name], policies={name: NodePolicy.from_json(policy)})
            print(f'node {name} joins the program', flush=True)
        for address_id, endpoint in endpoints.items():
            self.publish_address(address_id, endpoint)
        self.set_node_addresses({name: list(endpoints)})

    def leave(self, name: str) -> None:
        """Node `name` is removed from the program (a leave pod calls this)."""
        self.remove_node(name)

    def request_size(self, label: str, size: int) -> None:
        """A node's `lp.resize`: said in this pod's log, where the attached launcher reads it
        (it adds and removes the pods; nothing here can)."""
        super().request_size(label, size)
        if self._followed:
            print(f'{names.SIZE_REQUEST}{json.dumps([label, size])}', flush=True)
        elif self._resizes:
            print(f'a node asked for group {label} to have {size} nodes', flush=True)
        else:
            print(f'a node asked for group {label} to have {size} nodes: ignored, no launcher '
                  'follows this program to create or delete pods', flush=True)


def run_coordinator(settings: names.CoordinatorSettings) -> None:
    """The coordinator pod's main: serves the coordinator until every node has ended."""
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s')
    os.environ[registry.ENV] = names.OBSERVER_DIR  # this container's, for `keep_run`
    runner = in_cluster_runner(settings) if settings.recreates_pods else None
    api = runner.api if runner is not None and settings.job is not None else None
    state = (readopt.read_state(settings.state_dir, api, settings.run)
             if runner is not None else None)
    coordinator, controller = supervise(
        settings, runner, readopt.resume(runner, state) if state is not None else None)
    server = coordination.serve_coordinator(coordinator, f'0.0.0.0:{settings.port}',
                                            face=PodFace)
    if controller is not None and settings.state_dir is not None:
        readopt.keep_state(settings.state_dir, controller, runner,
                           state.get('scaler') if state is not None else None,
                           secret=functools.partial(coordinator_job.write_state, api,
                                                    settings.run) if api is not None else None)
    probes = serve_probes(coordinator, names.PROBE_SOCKET)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(
        target=_terminated, args=(coordinator, api, settings.job)).start())
    print(f'serving the coordinator of {len(settings.nodes)} nodes on port {settings.port}',
          flush=True)
    watcher = None
    if controller is None:
        watcher = PodWatcher(settings.run, settings.namespace, coordinator)
    observer = keep_run(settings, coordinator, controller)
    announced = False
    while not controller.done if controller is not None else coordinator.running():
        if coordinator.stopping and not announced:
            announced = True
            print(f'stopping the program: {coordinator.stop_reason}', flush=True)
        if watcher is not None:
            if time.monotonic() - (coordinator.stop_time or math.inf) > settings.notice_period + 2:
                break
            watcher.check()
        coordinator.wait_for_change(1.0)
    if observer is not None:
        observer.program_ended()  # its last sample, and the run file closed whole
    time.sleep(1.0)  # the last answers reach their nodes
    server.Stop()
    if probes is not None:
        probes.Stop()
    failure = coordinator.failure
    print(f'the program ended{": " + str(failure).splitlines()[0] if failure else ""}', flush=True)


def _terminated(coordinator: Coordinator, api, job: Optional[str]) -> None:
    """This pod is being deleted (SIGTERM): the program stops, unless the pod is a Job's that
    lives on (`coordinator_job.pod_lost_only`: the pod alone is lost, evicted say), whose next
    pod re-adopts the nodes; this coordinator then leaves them as they are."""
    if job is not None and api is not None and coordinator_job.pod_lost_only(api, job):
        print(f'this coordinator pod is being deleted, not its Job {job}: leaving the nodes to '
              'the next pod, which re-adopts them', flush=True)
        os._exit(143)  # (not 0: the Job would count the program as done)
    coordinator.request_stop('the coordinator pod was deleted')


@dataclasses.dataclass
class _Drawn:
    """The program as the observer draws it here, from the settings: its name, no edges (the
    graph's handles are not known in this pod)."""
    name: str
    edges: Tuple = ()


class _CoordinatorView:
    """What the observer reads of a controller, for a program whose coordinator pod has none
    (it cannot create pods): the coordinator's status; `run_coordinator` ends the observing."""

    launch_type = 'kubernetes'
    auth_token = None
    output = None
    done = False
    scaling_log: List = []

    def __init__(self, coordinator: Coordinator):
        self.coordinator = coordinator

    def status(self):
        return self.coordinator.status()


def keep_run(settings: names.CoordinatorSettings, coordinator: Coordinator,
             controller: Optional[Controller] = None):
    """Starts the program's observer; returns it, or None if nothing asks for one.

    It keeps the program's run file in `settings.runs_dir` (the volume `runs_volume` names), as
    `<launch name>/run.sqlite`. In a detached launch it also serves the program, with the
    control `lp.attach` calls (without a `controller`: status and stop only), on its socket in
    the registry (`names.OBSERVER_DIR` in the pod: `run_coordinator`), which the launching
    machine reaches through the API's exec (`reach`); its run file then goes to
    `names.UNKEPT_RUNS_DIR` if no volume was named."""
    if settings.runs_dir is None and not settings.recreates_pods:
        return None
    # pylint: disable=import-outside-toplevel
    from launchpad.launch.supervisor import _Control as Control  # what lp.attach calls
    from launchpad.observe.observer import Observer
    supervisor = controller or _CoordinatorView(coordinator)
    observer = Observer(_Drawn(settings.program or settings.run),  # type: ignore[arg-type]
                        supervisor, program_id=settings.run,  # type: ignore[arg-type]
                        served=Control(supervisor).methods() if settings.recreates_pods
                        else None,
                        # marks it detached (`lp.attach`); nothing replaces this process
                        entry_fields={'keeper_pid': os.getppid()} if settings.recreates_pods
                        else None,
                        runs_dir=pathlib.Path(settings.runs_dir or names.UNKEPT_RUNS_DIR)).start()
    if controller is not None:
        controller.observer = observer  # which tells it when the program has ended
    print(f'keeping the run file in {observer.describe()["run_dir"]}', flush=True)
    if observer.entry is not None and settings.recreates_pods:
        print(f'serving the program to `python -m launchpad.launch` on '
              f'{observer.entry.address}', flush=True)
    return observer


def supervise(settings: names.CoordinatorSettings, runner: Optional[InClusterRunner],
              readopted: Optional[PodCoordinator] = None
              ) -> Tuple[PodCoordinator, Optional[Controller]]:
    """The program's coordinator (stopping it in graph order; `readopted`: the one an earlier
    container of this pod kept, `readopt`) and, with a `runner` (a program no launcher
    follows), the controller that supervises it here: it restarts nodes, ends stragglers and,
    with the program (`runner.growth`), resizes groups and runs the scaling policy."""
    policies = {name: NodePolicy.from_json(policy) for name, policy in settings.policies.items()}
    if settings.recreates_pods and runner is None:  # nothing here can create pods
        policies = {name: policy.without_restarts() for name, policy in policies.items()}
    growth = runner.growth if runner is not None else None
    coordinator = readopted if readopted is not None else PodCoordinator(
        settings.nodes, policies=policies, followed=not settings.recreates_pods,
        resizes=growth is not None, groups=growth.program.group_limits() if growth else None,
        stop_order=StopOrder(settings.calls, settings.notice_period / 2,
                             group_calls=settings.group_calls))
    if readopted is None:
        coordinator.set_node_addresses(settings.addresses)
    if runner is None:
        return coordinator, None
    controller = Controller(settings.run, coordinator, runner, launch_type='kubernetes',
                            notice_period=settings.notice_period, poll_interval=0.2)
    if growth is not None:
        controller.attach(growth.program, growth.resources)
    if readopted is not None:
        print(f're-adopted the {len(coordinator.status())} nodes of the program from the state '
              f'an earlier coordinator kept in {settings.state_dir}', flush=True)
    print('restarting failed nodes here: no launcher follows the program', flush=True)
    return coordinator, controller


def in_cluster_runner(settings: names.CoordinatorSettings, api=None,
                       pods_dir: str = names.PODS_DIR) -> Optional[InClusterRunner]:
    """The runner that lets this pod restart nodes, or None (saying why) if it cannot; `api`
    and `pods_dir`: where the API and the mounted ConfigMap RUN-pods are (default: as in a
    pod)."""
    try:
        api = api or KubernetesApi(settings.namespace, in_cluster=True)
        manifests = read_pod_manifests(os.path.join(pods_dir, POD_MANIFESTS_KEY))
        node_pods = {pod['metadata']['annotations'][names.NODE_NAME_ANNOTATION]: name
                     for name, pod in manifests.items()}
    except (ImportError, KubernetesError, OSError, ValueError) as e:
        print(f'cannot restart failed nodes, their failures are final: {e}', flush=True)
        return None
    growth = None
    try:
        growth = read_growth(os.path.join(pods_dir, GROWTH_KEY))
    except Exception as e:  # pylint: disable=broad-except
        print(f'groups do not grow or shrink here: unpickling the program failed: {e}',
              flush=True)
    else:
        if growth is None:
            print('groups do not grow or shrink here: the program did not fit beside the pods\' '
                  'manifests', flush=True)
    return InClusterRunner(api, settings.run, manifests, node_pods, growth=growth,
                           job=settings.job)


class PodWatcher:
    """In the coordinator pod: notices node pods that died without reporting (needs RBAC).

    Without a Kubernetes client or an in-cluster configuration it says so once and watches
    nothing; an attached launcher still notices such pods.
    """

    INTERVAL = 2.0

    def __init__(self, run: str, namespace: str, coordinator: Coordinator):
        self._coordinator = coordinator
        self._selector = names.selector(run, role='node')
        self._checked_at = 0.0
        self._api = None
        try:
            self._api = KubernetesApi(namespace, in_cluster=True)
        except (ImportError, KubernetesError) as e:
            print(f'not watching the node pods ({e}); a pod that dies without reporting is '
                  'noticed by an attached launcher only.', flush=True)

    def check(self) -> None:
        """Reports every node whose pod has ended while the coordinator thinks it runs (at most
        once per INTERVAL); stops watching for good if the API refuses."""
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
            name = ((pod.get('metadata') or {}).get('annotations') or {}).get(
                names.NODE_NAME_ANNOTATION)
            ended = terminated(pod, names.NODE_CONTAINER)
            if name in self._coordinator.running() and ended is not None:
                print(f'node {name}: its pod ended ({ended.get("reason", "")}, exit code '
                      f'{ended.get("exitCode")}) without reporting', flush=True)
                self._coordinator.executable_exited(name, int(ended.get('exitCode', 1)))


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Runs the pod command of `argv` (default: the command line)."""
    parser = argparse.ArgumentParser(prog=f'python -m {names.POD_MODULE}',
                                     description='What runs in the pods of a launchpad program.')
    commands = parser.add_subparsers(dest='command', required=True)
    command = commands.add_parser(names.COORDINATOR_COMMAND, help='serve the coordinator')
    command.add_argument('settings', type=names.CoordinatorSettings.from_json)
    command.set_defaults(run=lambda args: run_coordinator(args.settings))
    command = commands.add_parser(names.WAIT_FOR_COMMAND, help='wait for the coordinator')
    command.add_argument('host')
    command.add_argument('port', type=int)
    command.add_argument('limit', type=float, help='seconds')
    command.add_argument('--join', type=names.Joining.from_json,
                         help='the node added to the running program (names.Joining as JSON)')
    command.set_defaults(run=lambda args: wait_for(args.host, args.port, args.limit, args.join))
    command = commands.add_parser(names.LEAVE_COMMAND, help='remove a node from the program')
    command.add_argument('host')
    command.add_argument('port', type=int)
    command.add_argument('limit', type=float, help='seconds')
    command.add_argument('node', help='the node\'s name, group/index')
    command.set_defaults(run=lambda args: leave(args.host, args.port, args.limit, args.node))
    command = commands.add_parser(names.PROBE_COMMAND, help='probe the nodes live (JSON out)')
    command.add_argument('socket', help="the coordinator's probe socket")
    command.add_argument('request', help='{"names", "kinds", "timeout"} as JSON')
    command.set_defaults(run=lambda args: probe(args.socket, args.request))
    command = commands.add_parser(names.JOIN_PARTS_COMMAND, help='join an executable\'s parts')
    command.add_argument('source', help='the directory holding part-*/spec')
    command.add_argument('target', help='the file to write')
    command.set_defaults(run=lambda args: join_parts(args.source, args.target))
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == '__main__':
    main()
