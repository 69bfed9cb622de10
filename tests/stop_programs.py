"""Acme's distributed DQN, shaped for the stop-order tests: actors -> replay <- learner, a counter
every node reports to, and a steps limiter that calls lp.stop(); the replay is a fake Reverb
server whose clients flush on stop and, as Reverb's writers do, wait for a server that is gone
rather than fail, and hold a stream open until they are closed or freed (Reverb's server waits
for open streams when it stops). Each actor, as Acme's, is an object that a courier node serves
and runs, and that holds its writer. The learner, as Acme's, waits for batches in a queue that a
prefetch thread fills, and its stop handler raises SystemExit in its thread."""
import ctypes
import os
import queue
import threading
import time

import courier
import launchpad as lp


class FakeReverb:
    """A replay server: keeps the items actors insert; at its stop it records (in `record`) which
    actors' final flushes it received, and on a second line the writers whose streams are still
    open, so a test sees that it served until its clients had flushed and were freed."""

    def __init__(self, record: str):
        self._record = record
        self._lock = threading.Lock()
        self._items = 0
        self._flushed = []
        self._streams = set()
        lp.register_stop_handler(self._save)

    def open_stream(self, writer) -> None:
        with self._lock:
            self._streams.add(writer)

    def close_stream(self, writer) -> None:
        with self._lock:
            self._streams.discard(writer)

    def insert(self, actor, items: int, final: bool = False) -> None:
        with self._lock:
            self._items += items
            if final:
                self._flushed.append(actor)

    def sample(self) -> int:
        with self._lock:
            return self._items

    def _save(self) -> None:
        with self._lock:
            flushed = sorted(self._flushed, key=str)
            streams = sorted(self._streams, key=str)
        with open(self._record, 'w') as f:
            f.write(' '.join(map(str, flushed)) + '\n' + ' '.join(map(str, streams)))


class Writer:
    """A Reverb-like writer: buffers items and flushes them to the server; a flush waits for the
    server (retrying) rather than failing, so a flush to a server that shut down blocks. It holds
    a stream to the server open from its creation until it is closed or freed."""

    def __init__(self, replay, actor: int):
        self._replay = replay
        self._actor = actor
        self._buffered = 0
        self._open = True
        replay.open_stream(actor)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._replay.close_stream(self._actor)

    def __del__(self):
        try:
            self.close()
        except Exception:  # pylint: disable=broad-except
            pass  # the server is gone: its stop already counted the stream as open

    def append(self) -> None:
        self._buffered += 1
        if self._buffered == 10:
            self.flush()

    def flush(self, final: bool = False) -> None:
        while True:
            try:
                self._replay.insert(self._actor, self._buffered, final)
                self._buffered = 0
                return
            except courier.ServerUnavailableError:
                time.sleep(0.05)  # the server is gone: wait for it, as Reverb does


class Counter:
    """Acme's counter: every node adds its steps."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = {}

    def increment(self, key: str, n: int) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def get(self, key: str) -> int:
        with self._lock:
            return self._counts.get(key, 0)


class Learner:
    """Acme's learner: a step per batch, which a prefetch thread samples from the replay. Its stop
    handler (as Acme's `runtime_terminator`) makes a last write to the replay (Acme's learner
    writes its last checkpoint), so the replay must still serve when the learner hears the stop,
    and raises SystemExit in the learner's thread. The learner hears it while it waits for a
    batch that never comes (Acme's, when the replay's rate limiter holds its sampler back once
    the actors stopped): only a wait that can be woken lets that SystemExit land."""

    def __init__(self, replay, counter):
        self._replay = replay
        self._counter = counter
        self._steps = 0
        self._starving = threading.Event()  # no more batches come
        self._waiting = threading.Event()  # the learner waits for a batch
        self._ended = threading.Event()

    def get_variables(self) -> int:
        return self._steps

    def run(self) -> None:
        learner_thread = threading.get_ident()
        batches = queue.Queue(maxsize=1)

        def terminate() -> None:
            writer = Writer(self._replay, 'learner')
            writer.flush(final=True)
            writer.close()
            self._starving.set()
            while not self._waits_for(batches):
                time.sleep(0.01)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(learner_thread),
                                                       ctypes.py_object(SystemExit))

        lp.register_stop_handler(terminate)
        threading.Thread(target=self._prefetch, args=(batches,), daemon=True).start()
        try:
            while True:
                self._waiting.set()
                batches.get()
                self._waiting.clear()
                self._steps += 1
                self._counter.increment('learner_steps', 1)
        finally:
            self._ended.set()

    def _waits_for(self, batches: queue.Queue) -> bool:
        """Whether the learner waits for a batch (twice so, 50 ms apart: not just taking one)."""
        for _ in range(2):
            if not (self._waiting.is_set() and batches.empty()):
                return False
            time.sleep(0.05)
        return True

    def _prefetch(self, batches: queue.Queue) -> None:
        seen = 0
        while not self._ended.is_set():
            try:
                items = self._replay.sample()
            except courier.ServerUnavailableError:
                items = seen  # the replay is gone: wait for it, as Reverb's datasets do
            if items <= seen or self._starving.is_set():
                time.sleep(0.01)
                continue
            seen = items
            while not (self._ended.is_set() or self._starving.is_set()):
                try:
                    batches.put(items, timeout=0.1)
                    break
                except queue.Full:
                    pass


class Actor:
    """Acme's actor (an environment loop that a courier node serves and runs): acts, writes to
    the replay, reports to the counter; its stop handler flushes its writer (a blocking call to
    the replay), after which its loop ends. It holds its writer, whose stream stays open until
    the actor is freed. As Acme's clients do, it waits out a node that does not answer rather
    than fail."""

    def __init__(self, replay, learner, counter, index: int):
        self._writer = Writer(replay, index)
        self._learner = learner
        self._counter = counter
        self._flushed = threading.Event()

    def steps(self) -> int:
        return self._counter.get('actor_steps')

    def run(self) -> None:
        lp.register_stop_handler(self._flush)
        while not self._flushed.is_set():
            try:
                self._learner.get_variables()
                self._counter.increment('actor_steps', 1)
            except courier.ServerUnavailableError:
                time.sleep(0.05)
            self._writer.append()
            time.sleep(0.005)

    def _flush(self) -> None:
        self._writer.flush(final=True)
        self._flushed.set()


def steps_limiter(counter, max_steps: int) -> None:
    """Acme's StepsLimiter: stops the program once the actors made `max_steps` steps."""
    while counter.get('actor_steps') < max_steps:
        time.sleep(0.05)
    print(f'StepsLimiter: terminating (pid {os.getpid()})', flush=True)
    lp.stop()


def dqn_program(record: str, actors: int = 3, max_steps: int = 200,
                colocate: bool = False) -> lp.Program:
    """The DQN-shaped program (see the module docstring); with `colocate`, the learner and the
    replay run in one executable."""
    program = lp.Program('dqn')
    counter = program.add_node(lp.CourierNode(Counter), label='counter')
    replay_node = lp.CourierNode(FakeReverb, record)
    if colocate:
        replay = replay_node.create_handle()
        learner_node = lp.CourierNode(Learner, replay, counter)
        learner = learner_node.create_handle()
        program.add_node(lp.MultiThreadingColocation([learner_node, replay_node]),
                         label='learner')
    else:
        replay = program.add_node(replay_node, label='replay')
        learner = program.add_node(lp.CourierNode(Learner, replay, counter), label='learner')
    with program.group('actor'):
        for i in range(actors):
            program.add_node(lp.CourierNode(Actor, replay, learner, counter, i))
    program.add_node(lp.PyNode(steps_limiter, counter, max_steps), label='limiter')
    return program
