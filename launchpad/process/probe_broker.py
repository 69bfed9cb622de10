"""Questions to nodes, held by the coordinator until the nodes fetch them: live stacks, calls in
flight, process numbers (`launchpad.process.probe` answers them in each node process).

Nodes only call the coordinator, never the reverse, so a question waits here for the node's
probe thread, whose `wait_for_probe` call is nearly always in flight and returns at once when a
question comes (the node face). The observer asks with `probe` (the control face) and gets, per
node, the live answer, or, when none came within its timeout, what is known without one:

    {'live': False, 'silent': seconds since the node last fetched (None: never),
     'stacks': its last sample of its stacks (or None), 'taken': when that was taken,
     'unchanged': seconds since the sample before it differed, 'dump': (pid, descriptor) of
     the file its fault handler dumps its stacks into (`probe.dump_stuck`), or None}

A node that does not answer but fetched within the last rounds was merely slow; one silent for
longer holds the GIL (stuck in C code), is stopped, or is gone.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

Probe = Tuple[int, List[str]]  # (probe id, the kinds it asks for)


class ProbeBroker:
    """Holds questions for nodes and their answers (see the module docstring)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._ids = itertools.count(1)
        self._pending: Dict[str, List[Probe]] = {}
        self._answers: Dict[int, Dict[str, dict]] = {}
        self._samples: Dict[str, dict] = {}  # node -> {'stacks', 'taken', 'changed'}
        self._heard: Dict[str, float] = {}  # node -> when it last fetched (monotonic)
        self._closed = False

    def wait_for_probe(self, name: str, sample: Optional[dict] = None,
                       timeout: float = 1.0) -> List[Probe]:
        """Node process `name` hands over its latest stack sample (None: unchanged) and waits up
        to `timeout` seconds for questions; returns them ([]: none came)."""
        deadline = time.monotonic() + min(float(timeout), 30.0)
        with self._changed:
            self._heard[name] = time.monotonic()
            if sample is not None:
                dump = (sample['dump'] if 'dump' in sample  # a new process's first sample
                        else (self._samples.get(name) or {}).get('dump'))
                self._samples[name] = {'stacks': sample.get('stacks'), 'taken': sample.get('taken'),
                                       'changed': time.time(), 'dump': dump}
            elif name in self._samples:
                self._samples[name]['taken'] = time.time()
            while not self._pending.get(name) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._changed.wait(left)
            self._heard[name] = time.monotonic()
            return self._pending.pop(name, [])

    def close(self) -> None:
        """The program has ended: the waits in flight return now, and later ones at once (so
        that the coordinator's server, stopping, does not wait for the calls of gone nodes)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def answer_probe(self, name: str, probe_ids: List[int], answer: dict) -> None:
        """Node process `name` answers the probes `probe_ids` it fetched."""
        with self._changed:
            self._heard[name] = time.monotonic()
            for probe_id in probe_ids:
                if probe_id in self._answers:  # else its asker gave up
                    self._answers[probe_id][name] = answer
            self._changed.notify_all()

    def probe(self, names: Iterable[str], kinds: Iterable[str], timeout: float
              ) -> Dict[str, dict]:
        """Asks nodes `names` for `kinds`; waits up to `timeout` seconds for their answers;
        returns node -> its answer, or what is known without one (the module docstring)."""
        names, kinds = list(names), list(kinds)
        deadline = time.monotonic() + timeout
        with self._changed:
            probe_id = next(self._ids)
            answers = self._answers[probe_id] = {}
            for name in names:
                self._pending.setdefault(name, []).append((probe_id, kinds))
            self._changed.notify_all()
            while len(answers) < len(names) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            del self._answers[probe_id]
            now = time.monotonic()
            for name in names:
                waiting = self._pending.get(name)
                if waiting is not None:
                    waiting[:] = [p for p in waiting if p[0] != probe_id]
                    if not waiting:
                        del self._pending[name]
                if name not in answers:
                    answers[name] = self._unanswered(name, now)
            return answers

    def _unanswered(self, name: str, now: float) -> Dict[str, Any]:
        heard = self._heard.get(name)
        sample = self._samples.get(name) or {}
        changed = sample.get('changed')
        return {'live': False, 'silent': None if heard is None else now - heard,
                'stacks': sample.get('stacks'), 'taken': sample.get('taken'),
                'unchanged': None if changed is None else time.time() - changed,
                'dump': sample.get('dump')}
