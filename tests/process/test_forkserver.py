"""What a process forked by the fork server (`launchpad.process.forkserver`) starts with."""
import os
import threading
import time

from launchpad.process.forkserver import ForkServer

_PROBE = '''import sys
print('numpy.random' in sys.modules, 'numpy' in sys.modules, flush=True)
'''


def test_a_forked_node_does_not_import_numpy_random_unless_it_uses_it(tmp_path, monkeypatch):
    """Its import cost 20-50 ms in every forked node (restarts included), only to reseed
    what the fork server never loaded; a node that imports it later gets a fresh seed."""
    (tmp_path / 'lp_random_probe.py').write_text(_PROBE)
    monkeypatch.setenv('PYTHONPATH', str(tmp_path))
    server = ForkServer(str(tmp_path), notice_period=1.0)
    read_end, write_end = os.pipe()
    try:
        try:
            process = server.spawn('probe', ['-m', 'lp_random_probe'], dict(os.environ),
                                   str(tmp_path), write_end)
        finally:
            os.close(write_end)
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() == 0
        with os.fdopen(read_end) as output:
            assert output.read().split() == ['False', 'True']  # numpy itself is preloaded
    finally:
        server.close()


def test_the_fork_server_reports_an_exit_as_it_happens(tmp_path, monkeypatch):
    """`on_exit` is called once a forked process's exit code is known, so that the launcher
    need not poll for it."""
    (tmp_path / 'lp_random_probe.py').write_text(_PROBE)
    monkeypatch.setenv('PYTHONPATH', str(tmp_path))
    server = ForkServer(str(tmp_path), notice_period=1.0)
    exited = threading.Event()
    server.on_exit = exited.set
    try:
        with open(os.devnull, 'w') as devnull:
            process = server.spawn('probe', ['-m', 'lp_random_probe'], dict(os.environ),
                                   str(tmp_path), devnull.fileno())
        assert exited.wait(60)
        assert process.poll() == 0
    finally:
        server.close()
