"""Fixtures for the node tests: every test must leave no process or temporary directory behind."""
import os
import shutil
import tempfile
import threading
import time

import psutil
import pytest

LAUNCH_TYPES = ['test_mt', 'test_mp']


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch, tmp_path_factory):
    """Fails a test that leaves child processes or launchpad directories behind.

    The test's temporary directories (and its nodes', which inherit TMPDIR) go to a private
    directory, so other programs on the machine cannot confuse the check. Its path is short:
    Unix socket paths are limited to about 100 bytes.
    """
    tmp_path_factory.getbasetemp()  # pytest's own temporary directories stay where they are
    private = tempfile.mkdtemp(prefix='lpt-', dir='/tmp')
    monkeypatch.setenv('TMPDIR', private)
    monkeypatch.setattr(tempfile, 'tempdir', private)
    try:
        yield
        me = psutil.Process()
        deadline = time.monotonic() + 5
        while True:
            children = [child for child in me.children(recursive=True)
                        if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
            if not children or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for child in children:
            child.kill()
        assert not children, f'processes left behind: {[c.cmdline() for c in children]}'
        left = os.listdir(private)
        assert not left, f'directories left behind: {left}'
    finally:
        shutil.rmtree(private, ignore_errors=True)


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
