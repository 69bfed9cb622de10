"""Fixtures for the node tests: the core's leak checks, and helpers."""
import threading

import launchpad as lp

from tests.core.conftest import no_leftovers, private_tmpdir  # pylint: disable=unused-import

LAUNCH_TYPES = ['test_mt', 'test_mp']


def in_threads(count, function):
    """Runs `function(index)` for index in range(count), in threads started together; returns
    the results in order."""
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(index):
        barrier.wait()
        results[index] = function(index)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def launch_and_wait(program, launch_type, timeout=60, notice_period=5):
    """Launches `program`, waits for it to end (raising a node's failure) and stops it anyway."""
    controller = lp.launch(program, launch_type=launch_type, notice_period=notice_period)
    try:
        assert controller.wait(timeout=timeout)
    finally:
        controller.stop()
    return controller
