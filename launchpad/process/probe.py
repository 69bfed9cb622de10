"""What a node process says about itself when asked: its threads' stacks, its calls in flight, its
CPU, memory and threads. Runs in every node process (the worker starts `start_answering`), and in
the launching process for nodes that run as its threads (the observer calls `answer`).

How a question reaches a node: nodes only call their coordinator, so the question waits there
(`launchpad.process.probe_broker`) for the node's probe thread, which always has a call in flight:

    lp-probe thread:  takes a sample of its process's stacks, then calls
                      coordinator.wait_for_probe(name, sample, SAMPLE_INTERVAL); the call returns
                      at once when someone asks, and the thread answers live (answer_probe);
                      else after SAMPLE_INTERVAL, and it goes round again

Why a sample each round: a process stuck in C code with the GIL held runs no Python thread, this
one included, so it cannot answer. The coordinator then answers from the last sample, saying when
it was taken and how long the node has been silent. A sample that did not change is not sent
again, and a sample carries no source lines (a live answer does). Taking one costs well under a
millisecond a second; a live answer is taken while the node's threads run on
(reading the threads' frames stops nothing).

On the node's own host one can do better (`dump_stuck`): the interpreter's fault handler,
registered for DUMP_SIGNAL, writes every thread's current stack from C, without the GIL, into an
unlinked file of the node, whose descriptor the first sample names and `/proc/PID/fd/FD` opens.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import tempfile
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

from courier import errors as courier_errors
from courier import inflight
from launchpad.process.frames import current_frames

STACKS, CALLS, PROCESS = 'stacks', 'calls', 'process'
KINDS = (STACKS, CALLS, PROCESS)
SAMPLE_INTERVAL = 1.0
# Seconds of silence after which a node that does not answer is taken to be stuck (not slow).
STUCK_AFTER = 2 * SAMPLE_INTERVAL + 1
# The call timeout the probe thread's client of the coordinator needs.
CALL_TIMEOUT = SAMPLE_INTERVAL + 10.0
_MAX_FRAMES = 200
_THREAD_NAME = 'lp-probe'


def stacks() -> List[Dict[str, Any]]:
    """The stack of every thread of this process but the probe's own, the main thread first:
    [{'thread': id, 'name', 'daemon', 'frames': [[file, line, function], ...]}], the innermost
    frame last (`with_source` adds each frame's source line)."""
    threads = {thread.ident: thread for thread in threading.enumerate()}
    taken = []
    for ident, frame in current_frames().items():
        thread = threads.get(ident)
        name = thread.name if thread is not None else f'thread {ident}'
        if name == _THREAD_NAME:
            continue
        frames = []
        while frame is not None and len(frames) < _MAX_FRAMES:
            code = frame.f_code
            frames.append([code.co_filename, frame.f_lineno, code.co_name])
            frame = frame.f_back
        frames.reverse()
        taken.append({'thread': ident, 'name': name,
                      'daemon': thread.daemon if thread is not None else None,
                      'frames': frames})
    main = threading.main_thread().ident
    taken.sort(key=lambda t: (t['thread'] != main, t['name'].startswith(('lp-', 'courier')),
                              t['name']))
    return taken


def with_source(taken: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """`taken` (from `stacks`) with each frame's source line added (read where the code is)."""
    import linecache  # pylint: disable=import-outside-toplevel
    for thread in taken:
        for frame in thread['frames']:
            if len(frame) == 3:
                frame.append(linecache.getline(frame[0], frame[1]).strip())
    return taken


def process_stats() -> Dict[str, Any]:
    """This process's pid, CPU seconds (user + system, its children's not), resident memory
    (bytes) and thread count."""
    import psutil  # pylint: disable=import-outside-toplevel
    process = psutil.Process()
    with process.oneshot():
        cpu = process.cpu_times()
        return {'pid': process.pid, 'cpu_seconds': cpu.user + cpu.system,
                'rss': process.memory_info().rss, 'threads': process.num_threads()}


def answer(kinds: Iterable[str], progress: Optional[Any] = None) -> Dict[str, Any]:
    """This process's live answer to a probe of `kinds` (of KINDS): {'live': True, 'taken': wall
    time, 'stacks': ..., 'calls': `courier.inflight.snapshot()`, 'process': `process_stats()`
    with 'progress_age' (seconds since `progress.last`, a `runtime.Progress`)}."""
    kinds = set(kinds)
    unknown = kinds - set(KINDS)
    if unknown:
        raise ValueError(f'unknown probe kinds {sorted(unknown)}; a probe asks for some of '
                         f'{", ".join(KINDS)}.')
    result: Dict[str, Any] = {'live': True, 'taken': time.time(), 'pid': os.getpid()}
    if STACKS in kinds:
        result[STACKS] = with_source(stacks())
    if CALLS in kinds:
        result[CALLS] = inflight.snapshot()
    if PROCESS in kinds:
        result[PROCESS] = process_stats()
        if progress is not None:
            result[PROCESS]['progress_age'] = time.monotonic() - progress.last
    return result


# A real-time signal: no library or program is likely to use it for anything else.
DUMP_SIGNAL = getattr(signal, 'SIGRTMIN', 34) + 7
_DUMP_WAIT = 0.5
_kept: List[Any] = []  # the dump file, open for the life of the process


def _dump_file() -> Optional[Tuple[int, int]]:
    """Registers the fault handler's dump of every thread on DUMP_SIGNAL, into an unlinked file;
    (this pid, its descriptor), or None where that cannot be (no /proc, no such signal)."""
    if not os.path.isdir('/proc/self/fd') or not hasattr(signal, 'SIGRTMIN'):
        return None
    try:
        dump = tempfile.TemporaryFile()
        faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        return None
    _kept.append(dump)
    return os.getpid(), dump.fileno()


def dump_stuck(pid: int, descriptor: int) -> Optional[str]:
    """The current stack of every thread of node process `pid` on this host, written by its fault
    handler (see the module docstring) into its file `descriptor`; None if it cannot be had."""
    path = f'/proc/{pid}/fd/{descriptor}'
    try:
        before = os.stat(path).st_size
        os.kill(pid, DUMP_SIGNAL)
        deadline = time.monotonic() + _DUMP_WAIT
        size = before
        while time.monotonic() < deadline:
            time.sleep(0.02)
            grown = os.stat(path).st_size
            if grown > before and grown == size:  # written, and no longer growing
                break
            size = grown
        with open(path, 'rb') as written:
            written.seek(before)
            text = written.read().decode(errors='replace')
    except OSError:
        return None
    return text or None


def _signature(taken: List[Dict[str, Any]]) -> tuple:
    return tuple((t['thread'], tuple((f[0], f[1]) for f in t['frames'])) for t in taken)


def start_answering(name: str, coordinator, progress: Optional[Any] = None) -> None:
    """Starts the probe thread of node process `name` (see the module docstring); `coordinator`
    is a client with a call timeout of at least CALL_TIMEOUT. A coordinator that does not know
    probes is left alone."""
    dump = _dump_file()

    def run() -> None:
        last = None
        while True:
            taken = stacks()
            signature = _signature(taken)
            sample = None
            if signature != last:
                sample = {'taken': time.time(), STACKS: taken}  # source lines: when asked
                if last is None:
                    sample['dump'] = dump
            try:
                probes = coordinator.wait_for_probe(name, sample, SAMPLE_INTERVAL)
            except courier_errors.UnknownMethodError:
                return
            except Exception:  # pylint: disable=broad-except  (the stop watcher handles loss)
                last = None
                time.sleep(SAMPLE_INTERVAL)
                continue
            last = signature
            if not probes:
                continue
            try:
                kinds = set().union(*(asked for _, asked in probes))
                coordinator.answer_probe(name, [probe for probe, _ in probes],
                                         answer(kinds, progress))
            except Exception:  # pylint: disable=broad-except
                logging.debug('%s could not answer a probe.', name, exc_info=True)

    threading.Thread(target=run, daemon=True, name=_THREAD_NAME).start()
