"""A stand-in for the two kubectl commands a detached program's relay runs
(`KubernetesApi.exec_command`), on the podman bed, where pod POD's container C is the podman
container POD-C:

    kubectl --kubeconfig K [--context X] exec -i -n NS POD -c C -- COMMAND...
    kubectl --kubeconfig K [--context X] get pod -n NS POD -o jsonpath={.status.phase}
    kubectl --kubeconfig K [--context X] get job -n NS JOB -o jsonpath=...

where POD may be job/JOB, a Job's pod that runs (both read from the API server stand-in that K
names: the types of the Job's true conditions, and its pods, labelled job-name=JOB).

Standard library only, as kubectl (a Go program) starts in a tenth of a second: importing
launchpad and the kubernetes client took 1.5 s here, in every connection of a relay tunnel.

`install(directory)` writes an executable `kubectl` there that runs this script."""
import json
import os
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

COORDINATOR_CONTAINER = 'coordinator'  # (`launchpad.launch.kubernetes.names`)
_PHASES = {'running': 'Running', 'created': 'Pending', 'configured': 'Pending',
           'stopping': 'Running', 'exited': 'Succeeded'}


def install(directory: str) -> str:
    """Writes `directory`/kubectl, which runs this script; returns `directory`."""
    path = os.path.join(directory, 'kubectl')
    with open(path, 'w') as f:
        f.write(f'#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} "$@"\n')
    os.chmod(path, stat.S_IRWXU)
    return directory


def _get(kubeconfig: str, path: str, **query: str):
    """The API server's JSON answer to GET `path`, or None if it answers 404."""
    with open(kubeconfig) as f:
        config = json.load(f)
    cluster, user = config['clusters'][0]['cluster'], config['users'][0]['user']
    url = cluster['server'] + path + ('?' + urllib.parse.urlencode(query) if query else '')
    request = urllib.request.Request(url, headers={'Authorization': f'Bearer {user["token"]}'})
    context = ssl.create_default_context(cafile=cluster['certificate-authority'])
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _running_pod(kubeconfig: str, namespace: str, job: str):
    """The name of the Job's pod that runs now (as `coordinator_job.coordinator_pod_name`)."""
    pods = _get(kubeconfig, f'/api/v1/namespaces/{namespace}/pods',
                labelSelector=f'job-name={job}')['items']
    running = [pod['metadata']['name'] for pod in pods
               if not pod['metadata'].get('deletionTimestamp')
               and (pod.get('status') or {}).get('phase', 'Running') == 'Running']
    return running[-1] if running else None


def main(args) -> int:
    kubeconfig = None
    while args[0] in ('--kubeconfig', '--context'):
        kubeconfig = args[1] if args[0] == '--kubeconfig' else kubeconfig
        args = args[2:]
    if args[:2] == ['get', 'job']:  # get job -n NS JOB -o jsonpath=...
        job = _get(kubeconfig, f'/apis/batch/v1/namespaces/{args[3]}/jobs/{args[4]}')
        if job is None:
            print(f'Error from server (NotFound): jobs.batch "{args[4]}" not found',
                  file=sys.stderr)
            return 1
        print(' '.join(c['type'] for c in (job.get('status') or {}).get('conditions') or []
                       if c.get('status') == 'True'), end='')
        return 0
    if args[0] == 'exec' and args[4].startswith('job/'):  # the Job's pod that runs now
        pod = _running_pod(kubeconfig, args[3], args[4][len('job/'):])
        if pod is None:
            print(f'error: no running pod of {args[4]}', file=sys.stderr)
            return 1
        args[4] = pod
    if args[0] == 'get':  # get pod -n NS POD -o jsonpath=...
        pod = args[4]
        result = subprocess.run(['podman', 'container', 'inspect', '--format',
                                 '{{.State.Status}}', f'{pod}-{COORDINATOR_CONTAINER}'],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(f'Error from server (NotFound): pods "{pod}" not found', file=sys.stderr)
            return 1
        print(_PHASES.get(result.stdout.strip(), 'Unknown'), end='')
        return 0
    assert args[:4] == ['exec', '-i', '-n', args[3]] and args[5] == '-c' and args[7] == '--', args
    os.execvp('podman', ['podman', 'exec', '-i', f'{args[4]}-{args[6]}', *args[8:]])
    return 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
