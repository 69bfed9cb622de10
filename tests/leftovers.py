"""Checks that a test left no process or temporary directory of its own behind."""
from __future__ import annotations

import contextlib
import glob
import os
import tempfile
import time
from typing import Collection, Iterator, Set

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


SYSTEM_TMP = '/tmp'  # where processes that do not share the tests' TMPDIR (ssh sessions) make theirs


def temp_dirs(*places: str, made_on: Collection[str] = (),
              kinds: Collection[str] = ()) -> Set[str]:
    """launchpad's temporary directories (`launchpad-*`, of every kind) in the temporary
    directory of this process (TMPDIR, a custom one included) and in `places`. With `made_on`
    or `kinds`, only those made on one of the hosts `made_on` (as their owners file says) or
    named `launchpad-KIND-*` for one of `kinds`: where other tests' programs use the same
    directory (/tmp), the ones of this test's platform."""
    from launchpad.process import tempdirs  # pylint: disable=import-outside-toplevel
    found = {path for place in {tempfile.gettempdir(), *places}
             for path in glob.glob(os.path.join(place, 'launchpad-*'))}
    if not made_on and not kinds:
        return found
    return {path for path in found
            if any(os.path.basename(path).startswith(f'launchpad-{kind}-') for kind in kinds)
            or {owner[3] for owner in tempdirs.owners(path)} & set(made_on)}


@contextlib.contextmanager
def no_new_temp_dirs(*places: str, made_on: Collection[str] = (), kinds: Collection[str] = (),
                     grace: float = 5.0) -> Iterator[None]:
    """Fails if `launchpad-*` directories made inside the block (`temp_dirs`) are still there
    `grace` seconds after it: the last process of a program out removes them, however the
    others ended."""
    before = temp_dirs(*places, made_on=made_on, kinds=kinds)
    yield
    deadline = time.monotonic() + grace
    while temp_dirs(*places, made_on=made_on, kinds=kinds) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = temp_dirs(*places, made_on=made_on, kinds=kinds) - before
    assert not left, f'temporary directories left behind: {sorted(left)}'
