"""A node's whole process tree: the worker adopts what its node starts, and ends all of it.

A node may start processes of its own (`subprocess.Popen(['sleep', '300'])`, a simulator, a data
loader). When the node ends (it returns, fails, is stopped, or its launcher dies) they must end
too. A process group would not do: a child may start a session of its own, and a child whose
parent exited is re-parented to init, where nothing links it to the node any more. So the worker
makes itself a *child subreaper* (Linux's `prctl(PR_SET_CHILD_SUBREAPER)`): orphaned descendants
become its children instead of init's, and `end_descendants` finds every one of them with psutil
before the worker exits (a look at whether it has any child comes first: mostly it has none). The fork server of local_mp does the same for what outlives a worker
killed with SIGKILL. Where prctl is unavailable, only descendants still attached are found.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Callable, Optional

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Makes this process adopt its orphaned descendants (Linux); False where it cannot."""
    if not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def end_descendants(grace: float = 1.0) -> None:
    """Ends every descendant of this process: SIGTERM, then SIGKILL to those still alive after
    `grace` seconds; repeated while new ones appear (a dying child may start another)."""
    if not has_children():
        return  # the common case, and at once: psutil's search reads every process on the host
    import psutil  # pylint: disable=import-outside-toplevel
    me = psutil.Process()
    end_until_gone(lambda: me.children(recursive=True), grace, rounds=5)


def has_children() -> bool:
    """Whether this process has a child, running or not yet reaped (the look reaps none).
    Without one it has no descendant either: each descendant's parent is a descendant, or this
    process (a subreaper adopts those whose parent is gone)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):
        pass  # no waitid here (not POSIX): look the long way
    return True


def end_until_gone(find: Callable[[], list], grace: Optional[float] = None,
                   rounds: int = 5) -> None:
    """Ends the `psutil.Process`es that `find()` returns, and again those it finds then (a dying
    process may start another), at most `rounds` times: SIGTERM first and SIGKILL to those alive
    `grace` seconds later, or SIGKILL at once when `grace` is None."""
    import psutil  # pylint: disable=import-outside-toplevel
    for _ in range(rounds):
        try:
            found = find()
        except psutil.Error:
            return
        if not found:
            return
        steps = [('terminate', grace)] if grace is not None else []
        for signal_them, wait in steps + [('kill', 2.0)]:
            for process in found:
                try:
                    getattr(process, signal_them)()
                except psutil.Error:
                    pass
            _, found = psutil.wait_procs(found, timeout=wait)
            if not found:
                break
