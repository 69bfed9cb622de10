"""Live probes of a Kubernetes program's nodes (`stacks`, `waits`, `top`) from its attached
launcher, which reaches its pods through the API server only.

The nodes answer probes through their coordinator (`launchpad.process.probe_broker`), which runs
in the coordinator pod; the launcher's controller holds a mirror of it, fed from the pods. So
`ProbingMirror.probe` runs `pod.py probe` in the coordinator container through the API's exec (as
`kubectl exec` does: the launcher's user needs `create` on `pods/exec`), which asks the
coordinator over a Unix socket of that container and prints the answers as JSON.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable

from launchpad.launch.kubernetes import names
from launchpad.launch.kubernetes.api import KubernetesError
from launchpad.process.coordinator import Coordinator

# Seconds the exec itself may take beyond the probe's own timeout (the command's start included;
# less than the 30 s the CLI waits for its answer, so that a hung exec is reported as such).
EXEC_ALLOWANCE = 20.0


class ProbingMirror(Coordinator):
    """The launcher's mirror of the coordinator pod's coordinator, whose `probe` asks the nodes
    through that pod (see the module docstring)."""

    def __init__(self, api: Any, coordinator_pod: str, python: str, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._api = api
        self._pod = coordinator_pod
        self._python = python

    def probe(self, names_asked: Iterable[str], kinds: Iterable[str], timeout: float
              ) -> Dict[str, dict]:
        """Node -> its answer (`probe_broker`), from the coordinator pod.

        Raises:
          LookupError: the pod cannot be asked (the message says why).
        """
        request = json.dumps({'names': list(names_asked), 'kinds': list(kinds),
                              'timeout': timeout})
        command = names.pod_command(self._python, names.PROBE_COMMAND, names.PROBE_SOCKET,
                                    request)
        try:
            output = self._api.exec(self._pod, names.COORDINATOR_CONTAINER, command,
                                    timeout + EXEC_ALLOWANCE)
            return json.loads(output.strip().splitlines()[-1])
        except (KubernetesError, ValueError, IndexError) as e:
            raise LookupError(f'the nodes cannot be asked through the coordinator pod '
                              f'{self._pod}: {e}') from None
