"""Reaching a detached Kubernetes program's coordinator pod from the launching machine.

In a detached launch the coordinator pod serves the program's observer, with the control that
`lp.attach` uses, on a Unix socket of its container, in a registry private to that container
(`names.OBSERVER_DIR`). The launcher reads the entry there through the API's exec and registers
the program on the launching machine (`adopt`), with a relay command by which
`launchpad.observe.tunnel` reaches that socket:

    kubectl exec -i -n NAMESPACE POD -c coordinator -- PYTHON -c RUN_RELAY SOCKET

(the API object writes it: `exec_command`), whose stdin and stdout `launchpad.observe.relay`
(run as a script: `_RUN_RELAY`) joins to the socket. So every command of the launching machine
(`list`, `status`, `attach`, `logs`, `stacks`, `waits`, `top`, `stop`, `lp.attach`) reaches the
program as long as the user may exec into its pods; the nodes' output is what the pod reads of
their logs (`pod_logs`).
"""
from __future__ import annotations

import json
import posixpath
import time
from typing import Any

from launchpad.launch.kubernetes import coordinator_job, names
from launchpad.launch.kubernetes.api import KubernetesError
from launchpad.observe import registry

_READ_ENTRY = 'import sys\ntry:\n print(open(sys.argv[1]).read())\nexcept OSError:\n print("")'
# Runs `launchpad.observe.relay` of the container's launchpad as a script: a module would import
# the launchpad package first, which takes a second (every connection of a tunnel runs one).
_RUN_RELAY = ('import importlib.util, os, runpy, sys\n'
              'sys.argv[0] = os.path.join(os.path.dirname(importlib.util.find_spec('
              '"launchpad").origin), "observe", "relay.py")\n'
              'runpy.run_path(sys.argv[0], run_name="__main__")')


def socket_path(run: str) -> str:
    """The observer's socket in the coordinator container of program `run`."""
    return posixpath.join(names.OBSERVER_DIR, f'{run}.sock')


def adopt(api: Any, pod: str, run: str, python: str, timeout: float,
          job: bool = False) -> registry.Entry:
    """Waits up to `timeout` seconds for the coordinator pod `pod` of program `run` to serve its
    observer, and registers the program on this machine, reached through the API's exec; its
    entry names the pod as the supervisor's host. `job`: `pod` is the coordinator's Job, whose
    pod changes (`coordinator_job`): the relay reaches the one that runs then, job/NAME.

    Raises:
      TimeoutError: it did not within `timeout` (the message says what was last seen);
      PermissionError: the API refuses the exec.
    """
    path = posixpath.join(names.OBSERVER_DIR, f'{run}.json')
    deadline = time.monotonic() + timeout
    problem = 'its observer was not serving yet'
    while True:
        try:
            running = coordinator_job.coordinator_pod_name(api, run) if job else pod
            if running is not None:
                text = api.exec(running, names.COORDINATOR_CONTAINER,
                                [python, '-c', _READ_ENTRY, path], 30.0).strip()
                if text:
                    break
            else:
                problem = f'its Job {pod} runs no pod yet'
        except KubernetesError as e:  # the pod is not running yet, say
            problem = str(e)
            if 'forbidden' in problem.lower():
                raise PermissionError(f'cannot exec in the coordinator pod {pod}: {problem}; '
                                      'the user needs `create` on `pods/exec`') from None
        if time.monotonic() > deadline:
            raise TimeoutError(f'The coordinator pod {pod} did not serve program {run!r} within '
                               f'{timeout:g} s: {problem}')
        time.sleep(0.5)
    fields = json.loads(text)
    pod = f'job/{pod}' if job else pod
    entry = registry.Entry(**{**fields, 'host': pod, 'relay': api.exec_command(
        pod, names.COORDINATOR_CONTAINER,
        [python, '-c', _RUN_RELAY, socket_path(run)])})
    registry.register(entry)
    return entry
