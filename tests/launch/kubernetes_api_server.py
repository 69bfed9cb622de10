"""A stand-in for a Kubernetes API server on the podman bed, for programs no launcher follows.

`PodmanApiServer` serves, over HTTPS with a bearer token, the part of the Kubernetes REST API
that `KubernetesApi` calls (create, delete and list objects of one namespace, read a pod's log), backed by
`PodmanApi` (tests/launch/test_kubernetes_podman.py), which plays every Pod with `podman kube
play`. So the real `kubernetes` client talks to it from both sides: a launcher in another process
(through `kubeconfig()`, on loopback), and a coordinator pod, which finds it as a pod of a cluster
finds its API server (KUBERNETES_SERVICE_HOST/PORT, a service account token and CA certificate
mounted at /var/run/secrets/kubernetes.io/serviceaccount in pods with a service account). Like a
cluster's garbage collector, deleting an object deletes the objects that name it as their owner.
Like a Job controller, it runs a Job's pod (named after the Job, with a random suffix) and makes
another when that pod is deleted or ends in failure, after the Job's back-off (`JOB_BACKOFF`
seconds, doubling), until its `backoffLimit`; a pod that succeeds completes the Job. A container
that restarts in place is not counted. RBAC is not enforced.

The bed's pods cannot reach this machine (their network has no gateway, on purpose), so a pod with
a service account gets one more container, translated like the rest: it forwards the pod's
127.0.0.1:6443 to this server's Unix socket, mounted from the host.
"""
from __future__ import annotations

import base64
import copy
import http.server
import json
import secrets
import socketserver
import ssl
import subprocess
import threading
import time
import urllib.parse

from launchpad.launch.kubernetes.api import AlreadyExists
from tests.launch.test_kubernetes_podman import PodmanApi
from tests.pki import Pki

_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount'
_KINDS = {'configmaps': 'ConfigMap', 'secrets': 'Secret', 'services': 'Service', 'pods': 'Pod',
          'serviceaccounts': 'ServiceAccount', 'roles': 'Role', 'rolebindings': 'RoleBinding',
          'jobs': 'Job'}
JOB_BACKOFF = 10.0  # a cluster's Job controller waits 10 s before a pod's first replacement


class PodmanApiServer:
    """The API server stand-in (see the module docstring); a context manager that stops serving
    and removes what is left of the programs on exit."""

    def __init__(self, podman: PodmanApi, tmp_path):
        self.podman = podman  # or what stands in for it
        self.token = secrets.token_hex(16)
        self._objects = {}  # (kind, name) -> the object as created
        self.created = []  # (kind, name) of every object created, in order
        # (kind, name, uid precondition or None, what it did) of every deletion asked, in order
        self.deletions = []
        self._lock = threading.RLock()
        self._data_lock = threading.Lock()  # (see `read`)
        self._jobs = {}  # Job name -> [its pod's name, failures, when it may make the next]
        self._closed = threading.Event()
        pki = Pki(['127.0.0.1'])
        self._dir = tmp_path / 'api-server'
        self._dir.mkdir()
        (self._dir / 'ca.crt').write_bytes(pki.ca_pem)
        (self._dir / 'token').write_text(self.token)
        (self._dir / 'server.pem').write_bytes(pki.server_pem + pki.server_key)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._dir / 'server.pem')
        self._servers = [http.server.ThreadingHTTPServer(('127.0.0.1', 0), _handler(self)),
                         _UnixHttpServer(str(self._dir / _SOCKET), _handler(self))]
        for server in self._servers:
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = self._servers[0].server_address[1]

    def __enter__(self) -> 'PodmanApiServer':
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self._job_controller = threading.Thread(target=self._control_jobs, daemon=True)
        self._job_controller.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._closed.set()
        self._job_controller.join(30)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self.podman.close()

    def kubeconfig(self) -> str:
        """The path of a kubeconfig file for this server."""
        path = self._dir / 'kubeconfig'
        path.write_text(json.dumps({
            'apiVersion': 'v1', 'kind': 'Config', 'current-context': 'bed',
            'clusters': [{'name': 'bed', 'cluster': {
                'server': f'https://127.0.0.1:{self.port}',
                'certificate-authority': str(self._dir / 'ca.crt')}}],
            'users': [{'name': 'bed', 'user': {'token': self.token}}],
            'contexts': [{'name': 'bed', 'context': {'cluster': 'bed', 'user': 'bed'}}]}))
        return str(path)

    def objects(self):
        """(kind, name) of every object that exists."""
        with self._lock:
            return sorted(self._objects)

    def create(self, document):
        with self._lock:
            kind, name = document['kind'], document['metadata']['name']
            if (kind, name) in self._objects:
                raise _Refusal(409, f'{kind} {name} already exists')
            if kind == 'Pod' and document['spec'].get('serviceAccountName'):
                _mount_account(document, self._dir)
            created = self.podman.create(document)  # raises AlreadyExists while terminating
            self._objects[kind, name] = created
            self.created.append((kind, name))
            if kind == 'Job':
                created.setdefault('status', {})
                self._jobs[name] = [None, 0, 0.0]
                self._run_job_pod(created)
            return created

    # Reads and patches do not wait for `_lock`, which a pod's creation holds while `kube play`
    # waits for its init containers: a coordinator reading its state before it serves would
    # hold up the node pods waiting for it.

    def read(self, kind, name):
        with self._data_lock:
            document = self._objects.get((kind, name))
            if document is None:
                raise _Refusal(404, f'{kind} {name} not found')
            return copy.deepcopy(document)

    def patch(self, kind, name, body):
        """A merge patch of the object's `data` (what `KubernetesApi.patch_secret` sends)."""
        with self._data_lock:
            document = self._objects.get((kind, name))
            if document is None:
                raise _Refusal(404, f'{kind} {name} not found')
            document.setdefault('data', {}).update(body.get('data') or {})
            return copy.deepcopy(document)

    def _run_job_pod(self, job):
        """Creates a pod of `job` from its template, as a Job controller does."""
        name = job['metadata']['name']
        template = job['spec']['template']
        pod = {'apiVersion': 'v1', 'kind': 'Pod', 'metadata': {
            'name': f'{name}-{secrets.token_hex(3)[:5]}', 'namespace': job['metadata']['namespace'],
            'labels': {**template['metadata'].get('labels', {}), 'job-name': name},
            'ownerReferences': [{'apiVersion': 'batch/v1', 'kind': 'Job', 'name': name,
                                 'uid': job['metadata']['uid'], 'controller': True}]},
            'spec': copy.deepcopy(template['spec'])}
        self._jobs[name][0] = pod['metadata']['name']
        self.create(pod)

    def _control_jobs(self):
        """Replaces a Job's pod that is gone or failed, after the back-off; completes a Job
        whose pod succeeded, fails one past its backoffLimit (see the module docstring)."""
        phases, looked = {}, 0.0
        while not self._closed.wait(1.0):
            if not self._jobs:
                continue
            if time.monotonic() - looked > 3.0:  # (podman's listing is slow: not too often)
                looked = time.monotonic()
                phases = {pod['metadata']['name']: (pod.get('status') or {}).get('phase')
                          for pod in self.podman.list_pods('')}
            with self._lock:
                jobs = {name: self._objects.get(('Job', name)) for name in self._jobs}
                for name, job in jobs.items():
                    if job is None or job['status'].get('conditions'):
                        continue
                    kept = self._jobs[name]
                    pod, phase = kept[0], phases.get(kept[0])
                    if phase == 'Succeeded':
                        job['status'] = {**job['status'], 'succeeded': 1, 'conditions': [
                            {'type': 'Complete', 'status': 'True'}]}  # (new dicts: see `read`)
                        continue
                    failed = phase == 'Failed' and job['spec']['template']['spec'].get(
                        'restartPolicy') == 'Never'  # (else its container restarts in place)
                    if pod is not None and ('Pod', pod) in self._objects and not failed:
                        continue  # it runs
                    if pod is not None:  # gone or failed: counted once
                        kept[:] = [None, kept[1] + 1, time.monotonic() + JOB_BACKOFF * 2 ** kept[1]]
                        job['status'] = {**job['status'], 'failed': kept[1]}
                    if kept[1] > job['spec'].get('backoffLimit', 6):
                        job['status'] = {**job['status'], 'conditions': [
                            {'type': 'Failed', 'status': 'True', 'reason': 'BackoffLimitExceeded'}]}
                    elif time.monotonic() >= kept[2]:
                        try:
                            self._run_job_pod(job)
                        except Exception as e:  # pylint: disable=broad-except  (counted next)
                            print(f'the Job {name} could not make its pod: {e}', flush=True)

    def delete(self, kind, name, grace_period_seconds=None, uid=None, by='a client'):
        """Deletes the object (only if its uid is `uid`, when given: a precondition), and (like
        the garbage collector) those it owns; `by`: who asks, for `deletions`."""
        with self._lock:
            document = self._objects.get((kind, name))
            if document is None:
                self.deletions.append((kind, name, uid, f'{by}: not found'))
                raise _Refusal(404, f'{kind} {name} not found')
            if uid is not None and document['metadata']['uid'] != uid:
                self.deletions.append((kind, name, uid, f'{by}: refused, the uid is '
                                                        f'{document["metadata"]["uid"]}'))
                raise _Refusal(409, f'Precondition failed: UID in precondition: {uid}, UID in '
                                    f'object meta: {document["metadata"]["uid"]}')
            del self._objects[kind, name]
            self.deletions.append((kind, name, uid, f'{by}: deleted {document["metadata"]["uid"]}'))
            if kind == 'Pod' and grace_period_seconds is None:
                grace_period_seconds = document['spec'].get('terminationGracePeriodSeconds', 30)
            self.podman.delete(kind, name, grace_period_seconds)
            uid = document['metadata']['uid']
            for (other_kind, other), obj in list(self._objects.items()):
                if any(owner.get('uid') == uid
                       for owner in obj['metadata'].get('ownerReferences') or []):
                    self.delete(other_kind, other, by=f'the garbage collector ({kind} {name})')

    def read_log(self, name, query):
        """What the API answers for the log of pod `name` (`query`: container, timestamps,
        sinceSeconds, tailLines), from `podman logs`: its output and error lines by time."""
        with self._lock:
            if ('Pod', name) not in self._objects:
                raise _Refusal(404, f'pods "{name}" not found')
        command = ['podman', 'logs', '--timestamps']  # (its --tail joins a line written in
        if 'sinceSeconds' in query:                      # parts to the next: tailLines cut here)
            command += ['--since', f'{int(query["sinceSeconds"])}s']
        result = subprocess.run([*command, f'{name}-{query["container"]}'], capture_output=True,
                                text=True, timeout=60, check=False)
        lines = sorted(result.stdout.splitlines() + result.stderr.splitlines(),
                       key=lambda line: line.split(' ', 1)[0])
        lines = lines[-int(query['tailLines']):] if 'tailLines' in query else lines
        if query.get('timestamps') != 'true':
            lines = [line.split(' ', 1)[-1] for line in lines]
        return ''.join(line + '\n' for line in lines)

    def list_pods(self, selector):
        wanted = dict(term.split('=', 1) for term in selector.split(',') if term)
        return [pod for pod in self.podman.list_pods(selector)
                if all(pod['metadata'].get('labels', {}).get(k) == v for k, v in wanted.items())]


class _Refusal(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _mount_account(pod, directory) -> None:
    """What a cluster gives a pod with a service account: its token and the API server's CA
    certificate, and where the API server is (here: a container forwarding to it)."""
    spec = pod['spec']
    spec.setdefault('volumes', []).append(
        {'name': 'service-account', 'hostPath': {'path': str(directory)}})
    for container in spec['containers']:
        container.setdefault('volumeMounts', []).append(
            {'name': 'service-account', 'mountPath': _ACCOUNT_DIR, 'readOnly': True})
        container.setdefault('env', []).extend([
            {'name': 'KUBERNETES_SERVICE_HOST', 'value': '127.0.0.1'},
            {'name': 'KUBERNETES_SERVICE_PORT', 'value': str(_POD_PORT)}])
    forwarder = copy.deepcopy(spec['containers'][0])
    script = base64.b64encode(_FORWARD.encode()).decode()  # one line, for kube play's YAML
    forwarder.update(name='api-forwarder', command=[
        forwarder['command'][0], '-c', f'import base64; exec(base64.b64decode("{script}"))',
        str(_POD_PORT), f'{_ACCOUNT_DIR}/{_SOCKET}'])
    for key in ('env', 'ports', 'readinessProbe', 'resources'):
        forwarder.pop(key, None)
    spec['containers'].append(forwarder)


_SOCKET = 'api.sock'
_POD_PORT = 6443
_FORWARD = """
import socket, sys, threading
def pipe(source, target):
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    for end in (source, target):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
listener = socket.create_server(('127.0.0.1', int(sys.argv[1])))
while True:
    client, _ = listener.accept()
    upstream = socket.socket(socket.AF_UNIX)
    upstream.connect(sys.argv[2])
    for ends in ((client, upstream), (upstream, client)):
        threading.Thread(target=pipe, args=ends, daemon=True).start()
"""


class _UnixHttpServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def _with_client_fields(pod):
    """The pod with the container status fields the client requires of a server's answer."""
    for status in (pod.get('status') or {}).get('containerStatuses') or []:
        status.setdefault('image', '')
        status.setdefault('imageID', '')
        status.setdefault('ready', 'running' in status.get('state', {}))
        status.setdefault('restartCount', 0)
    return pod


def _handler(server: PodmanApiServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _answer_text(self, text):
            data = text.encode()
            self.send_response(200)
            self.send_header('Content-Type', 'text/plain')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self):
            scheme, _, token = (self.headers.get('Authorization') or '').partition(' ')
            if scheme.lower() != 'bearer' or token != server.token:
                return self._answer(401, {'kind': 'Status', 'message': 'Unauthorized'})
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            parts = url.path.strip('/').split('/')
            length = int(self.headers.get('Content-Length') or 0)
            body = json.loads(self.rfile.read(length)) if length else {}
            # /api/v1/namespaces/NS[/RESOURCE[/NAME]] or /apis/GROUP/VERSION/namespaces/...
            rest = parts[parts.index('namespaces') + 2:] if 'namespaces' in parts else []
            try:
                if not rest:
                    return self._answer(200, {'kind': 'Namespace',
                                              'metadata': {'name': parts[-1]}})
                kind = _KINDS[rest[0]]
                if self.command == 'POST':
                    return self._answer(201, server.create(body))
                if self.command == 'PATCH':
                    return self._answer(200, server.patch(kind, rest[1], body))
                if self.command == 'GET' and kind in ('Secret', 'Job') and len(rest) == 2:
                    return self._answer(200, server.read(kind, rest[1]))
                if self.command == 'DELETE':
                    server.delete(kind, rest[1], body.get('gracePeriodSeconds'),
                                  (body.get('preconditions') or {}).get('uid'))
                    return self._answer(200, {})  # read as the object or a Status
                if self.command == 'GET' and kind == 'Pod' and rest[2:] == ['log']:
                    return self._answer_text(server.read_log(rest[1], query))
                if self.command == 'GET' and kind == 'Pod' and len(rest) == 1:
                    pods = server.list_pods(query.get('labelSelector', ''))
                    return self._answer(200, {'kind': 'PodList', 'apiVersion': 'v1',
                                              'metadata': {},
                                              'items': [_with_client_fields(p) for p in pods]})
                return self._answer(404, {'kind': 'Status', 'message': f'no {self.path}'})
            except _Refusal as e:
                return self._answer(e.status, {'kind': 'Status', 'message': str(e)})
            except AlreadyExists as e:  # a pod of that name is still terminating
                return self._answer(409, {'kind': 'Status', 'message': str(e)})
            except Exception as e:  # pylint: disable=broad-except
                return self._answer(500, {'kind': 'Status', 'message': f'{type(e).__name__}: {e}'})

        do_GET = do_POST = do_DELETE = do_PATCH = _handle

    return Handler
