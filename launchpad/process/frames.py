"""Every thread's current frame, read without the deadlock that `sys._current_frames` can cause.

CPython builds that dict while it holds its lock on the list of threads. The frame objects it
makes may start a garbage collection, whose finalizers may run Python code that lets go of the
GIL (closing a socket) with that lock still held. A thread that then takes the GIL and asks for
the same lock (to raise an exception in a thread, or to end a thread) waits for ever, and the
first one waits for ever for the GIL. (Seen in CI: a local_mt node's removal hung in
`interrupt.wake`, every thread of the process asleep.) So the collector is held off while the
frames are read; `probe`, `watchdog` and `interrupt` read them here.
"""
import gc
import sys
import threading
from types import FrameType
from typing import Dict

_LOCK = threading.Lock()  # so that two readers do not turn the collector back on under each other


def current_frames() -> Dict[int, FrameType]:
    """`sys._current_frames()`, with no garbage collection (and so no finalizer) while it runs."""
    with _LOCK:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return sys._current_frames()  # pylint: disable=protected-access
        finally:
            if enabled:
                gc.enable()
