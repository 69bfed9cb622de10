"""CPU and memory per node, from what node processes report (`launchpad.metrics.process_usage`).

Each node process reports its cumulative CPU seconds, resident memory and thread count once a
second; here two reports of the same process give its CPU % over the time between them. Nodes
that run as threads of the launching process report no usage of their own (they share it).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

USAGE = ('cpu_percent', 'rss_bytes', 'threads')  # what a node row gets (None: not known)


class UsageRates:
    """Turns the latest report of each executable into {'cpu_percent', 'rss_bytes', 'threads'}."""

    def __init__(self):
        self._last: Dict[str, Tuple[float, float]] = {}  # executable -> (report time, cpu seconds)
        self._percent: Dict[str, Optional[float]] = {}

    def update(self, reports: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Optional[float]]]:
        """`reports`: executable name -> its latest snapshot (`coordinator.metrics()`)."""
        usage = {}
        for name, snapshot in reports.items():
            process = snapshot.get('process')
            taken = snapshot.get('time')
            if not process or taken is None:
                continue
            before = self._last.get(name)
            if before is not None and taken > before[0]:
                spent = process['cpu_seconds'] - before[1]
                # A restarted node's new process starts again from 0: no rate across the two.
                self._percent[name] = 100.0 * spent / (taken - before[0]) if spent >= 0 else None
            if before is None or taken > before[0]:
                self._last[name] = (taken, process['cpu_seconds'])
            usage[name] = {'cpu_percent': self._percent.get(name),
                           'rss_bytes': process['rss_bytes'], 'threads': process['threads']}
        return usage