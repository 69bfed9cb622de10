"""`kubernetes`: every executable of a program runs in its own pod of a Kubernetes cluster.

    lp.launch(program, launch_type='kubernetes', image='registry.example/team/agent:v3',
              namespace='research', resources={'learner': lp.KubernetesResources(gpus=1)})

Objects. A launch named RUN (the program name and six random hex digits) creates, all labelled
`launchpad.dev/program=RUN`:
  * ConfigMap RUN: the program's root object; every other object names it as its owner, so
    `kubectl delete configmap RUN` deletes the whole program (the launcher does this when it ends);
  * Secret RUN-token: the program's courier auth token, given to every pod as COURIER_AUTH_TOKEN;
  * Service RUN: headless, so pod P has the stable DNS name P.RUN.NAMESPACE.svc.CLUSTER_DOMAIN;
  * Pod RUN-coordinator: the program's coordinator, served with courier (see below), running
    `python -m launchpad.launch.kubernetes.pod coordinator SETTINGS`;
  * per executable, Pod RUN-GROUP-K running `python -m launchpad.process.worker SPEC`, and
    ConfigMap(s) RUN-GROUP-K-spec-N holding its pickled `WorkerSpec`.
Every pod has a network namespace of its own, so the address table is static: the J-th address of
a pod is `POD_DNS_NAME:port+J` (a fixed port cannot collide with another pod's). Pods use
`restartPolicy: Never`: a node that fails ends the program, as on every other platform.

Where the coordinator lives. Nodes must reach the coordinator for published addresses, the stop
signal and failure reports, and pods generally cannot reach the machine that launched them (it sits
behind NAT, a VPN or a laptop's sleep). So the coordinator runs in the cluster, in a small pod of its
own that nodes reach through the Service like any other node; each node pod first waits for it in an
init container (`... pod wait-for HOST PORT LIMIT`). The launcher then needs nothing but the API
server: it follows pod phases, exit codes, events and logs there, and stops the program by deleting
the coordinator pod gracefully (its SIGTERM handler raises the stop signal; nodes get the notice
period; pods that outlive it are deleted). The program therefore survives the launcher going away
(`detach=True` relies on that), and `lp.stop()` in any pod ends it without the launcher.

Restarts. An attached launcher creates a failed node's pod again as its restart policy says. In a
program no launcher follows (detached), the coordinator pod does, when it has a service account: a
controller runs there over `in_cluster.InClusterRunner`, which recreates pods from the manifests
the launch left in ConfigMap RUN-pods. That coordinator pod has `restartPolicy: OnFailure`: a
coordinator that dies is started again in the same pod and re-adopts the running node pods from
the state it kept there (`readopt`); the nodes wait `supervisor_grace` for it.

Elastic groups. An attached launcher adds a node by creating its pod as the launch did
(`LaunchPlan.add_node`); the pod's first init container joins it to the coordinator pod. It removes
one through a short pod that tells the coordinator (`pod.py leave`), then deletes the node's pod; a
node's `lp.resize` reaches it as a line of the coordinator pod's log (`names.SIZE_REQUEST`). In a
detached program the coordinator pod's controller does all this itself, with the program and the
launch's plan from RUN-pods (`in_cluster.Growth`), and runs the scaling policy; the pods of the
nodes it adds take names the launch set aside (`LaunchPlan.added_pods`).

The stop reaches callers before the nodes they call (`CoordinatorSettings.calls`, the coordinator
pod's `StopOrder`). A detached launch's node pods are owned by the coordinator pod, so that
deleting the program deletes them only once the coordinator has stopped them in that order.

Executables. Kubernetes caps a ConfigMap's data at 1 MiB (1,048,576 bytes, the API server's
validation limit, below etcd's 1.5 MiB request limit). Each executable gets ConfigMaps of its own,
holding at most `SPEC_CHUNK_BYTES` each; a spec larger than one chunk is split over up to
`MAX_SPEC_CHUNKS` ConfigMaps and joined again by an init container (`... pod join-parts DIR
FILE`). Larger executables are refused with an error: build big data into the image or load it
from a volume inside the node.

RBAC. Node pods use no API. The coordinator pod lists the program's pods (`get`, `list` on pods)
to notice a pod that dies without reporting (killed for memory, evicted); without that permission it
says so in its log and relies on an attached launcher to notice. A detached launch's coordinator
also creates pods and deletes its node pods (by name), and, for a group that grows, creates
ConfigMaps and deletes the added nodes' spec ConfigMaps (by name). `create_rbac=True` creates a
ServiceAccount, Role and RoleBinding granting exactly that (`coordinator_rbac_manifests`); the
launching user needs create/get/list/delete on pods, configmaps, secrets and services (and on
serviceaccounts, roles and rolebindings with `create_rbac=True`), get on pods/log and list on events.

`program_to_manifests` writes the same objects as YAML for `kubectl apply` (without owner
references, which need the root's uid: delete them with `kubectl delete ... -l
launchpad.dev/program=RUN`).

Files, by where their code runs:
  * names.py     both sides: labels, annotations, containers, paths, pod commands, DNS-name rules;
  * config.py    launching machine: `KubernetesResources` and `KubernetesConfig` (the options);
  * manifests.py launching machine: the objects of a launch (`plan_launch`) and their YAML;
  * api.py       launching machine and coordinator pod: `KubernetesApi` over the official client;
  * launcher.py  launching machine: `KubernetesLauncher`, `PodRunner`, `program_to_manifests`;
  * pod.py       in the pods: `python -m launchpad.launch.kubernetes.pod COMMAND ARGS` (this package
                 does not import it);
  * in_cluster.py coordinator pod: `InClusterRunner`, restarting, adding and removing a detached
                 program's nodes;
  * readopt.py   coordinator pod: the state a restarted coordinator container re-adopts a
                 detached program's node pods from;
  * reach.py     launching machine: a detached program registered there, reached through
                 `kubectl exec -i` into its coordinator pod (`KubernetesAttachedController`).
"""
from launchpad.launch.kubernetes.api import KubernetesApi, KubernetesError, NotFound
from launchpad.launch.kubernetes.config import KubernetesConfig, KubernetesResources
from launchpad.launch.kubernetes.launcher import (KubernetesAttachedController,
                                                  KubernetesLauncher, program_to_manifests)
from launchpad.launch.kubernetes.manifests import (MAX_SPEC_CHUNKS, SPEC_CHUNK_BYTES, LaunchPlan,
                                                   coordinator_rbac_manifests, plan_launch,
                                                   to_yaml)
from launchpad.launch.kubernetes.names import (COORDINATOR_CONTAINER, INSTALL_HINT,
                                               NODE_CONTAINER, NODE_LABEL,
                                               NODE_NAME_ANNOTATION, PARTS_DIR, PROGRAM_LABEL,
                                               ROLE_LABEL, SPEC_DIR)

__all__ = [
    'COORDINATOR_CONTAINER', 'INSTALL_HINT', 'KubernetesApi', 'KubernetesConfig',
    'KubernetesAttachedController', 'KubernetesError', 'KubernetesLauncher', 'KubernetesResources', 'LaunchPlan',
    'MAX_SPEC_CHUNKS', 'NODE_CONTAINER', 'NODE_LABEL', 'NODE_NAME_ANNOTATION', 'NotFound',
    'PARTS_DIR', 'PROGRAM_LABEL', 'ROLE_LABEL', 'SPEC_CHUNK_BYTES', 'SPEC_DIR',
    'coordinator_rbac_manifests', 'plan_launch', 'program_to_manifests', 'to_yaml',
]
