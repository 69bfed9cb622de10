"""The names the launching machine and the pods agree on: labels, annotations, container names,
paths inside pods, the pod module's commands, the coordinator pod's settings and the rules for DNS
names.

Imported on both sides (the manifests and the launcher on the launching machine, `pod.py` inside the
pods); it imports nothing of launchpad.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Dict, List, Optional

INSTALL_HINT = "pip install 'launchpad-ml[kubernetes]'"

# Labels and annotations. Every object carries the program label (value: the launch name); all
# but the RBAC objects also a role label (program, token, dns, spec, coordinator or node).
PROGRAM_LABEL = 'launchpad.dev/program'
ROLE_LABEL = 'launchpad.dev/role'
NODE_LABEL = 'launchpad.dev/node'                # a node's name made a label value: 'group-index'
NODE_NAME_ANNOTATION = 'launchpad.dev/node-name'  # a node's name as it is: 'group/index'
MANAGED_BY = {'app.kubernetes.io/managed-by': 'launchpad'}

# Containers, and where the executable is mounted (SPEC_DIR/spec) or its parts joined from.
NODE_CONTAINER = 'node'
COORDINATOR_CONTAINER = 'coordinator'
WAIT_CONTAINER = 'wait-for-coordinator'
JOIN_CONTAINER = 'join-spec'
SPEC_DIR = '/launchpad/spec'
# Where node pods mount the volume named by `checkpoint_volume=` (each launch keeps its own
# directory in it, named after the launch).
CHECKPOINT_DIR = '/launchpad/checkpoints'
PARTS_DIR = '/launchpad/parts'
# Where the coordinator pod of a program no launcher follows mounts the ConfigMap RUN-pods: the
# node pods' manifests, from which it creates a failed node's pod again.
PODS_DIR = '/launchpad/pods'
# Where the coordinator pod of a program no launcher follows mounts the volume named by
# `runs_volume=` and keeps the program's run directory (`launchpad.observe.runstore`).
RUNS_DIR = '/launchpad/runs'
# Where the coordinator pod of a program no launcher follows keeps the state its restarted
# container re-adopts the running nodes from (an emptyDir: it lasts as long as the pod).
STATE_DIR = '/launchpad/state'

# The commands of the pod module (`python -m POD_MODULE COMMAND ARGS`, see `pod_command`).
POD_MODULE = 'launchpad.launch.kubernetes.pod'
COORDINATOR_COMMAND = 'coordinator'  # SETTINGS (CoordinatorSettings as JSON)
JOIN_PARTS_COMMAND = 'join-parts'    # DIR FILE
WAIT_FOR_COMMAND = 'wait-for'        # HOST PORT LIMIT [--join JOIN] (JOIN: `Joining` as JSON)
LEAVE_COMMAND = 'leave'              # HOST PORT LIMIT NODE
PROBE_COMMAND = 'probe'              # SOCKET REQUEST (JSON: names, kinds, timeout)
# Where the coordinator pod serves its coordinator's probes of nodes to commands run in its
# container (`kubectl exec`, the launcher's `probes`), and to nothing else.
PROBE_SOCKET = '/tmp/launchpad-probes.sock'
# In a detached launch, the coordinator pod's private registry (`launchpad.observe.registry`):
# its observer, with the control `lp.attach` calls, serves `<run>.sock` there, which the
# launching machine reaches through the API's exec (`reach`). UNKEPT_RUNS_DIR: where its run
# file goes when no `runs_volume` is named (lost with the container).
OBSERVER_DIR = '/tmp/launchpad-observer'
UNKEPT_RUNS_DIR = '/tmp/launchpad-runs'

# What the coordinator pod prints when a node asks for a group size (`lp.resize`): the attached
# launcher, which follows that log, reads it there and resizes the group.
SIZE_REQUEST = 'launchpad: a node asked for group size '  # + JSON [label, size]
LEAVE_ROLE = 'leave'  # the role label of a pod that tells the coordinator a node is removed

DNS_LABEL = re.compile(r'[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?')


def pod_command(python: str, command: str, *args: str) -> List[str]:
    """The command line that runs `command` of the pod module with `python` inside a pod."""
    return [python, '-m', POD_MODULE, command, *args]


def selector(run: str, role: Optional[str] = None) -> str:
    """The label selector of a launch's objects (only those of `role` if given)."""
    return f'{PROGRAM_LABEL}={run}' + (f',{ROLE_LABEL}={role}' if role else '')


def slug(text: str, limit: int) -> str:
    """`text` as a DNS label fragment: lowercase letters, digits and inner dashes."""
    slug_text = re.sub(r'[^a-z0-9]+', '-', text.lower()).strip('-')[:limit].strip('-')
    return slug_text or 'x'


@dataclasses.dataclass
class CoordinatorSettings:
    """What the coordinator pod is told on its command line (as JSON).

    Attributes:
      run: the launch name.
      namespace: the program's namespace.
      nodes: the names of the program's executables.
      port: the port to serve on.
      notice_period: seconds nodes get to end after the stop signal.
      policies: node name -> its restart policy and progress deadline (`NodePolicy.to_json`).
      addresses: node name -> the ids of the addresses it serves (for the clients of its group).
      recreates_pods: the coordinator pod applies the restart policies itself, creating failed
        node pods again from the manifests at PODS_DIR (no launcher follows the program); else
        an attached launcher does.
      calls: node name -> the nodes it calls; group_calls: node name -> the groups it calls as
        a whole. The stop reaches callers before what they call (`StopOrder`).
      program: the program's name.
      runs_dir: where the coordinator pod keeps the program's run directory (RUNS_DIR, for a
        detached launch with `runs_volume=`), or None: it keeps none (an attached launcher
        does).
      state_dir: where the coordinator pod keeps what a restarted coordinator container
        re-adopts the running nodes from (STATE_DIR, with `recreates_pods`), or None.
      job: with `recreates_pods`, the coordinator pod's Job (`coordinator_job`), whose next pod
        re-adopts the nodes from the state kept in the Secret RUN-state.
    """
    run: str
    namespace: str
    nodes: List[str]
    port: int
    notice_period: float
    policies: Dict[str, Any] = dataclasses.field(default_factory=dict)
    addresses: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    recreates_pods: bool = False
    calls: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    group_calls: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    program: str = ''
    runs_dir: Optional[str] = None
    state_dir: Optional[str] = None
    job: Optional[str] = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CoordinatorSettings:
        return cls(**json.loads(text))


@dataclasses.dataclass
class Joining:
    """A node added to a running program, as its pod's first init container tells the coordinator
    (`wait-for ... --join JSON`) before the node starts.

    Attributes:
      node: the executable's name, 'group/index'.
      policy: its restart policy and progress deadline (`NodePolicy.to_json`).
      endpoints: address id -> 'host:port' of each address it serves (static, as at launch).
    """
    node: str
    policy: Dict[str, Any]
    endpoints: Dict[str, str]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Joining:
        return cls(**json.loads(text))
