"""Shared memory is reused between transfers, never while a reader may still read it
(courier/transport/shm.py), and a client redials a server that knows no offers."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import courier
from courier.transport import _here
from courier.transport import frames
from courier.transport import shm
from tests.courier.conftest import NoServersHere

pytestmark = pytest.mark.skipif(not shm.ENABLED, reason='no memfd here, or COURIER_SHARED_MEMORY=0')

LARGE = 4 << 20


def segment_of(array: np.ndarray, pid: object = 'self') -> str:
    """The inode of the shared memory that ``array`` is mapped on (in process ``pid``)."""
    address = array.ctypes.data if isinstance(array, np.ndarray) else array
    with open(f'/proc/{pid}/maps') as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(bound, 16) for bound in fields[0].split('-'))
            if '/memfd:courier' in line and start <= address < end:
                return fields[4]
    raise AssertionError(f'{address:#x} is not in shared memory')


def _segments(pid: object = 'self') -> set:
    with open(f'/proc/{pid}/maps') as maps:
        return {line.split()[4] for line in maps if '/memfd:courier' in line}


def _fresh(value: float) -> np.ndarray:
    """A new writable array each call: the server writes it into shared memory each time."""
    return np.full(LARGE // 8, value)


@pytest.fixture
def fresh_server(make_server, socket_dir, monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())  # Through the socket.
    server = make_server(address=f'unix:{socket_dir}/s')
    server.Bind('fresh', _fresh)
    server.Start()
    return server


def test_a_segment_is_written_again_only_once_no_reader_holds_it(fresh_server, monkeypatch):
    client = courier.Client(fresh_server.address)
    held = client.fresh(1.0)
    segments = set()
    for value in range(2, 10):
        result = client.fresh(float(value))
        assert result[0] == value and result[-1] == value and not result.flags.writeable
        segments.add(segment_of(result))
        del result
    # What a reader holds is never written over, and the rest is reused: 8 results in at
    # most 2 segments (the server may still hold the last one's description a moment).
    assert (held == 1.0).all()
    assert segment_of(held) not in segments and len(segments) <= 2
    # A sender keeps no idle segments beyond COURIER_SHARED_MEMORY_KEEP_BYTES, and a reader
    # then drops its mappings of them: their memory goes.
    monkeypatch.setattr(shm, 'KEEP_BYTES', 0)
    del held
    last = client.fresh(11.0)
    assert last[0] == 11.0 and _segments() == {segment_of(last)}


_HOLD = '''
import sys
import courier
held = courier.Client(sys.argv[1]).fresh(1.0)
print('holding', flush=True)
sys.stdin.read()
'''


def test_a_killed_reader_frees_its_segment_for_reuse(fresh_server, subprocess_env, monkeypatch):
    monkeypatch.setattr(shm, '_pool', shm._Pool())  # pylint: disable=protected-access
    client = courier.Client(fresh_server.address)
    reader = subprocess.Popen([sys.executable, '-c', _HOLD, fresh_server.address],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=subprocess_env,
                              text=True)
    try:
        assert reader.stdout.readline().strip() == 'holding'
        (held,) = _segments(reader.pid)

        def all_at_once(count: int) -> set:  # Each result held while the next is written.
            results = [client.fresh(float(value)) for value in range(count)]
            assert [result[-1] for result in results] == list(range(count))
            return {segment_of(result) for result in results}

        # The server then has 4 segments besides the reader's: all are used below.
        assert held not in all_at_once(4)  # Not while the reader lives,
        reader.kill()
        reader.wait()
        assert held in all_at_once(5)  # and at once after it was killed.
    finally:
        reader.kill()
        reader.wait()
        reader.stdin.close()
        reader.stdout.close()


def _resident(pid: int, segment: str) -> int:
    """Bytes of the segment (by inode) that process ``pid``'s mappings of it hold in memory."""
    total, inside = 0, False
    with open(f'/proc/{pid}/smaps') as smaps:
        for line in smaps:
            fields = line.split()
            if '-' in fields[0] and len(fields) >= 5:  # A mapping's first line.
                inside = '/memfd:courier' in line and fields[4] == segment
            elif inside and fields[0] == 'Rss:':
                total += int(fields[1]) << 10
    return total


_IDLE = '''
import gc, sys
import courier
held = courier.Client(sys.argv[1]).fresh(1.0)
print(held.ctypes.data, held.sum(), flush=True)  # Every page read.
sys.stdin.readline()
del held
gc.collect()
print('dropped', flush=True)
sys.stdin.read()
'''


def test_a_segment_its_sender_drops_leaves_an_idle_reader_at_once(fresh_server, subprocess_env,
                                                                  monkeypatch):
    monkeypatch.setattr(shm, '_pool', shm._Pool())  # pylint: disable=protected-access
    monkeypatch.setattr(shm, 'KEEP_BYTES', 0)
    fresh_server.Bind('larger', lambda: np.ones(LARGE // 4))
    reader = subprocess.Popen([sys.executable, '-c', _IDLE, fresh_server.address],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=subprocess_env,
                              text=True)
    try:
        segment = segment_of(int(reader.stdout.readline().split()[0]), reader.pid)
        assert _resident(reader.pid, segment) == LARGE
        reader.stdin.write('\n')
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == 'dropped'
        # The reader keeps its idle mapping while the sender keeps the segment for reuse.
        assert segment in _segments(reader.pid)
        # A send of another size: with no idle segments kept, the sender drops that one, and
        # its pages go at once, also from the idle reader's mapping (which receives nothing).
        # (The server's worker may hold the reader's description a moment after the answer
        # went out: the segment is idle, and so dropped, from then on.)
        client = courier.Client(fresh_server.address)
        deadline = time.monotonic() + 10
        while _resident(reader.pid, segment) and time.monotonic() < deadline:
            larger = client.larger()
            assert segment_of(larger) != segment
            del larger
        assert _resident(reader.pid, segment) == 0
    finally:
        reader.kill()
        reader.wait()
        reader.stdin.close()
        reader.stdout.close()


def test_a_client_redials_a_server_that_knows_no_offers(fresh_server, monkeypatch):
    # A server older than shared memory refuses any offer in the hello (as with no
    # CAPABILITIES): the client says hello again without it, and buffers cross the socket.
    monkeypatch.setattr(frames, 'CAPABILITIES', 0)
    result = courier.Client(fresh_server.address).fresh(4.0)
    assert result[0] == 4.0 and result.flags.writeable
