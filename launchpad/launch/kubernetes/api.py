"""The thin layer over the official `kubernetes` client: plain dicts in and out, errors made
readable (`KubernetesError` says how to fix them).

Runs on the launching machine (the launcher creates, follows and deletes a program's objects) and in
the coordinator pod (it lists the program's pods). The client is an optional dependency, imported
when a `KubernetesApi` is made.
"""
from __future__ import annotations

import io
import json
import os
import re
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, List, Mapping, Optional

from launchpad.launch.kubernetes.names import INSTALL_HINT


class KubernetesError(RuntimeError):
    """The cluster refused or could not do what the launcher asked; the message says how to fix it."""


class NotFound(KubernetesError):
    """The object does not exist."""


class AlreadyExists(KubernetesError):
    """An object of that name exists (it may be on its way out)."""


def _import_kubernetes():
    try:
        import kubernetes  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError('The kubernetes launcher needs the official Kubernetes Python client: '
                          f'{INSTALL_HINT}') from e
    return kubernetes


# Arguments: KUBECONFIG CONTEXT NAMESPACE POD CONTAINER COMMAND...: runs COMMAND in POD's
# CONTAINER through kubectl, passing on what it writes; if it wrote nothing (the exec failed),
# says `gone` (for the relay tunnel) if POD has ended or is deleted. (The exec first: a kubectl
# call before it would double the cost of every connection a relay tunnel opens.)
_EXEC_SCRIPT = '''kubeconfig=$1 context=$2 namespace=$3 pod=$4 container=$5
shift 5
k() {
  if [ -n "$context" ]; then kubectl --kubeconfig "$kubeconfig" --context "$context" "$@"
  else kubectl --kubeconfig "$kubeconfig" "$@"; fi
}
k exec -i -n "$namespace" "$pod" -c "$container" -- "$@" |
  { IFS= read -r line || exit 1; printf '%s\\n' "$line"; exec cat; } && exit 0
case $pod in
  job/*) what=job; query='{.status.conditions[?(@.status=="True")].type}';;
  *) what=pod; query='{.status.phase}';;
esac
phase=$(k get "$what" -n "$namespace" "${pod#job/}" -o "jsonpath=$query" 2>&1) || case $phase in
  *NotFound*|*"not found"*) echo gone; exit 0;;
  *) echo "$phase" >&2; exit 1;;
esac
case " $phase " in *" Succeeded "*|*" Failed "*|*" Complete "*) echo gone; exit 0;; esac
exit 1'''


class KubernetesApi:
    """The calls the launcher makes (create, list pods, logs, events, delete), in one namespace.

    Everything goes in and comes out as plain dicts shaped like the API's JSON, so that tests can
    replace this class with a fake that records calls and plays back pod states.
    """

    _CREATE = {'ConfigMap': 'create_namespaced_config_map', 'Secret': 'create_namespaced_secret',
               'Service': 'create_namespaced_service', 'Pod': 'create_namespaced_pod',
               'ServiceAccount': 'create_namespaced_service_account',
               'Role': 'create_namespaced_role', 'RoleBinding': 'create_namespaced_role_binding',
               'Job': 'create_namespaced_job'}
    _TIMEOUT = 30.0

    def __init__(self, namespace: str, *, kubeconfig: Optional[str] = None,
                 context: Optional[str] = None, in_cluster: bool = False):
        k8s = _import_kubernetes()
        # KUBECONFIG is read here, not when the client was imported (it may list several files).
        kubeconfig = kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'
        configuration = k8s.client.Configuration()  # this launch's, not the client's global one
        try:
            if in_cluster:
                k8s.config.load_incluster_config(client_configuration=configuration)
            else:
                k8s.config.load_kube_config(config_file=kubeconfig, context=context,
                                            client_configuration=configuration)
        except (k8s.config.ConfigException, OSError) as e:
            where = 'in this pod' if in_cluster else f'in kubeconfig {kubeconfig}'
            raise KubernetesError(
                f'No usable Kubernetes configuration {where}: {str(e).rstrip(".")}. Set '
                'KUBECONFIG or kubeconfig= to your cluster\'s kubeconfig file (and choose its '
                'context with `kubectl config use-context NAME` or context=).') from e
        self.namespace = namespace
        self._kubeconfig, self._context = kubeconfig, context
        self._exception = k8s.client.exceptions.ApiException
        self._client = k8s.client.ApiClient(configuration)
        self._core = k8s.client.CoreV1Api(self._client)
        self._rbac = k8s.client.RbacAuthorizationV1Api(self._client)
        self._batch = k8s.client.BatchV1Api(self._client)
        self._host = self._client.configuration.host
        self._configuration = configuration
        self._exec_lock = threading.Lock()
        self._exec_core = None  # a client of its own: `stream` swaps its transport while it runs

    def _call(self, action: str, method: Callable, *args, **kwargs):
        try:
            kwargs.setdefault('_request_timeout', self._TIMEOUT)
            return method(*args, **kwargs)
        except self._exception as e:
            raise _api_error(e.status, _reason(e.body) or e.reason, action, self.namespace) from e
        except Exception as e:  # urllib3 connection errors: the server cannot be reached
            if type(e).__module__.startswith(('urllib3', 'socket', 'ssl')) or isinstance(e, OSError):
                raise KubernetesError(
                    f'Cannot reach the Kubernetes API server at {self._host} to {action}: {e}. '
                    'Check that the cluster is up, that this machine can reach it (network, '
                    'VPN), and that the kubeconfig context is the right one.') from e
            raise

    def _dict(self, obj) -> Dict[str, Any]:
        return self._client.sanitize_for_serialization(obj)

    def check_namespace(self) -> None:
        """Raises KubernetesError if the namespace does not exist or the server is unreachable."""
        try:
            self._call(f'read namespace {self.namespace}', self._core.read_namespace,
                       self.namespace)
        except NotFound:
            raise KubernetesError(
                f'Namespace {self.namespace!r} does not exist. Create it with `kubectl create '
                f'namespace {self.namespace}` or pass namespace= an existing one.') from None
        except KubernetesError as e:
            if 'forbidden' not in str(e).lower():  # many users may not read namespaces: fine
                raise

    def create(self, document: Mapping[str, Any]) -> Dict[str, Any]:
        """Creates the object `document` describes; returns it as created (with its uid)."""
        kind, name = document['kind'], document['metadata']['name']
        api = self._api_of(kind)
        created = self._call(f'create {kind} {name}', getattr(api, self._CREATE[kind]),
                             self.namespace, document)
        return self._dict(created)

    def delete(self, kind: str, name: str, grace_period_seconds: Optional[int] = None, *,
               uid: Optional[str] = None) -> None:
        """Deletes an object (its dependents follow); an object already gone is fine. `uid`:
        only that object (a precondition), so that a deletion on behalf of an object that is
        gone never hits a newer one of the same name."""
        method = re.sub(r'(?<!^)([A-Z])', r'_\1', kind).lower()
        api = self._api_of(kind)
        options = {} if uid is None else {'body': {'preconditions': {'uid': uid}}}
        try:
            self._call(f'delete {kind} {name}', getattr(api, f'delete_namespaced_{method}'), name,
                       self.namespace, grace_period_seconds=grace_period_seconds,
                       propagation_policy='Background', **options)
        except NotFound:
            pass
        except AlreadyExists:  # 409: the precondition failed, the name is another object's
            if uid is None:
                raise

    def read(self, kind: str, name: str) -> Optional[Dict[str, Any]]:
        """The object (a Secret or a Job), or None if there is none of that name."""
        method = re.sub(r'(?<!^)([A-Z])', r'_\1', kind).lower()
        try:
            return self._dict(self._call(f'read {kind} {name}', getattr(
                self._api_of(kind), f'read_namespaced_{method}'), name, self.namespace))
        except NotFound:
            return None

    def patch_secret(self, name: str, data: Mapping[str, str]) -> None:
        """Sets keys of the Secret's data (values in base64)."""
        self._call(f'write Secret {name}', self._core.patch_namespaced_secret, name,
                   self.namespace, {'data': dict(data)})

    def _api_of(self, kind: str):
        if kind in ('Role', 'RoleBinding'):
            return self._rbac
        return self._batch if kind == 'Job' else self._core

    def list_pods(self, selector: str) -> List[Dict[str, Any]]:
        """The pods matching the label `selector`, with their status."""
        result = self._call('list pods', self._core.list_namespaced_pod, self.namespace,
                            label_selector=selector)
        return self._dict(result).get('items') or []

    def read_log(self, pod: str, container: str, tail_lines: Optional[int] = None) -> str:
        """The container's log so far (its last `tail_lines` lines if given), '' if none."""
        try:
            return self._call(f'read the log of pod {pod}', self._core.read_namespaced_pod_log,
                              pod, self.namespace, container=container, tail_lines=tail_lines)
        except KubernetesError:
            return ''  # no log (yet): the caller reports what it has

    def read_timestamped_log(self, pod: str, container: str, *,
                             since_seconds: Optional[int] = None,
                             tail_lines: Optional[int] = None) -> str:
        """The container's log, each line after its time (RFC 3339, to the nanosecond): the
        lines of the last `since_seconds` seconds, or its last `tail_lines`, if given. Raises
        KubernetesError (NotFound: no such pod)."""
        return self._call(f'read the log of pod {pod}', self._core.read_namespaced_pod_log,
                          pod, self.namespace, container=container, timestamps=True,
                          since_seconds=since_seconds, tail_lines=tail_lines)

    def open_log(self, pod: str, container: str) -> BinaryIO:
        """A stream of the container's log that follows it until the container ends."""
        response = self._call(f'follow the log of pod {pod}', self._core.read_namespaced_pod_log,
                              pod, self.namespace, container=container, follow=True,
                              _preload_content=False, _request_timeout=None)  # no read timeout
        response.auto_close = False  # EOF reads as b'' rather than a closed file
        return io.BufferedReader(response)

    def exec(self, pod: str, container: str, command: List[str], timeout: float) -> str:
        """Runs `command` in the container (as `kubectl exec` does) and returns its standard
        output; raises KubernetesError if it cannot run or exits with an error."""
        k8s = _import_kubernetes()
        from kubernetes.stream import stream  # pylint: disable=import-outside-toplevel
        with self._exec_lock:
            if self._exec_core is None:
                self._exec_core = k8s.client.CoreV1Api(k8s.client.ApiClient(self._configuration))
            session = self._call(
                f'run a command in pod {pod}', stream,
                self._exec_core.connect_get_namespaced_pod_exec, pod, self.namespace,
                container=container, command=command, stdin=False, stdout=True, stderr=True,
                tty=False, _preload_content=False)
            try:
                session.run_forever(timeout=timeout)
                output, errors = session.read_stdout(), session.read_stderr()
                code = session.returncode
            finally:
                session.close()
        if code != 0:
            raise KubernetesError(f'{" ".join(command[:4])} in pod {pod} failed (exit code '
                                  f'{code}): {errors.strip()[-500:]}')
        return output

    def exec_command(self, pod: str, container: str, command: List[str]) -> List[str]:
        """The command line that runs `command` in the container with this machine's stdin and
        stdout joined to it, `kubectl exec -i` (the user needs `create` on `pods/exec`); it
        says `gone` instead, as `launchpad.observe.relay` does, once the pod has ended. `pod`:
        a pod's name, or job/NAME for the pod that Job runs now (gone once the Job ended)."""
        return ['sh', '-c', _EXEC_SCRIPT, 'launchpad-exec', os.path.expanduser(self._kubeconfig),
                self._context or '', self.namespace, pod, container, *command]

    def events(self, pod: str) -> List[Dict[str, Any]]:
        """The events about `pod` (e.g. why its image cannot be pulled)."""
        result = self._call(f'list events of pod {pod}', self._core.list_namespaced_event,
                            self.namespace, field_selector=f'involvedObject.name={pod}')
        return self._dict(result).get('items') or []


def _reason(body) -> str:
    try:
        return json.loads(body).get('message', '')
    except (TypeError, ValueError, AttributeError):
        return ''


def _api_error(status: int, reason: str, action: str, namespace: str) -> KubernetesError:
    if status == 404:
        return NotFound(f'Cannot {action}: not found ({reason}).')
    if status == 401:
        return KubernetesError(f'Cannot {action}: the API server does not accept your '
                               f'credentials ({reason}). Log in to the cluster again.')
    if status == 403:
        return KubernetesError(
            f'Cannot {action} in namespace {namespace!r}: forbidden by RBAC ({reason}). Ask a '
            'cluster admin for a Role allowing it (see the RBAC section of the kubernetes '
            'launcher\'s documentation), or use a namespace where you have it.')
    if status == 409:
        return AlreadyExists(f'Cannot {action}: it already exists ({reason}). Choose another '
                             'name= or delete the old launch.')
    return KubernetesError(f'Cannot {action}: the API server answered {status} ({reason}).')


# Seconds a restart waits for a node's old pod to be gone before it can create it again.
RECREATE_SECONDS = 120.0


def recreate_pod(api, document: Mapping[str, Any], *,
                 clock: Callable[[], float] = time.monotonic) -> Dict[str, Any]:
    """Deletes the pod `document` names at once and creates it again from `document` (same
    name, so same DNS name), retrying while the old pod is still on its way out (at most
    RECREATE_SECONDS); returns it as created. `api`: a `KubernetesApi`, or what stands in
    for it."""
    name = document['metadata']['name']
    api.delete('Pod', name, grace_period_seconds=0)
    deadline = clock() + RECREATE_SECONDS
    while True:
        try:
            return api.create(document)
        except AlreadyExists:
            if clock() > deadline:
                raise
            time.sleep(0.5)


def terminated(pod: Mapping[str, Any], container: str, init: bool = False
               ) -> Optional[Dict[str, Any]]:
    """The `terminated` state of a container (an init container if `init`) in a pod as the API
    returns it, or None while it has not ended."""
    key = 'initContainerStatuses' if init else 'containerStatuses'
    for status in (pod.get('status') or {}).get(key) or []:
        if status.get('name') == container:
            return (status.get('state') or {}).get('terminated')
    return None
