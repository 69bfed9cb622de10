"""`import courier` stays light: grpc is imported only once gRPC is spoken.

(tests/test_layout.py checks how courier's modules import each other.)
"""

from __future__ import annotations

import subprocess
import sys

_GRPC_SCRIPT = '''
import os, shutil, sys, tempfile
import courier
print('grpc' in sys.modules)
directory = tempfile.mkdtemp(prefix='courier-')
server = courier.Server(address=f'unix:{directory}/s')
server.Bind('add', lambda x, y: x + y)
server.Start()
client = courier.Client(server.address, call_timeout=30)
assert client.add(1, 2) == 3 and client.futures.add(3, 4).result() == 7
assert courier.list_methods(client) == ['add']
server.Stop()
shutil.rmtree(directory)
print('grpc' in sys.modules)
server = courier.Server()
server.Bind('add', lambda x, y: x + y)
server.Start()
client = courier.Client(server.address, call_timeout=30)
assert client.add(1, 2) == 3 and client.futures.add(3, 4).result() == 7
print('grpc' in sys.modules)
assert courier.Client(server.address, call_timeout=30, protocol='grpc').add(5, 6) == 11
server.Stop()
print('grpc' in sys.modules)
'''


def test_grpc_is_imported_only_once_grpc_is_spoken(subprocess_env):
    result = subprocess.run([sys.executable, '-c', _GRPC_SCRIPT], capture_output=True,
                            text=True, timeout=60, check=False, env=subprocess_env)
    assert result.returncode == 0, result.stderr
    # After `import courier`, after a unix: server and its clients, after a TCP server and
    # its framed clients, after a gRPC client of that server (its gRPC service starts).
    assert result.stdout.split() == ['False', 'False', 'False', 'True']


def test_a_process_that_imports_the_test_fixtures_leaves_nothing_behind(subprocess_env, tmp_path):
    """A spawned child imports tests.courier.conftest to unpickle a test's function: that must
    make no directory (a child never removes one) and cost no Hypothesis import."""
    script = 'import sys, tests.courier.conftest; print("hypothesis" in sys.modules)'
    env = {**subprocess_env, 'TMPDIR': str(tmp_path)}
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                            timeout=60, check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['False']
    assert not list(tmp_path.iterdir())
