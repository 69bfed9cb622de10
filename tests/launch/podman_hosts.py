"""Points a DNS name at a new address in the hosts files of a podman pod's containers: the podman
stand-in's cluster DNS following a pod made again with a new address (`PodmanApi`).

Each container's /etc/hosts is a bind mount of a file podman keeps on the host (`.HostsPath`;
the containers of a pod may share one). A file that is bind-mounted cannot be replaced (what
`sed -i` and any write-then-rename do), so the host-side file is rewritten in place: truncated
and written. The move is then checked where it matters, by resolving the name in each running
container of the pod, and a move that did not take raises, naming the pod and what it resolved.
"""
from __future__ import annotations

import subprocess
from typing import Callable, List, Sequence

RESOLVE = 'import socket, sys; print(socket.gethostbyname(sys.argv[1]))'


def point(pod: str, containers: Sequence[str], fqdn: str, ip: str, python: str,
          podman: Callable[..., str]) -> None:
    """Makes `fqdn` resolve to `ip` in the pod `pod` (podman's pod name), whose containers
    are `containers` (their names in the Pod's spec; podman names them POD-NAME).

    Raises:
      AssertionError: a running container of the pod still resolves `fqdn` elsewhere.
    """
    names = [f'{pod}-{container}' for container in containers]
    found = podman('inspect', '--format', '{{.State.Running}} {{.HostsPath}}', *names,
                   check=False)
    running, paths = [], set()
    for name, line in zip(names, found.splitlines()):
        state, _, path = line.partition(' ')
        if path.startswith('/'):
            paths.add(path)
            if state == 'true':
                running.append(name)
    for path in sorted(paths):
        _rewrite(path, fqdn, ip)
    for name in running:
        _check(name, fqdn, ip, python, podman)


def _rewrite(path: str, fqdn: str, ip: str) -> None:
    """Rewrites the hosts file `path` in place with `fqdn` at `ip` (and nowhere else)."""
    with open(path, 'r+', encoding='utf-8') as f:
        lines: List[str] = []
        for line in f.read().splitlines():
            fields = line.split('#', 1)[0].split()
            if len(fields) > 1 and fqdn in fields[1:]:
                kept = [name for name in fields[1:] if name != fqdn]
                if not kept:
                    continue
                line = ' '.join([fields[0], *kept])
            lines.append(line)
        lines.append(f'{ip}\t{fqdn}')
        f.seek(0)
        f.write('\n'.join(lines) + '\n')
        f.truncate()


def _check(container: str, fqdn: str, ip: str, python: str, podman: Callable[..., str]) -> None:
    """Fails unless `fqdn` resolves to `ip` in the running container `container` (one that
    ended meanwhile is left alone)."""
    try:
        resolved = podman('exec', container, python, '-c', RESOLVE, fqdn).strip()
    except (AssertionError, subprocess.SubprocessError) as error:
        if podman('inspect', '--format', '{{.State.Running}}', container,
                  check=False).strip() != 'true':
            return
        resolved = str(error)
    if resolved != ip:
        raise AssertionError(f'the podman stand-in moved {fqdn} to {ip}, but {container} '
                             f'resolves it as {resolved!r}')
