"""The framed server's worker pool: no submitted job waits on a worker that may never come back."""
import queue
import threading

from courier.transport.pool import Pool


class _SlowHandOver:
    """A job queue whose `get` pauses after taking a job, before the worker stops counting as
    waiting: the moment in which a submitter may take the worker for a waiting one."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self.taken = threading.Event()
        self.go_on = threading.Event()

    def put(self, item):
        self._jobs.put(item)

    def empty(self):
        return self._jobs.empty()

    def get(self):
        item = self._jobs.get()
        if item is not None and not self.taken.is_set():
            self.taken.set()
            self.go_on.wait(10)
        return item


def test_a_job_submitted_while_a_worker_takes_another_still_gets_a_thread():
    pool = Pool(2, 'test-pool')
    jobs = pool._jobs = _SlowHandOver()  # pylint: disable=protected-access
    release = threading.Event()
    ran = threading.Event()
    try:
        pool.submit(release.wait)  # the first worker's job: it keeps its thread for long
        assert jobs.taken.wait(10)
        pool.submit(ran.set)  # the worker still counts as waiting here
        jobs.go_on.set()
        assert ran.wait(10), 'the second job waited for a worker busy with a long job'
    finally:
        release.set()
        jobs.go_on.set()
        pool.stop(timeout=10)
