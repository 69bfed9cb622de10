"""A stand-in for the two kubectl commands a detached program's relay runs
(`KubernetesApi.exec_command`), on the podman bed, where pod POD's container C is the podman
container POD-C:

    kubectl --kubeconfig K [--context X] get pod -n NS POD -o jsonpath={.status.phase}
    kubectl --kubeconfig K [--context X] exec -i -n NS POD -c C -- COMMAND...

`install(directory)` writes an executable `kubectl` there that runs this script."""
import os
import stat
import subprocess
import sys

from launchpad.launch.kubernetes.names import COORDINATOR_CONTAINER

_PHASES = {'running': 'Running', 'created': 'Pending', 'configured': 'Pending',
           'stopping': 'Running', 'exited': 'Succeeded'}


def install(directory: str) -> str:
    """Writes `directory`/kubectl, which runs this script; returns `directory`."""
    path = os.path.join(directory, 'kubectl')
    with open(path, 'w') as f:
        f.write(f'#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} "$@"\n')
    os.chmod(path, stat.S_IRWXU)
    return directory


def main(args) -> int:
    while args[0] in ('--kubeconfig', '--context'):
        args = args[2:]
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
