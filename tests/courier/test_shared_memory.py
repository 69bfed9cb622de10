"""Large buffers between processes of one host travel in shared memory (courier/transport/shm.py)."""

from __future__ import annotations

import gc
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import pytest

import courier
from courier.transport import _here
from courier.transport import frames
from courier.transport import shm
from launchpad.nodes import cacher
from tests.courier.conftest import NoServersHere
from tests.courier.conftest import free_tcp_address
from tests.courier.conftest import over_tcp_only
from tests.courier.test_shared_memory_reuse import segment_of

pytestmark = pytest.mark.skipif(not shm.ENABLED, reason='no memfd here, or COURIER_SHARED_MEMORY=0')

LARGE = 4 << 20


def _memfd_mappings() -> set:
    """The inodes of this process's mappings of courier's shared memory."""
    with open('/proc/self/maps') as maps:
        return {line.split()[4] for line in maps if '/memfd:courier' in line}


def _memfd_files(pid: object = 'self') -> int:
    """How many of courier's memfds a process holds open."""
    count = 0
    for name in os.listdir(f'/proc/{pid}/fd'):
        try:
            count += os.readlink(f'/proc/{pid}/fd/{name}').startswith('/memfd:courier')
        except OSError:
            pass
    return count


def _settled(expected, read, seconds: float = 10.0):
    """What ``read()`` returns once it is ``expected`` (or after ``seconds``): a server's worker
    drops its references to a call's buffers just after the answer went out."""
    deadline = time.monotonic() + seconds
    while read() != expected and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return read()


class _Learner:
    """Serves the same read-only parameters until they are replaced."""

    def __init__(self):
        self.params = None
        self.update()

    def update(self):
        params = np.random.default_rng().random(LARGE // 8)
        params.setflags(write=False)
        self.params = params

    def get_params(self):
        return self.params

    def echo(self, value):
        return value


def test_large_buffers_arrive_read_only_in_shared_memory_and_small_ones_inline(
        make_server, socket_dir, monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())  # Through the socket.
    learner = _Learner()
    tcp = free_tcp_address()
    for address in (f'unix:{socket_dir}/s', tcp):
        server = make_server(address=address)
        server.bind_object(learner)
        server.Start()
    array = np.arange(LARGE // 4, dtype=np.float32)
    echoed = courier.Client(f'unix:{socket_dir}/s').echo({'large': array, 'small': array[:10]})
    np.testing.assert_array_equal(echoed['large'], array)
    assert not echoed['large'].flags.writeable  # Mapped read-only onto the shared memory,
    with pytest.raises(ValueError):
        echoed['large'][0] = 1
    writable = echoed['large'].copy()  # and a copy is writable.
    writable[0] = 1
    assert echoed['small'].flags.writeable  # Under the threshold: through the socket.
    segment_of(echoed['large'])  # Raises unless it is mapped on shared memory.
    # TCP clients (on other hosts: test_same_host.py) get the bytes inline, writable, as before.
    over_tcp_only(monkeypatch)
    over_tcp = courier.Client(tcp).echo(array)
    assert over_tcp.flags.writeable and np.array_equal(over_tcp, array)
    # Its memory stays for the next buffers once its readers let go, and goes when its sender
    # no longer keeps it (test_shared_memory_reuse.py).


def test_one_value_reaches_many_readers_in_the_same_pages(make_server, socket_dir, monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())
    learner = _Learner()
    source = make_server(address=f'unix:{socket_dir}/learner')
    source.bind_object(learner)
    source.Start()
    client = courier.Client(source.address)
    # A cacher passes on what it received without copying it.
    cached = make_server(address=f'unix:{socket_dir}/cacher')
    cached.bind_object(cacher._CachingForwarder(client, 10.0, 20.0))  # pylint: disable=protected-access
    cached.Start()
    readers = [client.get_params(), client.futures.get_params().result(),
               courier.Client(source.address).get_params(),
               courier.Client(cached.address).get_params(),
               courier.Client(cached.address).futures.get_params().result()]
    for params in readers:
        np.testing.assert_array_equal(params, learner.params)
    assert len({params.ctypes.data for params in readers}) == 1  # One mapping in this process,
    old = {segment_of(params) for params in readers}
    assert len(old) == 1  # all of one file: written once.
    learner.update()  # A new value, asked for by many at once: written once more.
    futures = [courier.Client(source.address).futures.get_params() for _ in range(6)]
    fresh = [future.result() for future in futures]
    np.testing.assert_array_equal(fresh[0], learner.params)
    assert len({segment_of(params) for params in fresh} | old) == 2


_SERVE = '''
import sys, time
import numpy as np
import courier
server = courier.Server(address=sys.argv[1])
params = np.ones({size} // 8)
params.setflags(write=False)
server.Bind('get_params', lambda: params)
server.Bind('fresh', lambda: np.ones({size} // 8))
server.Start()
print('ready', flush=True)
time.sleep(600)
'''

_READ = '''
import sys, time
import courier
client = courier.Client(sys.argv[1])
held = [client.get_params(), client.fresh()]
print('holding', flush=True)
time.sleep(600)
'''


def _start(script: str, address: str, env: dict) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, '-c', script.format(size=LARGE), address],
                               stdout=subprocess.PIPE, env=env, text=True)
    assert process.stdout.readline().strip() in ('ready', 'holding')
    return process


def _end(*processes: Optional[subprocess.Popen]) -> None:
    """Kills the processes that ``_start`` started (None: not started)."""
    for process in processes:
        if process is not None:
            process.kill()
            process.wait()
            process.stdout.close()


def test_nothing_is_left_after_readers_and_servers_are_killed(socket_dir, subprocess_env):
    def shm_names():  # But POSIX semaphores (sem.*): other processes' multiprocessing locks.
        names = os.listdir('/dev/shm') if os.path.isdir('/dev/shm') else []
        return {name for name in names if not name.startswith('sem.')}

    names = shm_names()
    gc.collect()
    mapped, files = _memfd_mappings(), _memfd_files()  # What earlier tests' senders keep.
    address = f'unix:{socket_dir}/s'
    server = _start(_SERVE, address, subprocess_env)
    reader = None
    try:
        reader = _start(_READ, address, subprocess_env)
        # The server keeps two segments (each a descriptor, and its mapping's): its read-only
        # value's while the value lives, with the reader's description of it that it passes,
        # and the fresh result's for the next results; that one's reader's description went.
        assert _settled(5, lambda: _memfd_files(server.pid)) == 5
        reader.kill()
        reader.wait()
        client = courier.Client(address)
        params = client.get_params()
        assert params.sum() == LARGE // 8 and _memfd_mappings()
        server.send_signal(signal.SIGKILL)
        server.wait()
        assert params.sum() == LARGE // 8  # A reader keeps its memory after the server died.
        del params
        gc.collect()
        assert _memfd_mappings() == mapped and _memfd_files() == files
        assert shm_names() == names  # Never a name in /dev/shm.
    finally:
        _end(reader, server)


def test_a_peer_passing_bad_shared_memory_loses_only_its_connection(make_server, socket_dir):
    server = make_server(address=f'unix:{socket_dir}/s')
    server.Bind('echo', lambda value: value)
    server.Start()
    path = f'{socket_dir}/s'

    def fault_for(offer: int, descriptor=None) -> bytes:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        frames.send(sock, frames.encode(frames.HELLO, frames.SYNC | offer, frames.VERSION,
                                        b'', frames.MAGIC))
        reader = frames.FrameReader(sock)
        assert reader.read_frame().kind == frames.WELCOME
        parts = frames.encode(frames.CALL, 0, 0, b'echo', b'x', [b'y' * 16])
        head = bytearray(parts[0][:frames.HEADER.size + 8])
        head[frames.HEADER.size:] = (LARGE | shm.SHARED_BIT).to_bytes(8, 'little')
        header = frames.HEADER.unpack_from(head)
        head[:frames.HEADER.size] = frames.HEADER.pack(*header[:5], 1)  # The pickle: b'x'.
        ancillary = [] if descriptor is None else [
            (socket.SOL_SOCKET, socket.SCM_RIGHTS, descriptor.to_bytes(4, 'little'))]
        sock.sendmsg([bytes(head) + b'echo' + b'x'], ancillary)
        answer = reader.read_frame()
        sock.close()
        assert answer.kind == frames.FAULT
        return answer.text

    assert b'without it' in fault_for(0)  # Shared memory the hello did not agree to.
    unsealed = os.memfd_create('not-courier')
    os.ftruncate(unsealed, LARGE)
    try:
        assert b'not sealed' in fault_for(frames.SHARED_MEMORY, unsealed)
    finally:
        os.close(unsealed)
    assert courier.Client(server.address).echo(3) == 3  # The server goes on serving.
