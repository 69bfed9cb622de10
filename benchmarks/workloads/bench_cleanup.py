"""Ends every process a benchmark run started, found by a marker in its environment.

A launcher that dies can leave its node processes behind (dm-launchpad's local_mp does), and Ray
moves its workers into process groups of their own, so neither the process tree nor the process
group finds them all. Every process inherits its parent's environment, so a variable set before
anything is started marks them all.
"""
from __future__ import annotations

import os
from typing import List

import psutil

MARKER_ENV = 'LAUNCHPAD_BENCH_MARKER'


def _protected_pids() -> set:
    """This process and its ancestors: a sweep must never end its own caller."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


def marked_processes(marker: str) -> List[psutil.Process]:
    """Live processes (not this one nor its ancestors) whose environment carries `marker`."""
    protected = _protected_pids()
    found = []
    for proc in psutil.process_iter():
        if proc.pid in protected:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARKER_ENV) == marker:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_marked_processes(marker: str, grace_s: float = 2.0,
                          exit_wait_s: float = 0.0) -> List[int]:
    """Ends every process carrying `marker` and returns the pids it had to end.

    Processes get `exit_wait_s` to exit by themselves (a system that is shutting down), then
    SIGTERM, then SIGKILL for those still alive after `grace_s`.
    """
    procs = marked_processes(marker)
    if procs and exit_wait_s > 0:
        _, procs = psutil.wait_procs(procs, timeout=exit_wait_s)
    alive = procs
    for end in (psutil.Process.terminate, psutil.Process.kill):
        for proc in alive:
            try:
                end(proc)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in procs]


def new_marker() -> str:
    """A marker unique to one run."""
    return f'{os.getpid()}-{os.urandom(6).hex()}'
