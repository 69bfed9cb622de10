"""The node pods' logs as the coordinator pod of a detached program reads them through the API,
so that `logs`, `attach` and the dashboard show them on the launching machine (through the
observer the pod serves, `reach`) as they do on the other launchers.

A log is read with a cursor, as `launchpad.process.logs` reads files: `read_log(name)` gives a
node's last lines and a cursor, `read_log(name, cursor)` the lines written since. The API puts
each line's time before it (`timestamps`), but reads only from a number of seconds ago
(`sinceSeconds`: its Python client has no `sinceTime`). So the cursor is the time of the last
line read and how many lines of that time were read (lines written at once share it), and a
read asks for the seconds since then, plus a margin for the clocks of this pod and the node's
kubelet, and drops what was read before. A node's pod created again (a restart) starts a new
log: its lines come next; those its old pod wrote after the last read are not shown.

A line written in parts (unbuffered, `print` writes the text and its newline apart; a runtime
splits long lines too) comes with the time of each later part inside it, as `kubectl logs
--timestamps` shows it: those times are taken out (and so would be a time the node itself
wrote in exactly that form: to a fraction of a second, in UTC, then a space).

The coordinator's service account needs `get` on `pods/log`
(`manifests.coordinator_rbac_manifests`).
"""
from __future__ import annotations

import datetime
import math
import re
import time
from typing import Any, Callable, List, Optional, Tuple

from launchpad.launch.kubernetes import names
from launchpad.launch.kubernetes.api import KubernetesError, NotFound
from launchpad.process import logs

CLOCK_MARGIN = 10  # seconds read again before a cursor's time (clocks of two hosts)
_STAMP = re.compile(r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$')
_PART_STAMP = re.compile(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{1,9}Z ')  # a later part's


class PodLogs:
    """The logs of a program's node pods (see the module docstring): `pod_of(node)` names a
    node's pod (None: it has none)."""

    def __init__(self, api: Any, pod_of: Callable[[str], Optional[str]],
                 clock: Callable[[], float] = time.time):
        self._api = api
        self._pod_of = pod_of
        self._clock = clock

    def read_log(self, name: str, cursor: Optional[str] = None) -> Tuple[List[str], Optional[str]]:
        """Lines node `name` printed after `cursor` (None: its last lines) and the next cursor.

        Raises:
          LookupError: the node has no pod, or its log cannot be read (the message says why).
        """
        pod = self._pod_of(name)
        if pod is None:
            raise LookupError(f'node {name!r} has no pod.')
        after = _parse_cursor(cursor)
        since = None
        if after is not None:
            since = max(1, math.ceil(self._clock() - after[0] / 1e9) + CLOCK_MARGIN)
        try:
            text = self._api.read_timestamped_log(
                pod, names.NODE_CONTAINER, since_seconds=since,
                tail_lines=logs.TAIL_LINES if after is None else None)
        except NotFound:  # not created yet, or deleted
            return [], cursor
        except KubernetesError as e:
            raise LookupError(f'the coordinator pod cannot read the log of pod {pod}: {e}'
                              ) from None
        return _after(text, after, cursor)


def _after(text: str, after: Optional[Tuple[int, int]], cursor: Optional[str]
           ) -> Tuple[List[str], Optional[str]]:
    """The lines of timestamped log `text` after position `after` (None: all), and the cursor
    of the last one (`cursor` if there is none)."""
    lines: List[str] = []
    last, count = None, 0
    for raw in text.splitlines():
        stamp, _, line = raw.partition(' ')
        when = _nanoseconds(stamp)
        if when is None:  # (not a line the API timestamped)
            continue
        count = count + 1 if when == last else 1
        last = when
        if after is None or when > after[0] or (when == after[0] and count > after[1]):
            lines.append(_PART_STAMP.sub('', line))
    return lines, (cursor if last is None else f'{last}:{count}')


def _parse_cursor(cursor: Optional[str]) -> Optional[Tuple[int, int]]:
    if cursor is None:
        return None
    try:
        when, count = str(cursor).split(':')
        return int(when), int(count)
    except ValueError:
        raise LookupError(f'{cursor!r} is not a cursor of a pod log.') from None


def _nanoseconds(stamp: str) -> Optional[int]:
    """RFC 3339 time `stamp` (as the API writes it, to the nanosecond) in nanoseconds since the
    epoch; None if it is not one."""
    match = _STAMP.match(stamp)
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    seconds = datetime.datetime.fromisoformat(
        whole + ('+00:00' if zone == 'Z' else zone)).timestamp()
    return int(seconds) * 10**9 + int((fraction or '').ljust(9, '0'))
