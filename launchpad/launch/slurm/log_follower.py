"""Following a Slurm program's output: the launching process copies the lines its steps write to
their output files (on the filesystem it shares with the compute nodes) to its own stdout, each
behind its node's name, as the local launchers show their nodes' output."""
from __future__ import annotations

import sys
import threading
from typing import Sequence, Tuple

from launchpad.process.output import prefix_for


class LogFollower:
    """Copies new lines of the nodes' output files to our stdout, each behind its node's name."""

    def __init__(self, files: Sequence[Tuple[str, str]], interval: float = 0.2):
        color = sys.stdout.isatty()
        self._files = [[prefix_for(name, i, color=color).encode(), path, 0, b'']
                       for i, (name, path) in enumerate(files)]
        self._interval = interval
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name='lp-slurm-logs')
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed.wait(self._interval):
            self._copy(final=False)

    def _copy(self, final: bool) -> None:
        out = getattr(sys.stdout, 'buffer', None)
        for entry in self._files:
            prefix, path, offset, partial = entry
            try:
                with open(path, 'rb') as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            entry[2] = offset + len(data)
            lines = (partial + data).split(b'\n')
            entry[3] = lines.pop()
            if final and entry[3]:
                lines.append(entry[3])
            for line in lines:
                text = prefix + line + b'\n'
                if out is not None:
                    out.write(text)
                else:
                    sys.stdout.write(text.decode(errors='replace'))
        sys.stdout.flush()

    def close(self) -> None:
        """Stops following and copies what is left, the last unfinished lines included."""
        self._closed.set()
        self._thread.join()
        self._copy(final=True)
