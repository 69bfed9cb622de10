"""A program's metrics as TensorBoard event files, written with tensorboardX (`pip install
'launchpad-ml[tensorboard]'`).

`lp.launch(..., tensorboard_dir=DIR)` writes, under `DIR/<program id>/` (one TensorBoard run per
program), a scalar per sample of the observer, tagged `<metric>/<node>`:

    <name>/<node>                     each value a node reported anew with lp.report, and each
                                      counter of lp.count (its running total)
    launchpad_calls_per_s/<node>      calls the node's courier servers served per second
    launchpad_errors_per_s/<node>     of those, the ones that failed
    launchpad_cpu_percent/<node>      its process's CPU (100: one core) and memory
    launchpad_rss_bytes/<node>

The step is whole seconds since the program started, so runs line up in TensorBoard; each point
also carries its wall-clock time. tensorboardX is small (numpy, protobuf, packaging) and writes
the files TensorBoard reads, without TensorFlow or TensorBoard installed.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

from launchpad.observe.runstore import NODE_METRICS

EXTRA = 'launchpad-ml[tensorboard]'
WRITTEN_NODE_METRICS = ('calls_per_s', 'errors_per_s', 'cpu_percent', 'rss_bytes')


def require() -> None:
    """Raises ImportError naming the extra to install if tensorboardX is missing."""
    try:
        import tensorboardX  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        raise ImportError(f"tensorboard_dir= needs tensorboardX, which is not installed: pip "
                          f"install '{EXTRA}'") from None


class TensorBoardWriter:
    """Writes samples (`recorder.Recorder.record`) of one program to `<directory>/<program id>`."""

    def __init__(self, directory: str, describe: Dict[str, Any]):
        from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
        self.directory = os.path.join(os.path.expanduser(directory), describe['id'])
        self._started = describe['started']
        self._writer = SummaryWriter(logdir=self.directory, flush_secs=5)
        self._reported: Dict[tuple, float] = {}  # (node, name) -> its report time

    def write(self, samples: List[Dict[str, Any]]) -> None:
        for sample in samples:
            step = int(sample['time'] - self._started)
            for row in sample['nodes']:
                for key in WRITTEN_NODE_METRICS:
                    if row.get(key) is not None:
                        self._writer.add_scalar(f'{NODE_METRICS[key]}/{row["name"]}', row[key],
                                                step, walltime=sample['time'])
            for node, reported in sample.get('values', {}).items():
                for name, (_, value, taken) in reported.items():
                    if self._reported.get((node, name)) != taken:
                        self._reported[(node, name)] = taken
                        self._writer.add_scalar(f'{name}/{node}', value,
                                                int(taken - self._started), walltime=taken)

    def close(self) -> None:
        self._writer.close()
