"""The tails of node logs that the launching process keeps, so that they can be read back later
(`python -m launchpad.launch logs PROGRAM`, the dashboard).

A log is read with a cursor: `read(None)` gives the last lines kept and a cursor; `read(cursor)`
gives the lines written since. Output copied to the terminal is kept in memory (`LogTail`, the
last `TAIL_LINES` lines); output written to files is read back from the file (`read_file`).
"""
from __future__ import annotations

import collections
import os
import threading
from typing import List, Optional, Tuple

TAIL_LINES = 2000
_FILE_TAIL_BYTES = 256 * 1024


class LogTail:
    """The last `size` lines of one node's output, numbered from its first line."""

    def __init__(self, size: int = TAIL_LINES):
        self._lines: collections.deque = collections.deque(maxlen=size)
        self._count = 0
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            self._count += 1

    def read(self, cursor: Optional[int] = None) -> Tuple[List[str], int]:
        """Lines after `cursor` (None: every line kept) that are still kept, and the next cursor."""
        with self._lock:
            kept_from = self._count - len(self._lines)
            start = kept_from if cursor is None else max(cursor, kept_from)
            lines = list(self._lines)[start - kept_from:]
            return lines, self._count


def read_file(path: str, cursor: Optional[int] = None) -> Tuple[List[str], int]:
    """Whole lines of the file `path` after byte offset `cursor` (None: its last lines, up to
    TAIL_LINES), and the offset to read from next."""
    try:
        with open(path, 'rb') as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - _FILE_TAIL_BYTES) if cursor is None else min(cursor, size)
            f.seek(start)
            data = f.read(size - start)
    except FileNotFoundError:
        return [], cursor or 0
    if cursor is None and start > 0:  # started mid-line: drop the partial first line
        dropped = data.find(b'\n') + 1
        data, start = data[dropped:], start + dropped
    complete = data[:data.rfind(b'\n') + 1]
    lines = complete.decode(errors='replace').splitlines()
    if cursor is None:
        lines = lines[-TAIL_LINES:]
    return lines, start + len(complete)
