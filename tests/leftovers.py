"""Checks that a test left no process of its own behind."""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

import psutil


@contextlib.contextmanager
def no_new_children(grace: float = 5.0) -> Iterator[None]:
    """Fails (after killing them) if child processes started inside the block outlive it.

    Children alive before the block (such as multiprocessing's resource tracker, which lives as
    long as the test run by design) are not counted; the block's own get `grace` seconds to end.
    """
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + grace
    while True:
        left = []
        for child in me.children(recursive=True):
            try:
                if child.pid not in before and child.status() != psutil.STATUS_ZOMBIE:
                    left.append(child)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    described = []
    for child in left:
        with contextlib.suppress(psutil.Error):
            described.append(' '.join(child.cmdline()) or child.name())
            child.kill()
    assert not left, f'processes left behind: {described}'
