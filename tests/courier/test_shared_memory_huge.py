"""Shared memory on huge pages: a sender advises its segments for them, and a receiver drops
its page tables of a segment it no longer holds only where they map huge pages
(courier/transport/shm.py)."""

from __future__ import annotations

import gc
import os
import time
from typing import Dict

import numpy as np
import pytest

import courier
from courier.transport import _here
from courier.transport import shm
from tests import testbeds
from tests.courier.conftest import NoServersHere
from tests.courier.test_shared_memory_reuse import segment_of

pytestmark = pytest.mark.skipif(not shm.ENABLED, reason='no memfd here, or COURIER_SHARED_MEMORY=0')

LARGE = 4 << 20  # Two huge pages.


def _mapping(address: int) -> Dict[str, str]:
    """The smaps fields of this process's mapping holding ``address`` (with 'Range' and
    'Perms' from its first line); empty if none does."""
    fields: Dict[str, str] = {}
    with open('/proc/self/smaps') as smaps:
        for line in smaps:
            if not line[:1].isupper():  # A mapping's first line.
                if fields:
                    break
                bounds, perms = line.split()[:2]
                start, end = (int(bound, 16) for bound in bounds.split('-'))
                if start <= address < end:
                    fields = {'Range': bounds, 'Perms': perms}
            elif fields:
                name, _, value = line.partition(':')
                fields[name] = value.strip()
    return fields


def _kib(fields: Dict[str, str], name: str) -> int:
    return int(fields[name].split()[0]) << 10


def _idle(address: int) -> None:
    """Waits until no array of this process lives on the mapping holding ``address``."""
    gc.collect()
    inode = int(segment_of(address))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        mapped = [mapped for key, mapped in list(shm._mappings._mapped.items())  # pylint: disable=protected-access
                  if key[1] == inode]
        if mapped and not mapped[0].owners:
            return
        time.sleep(0.01)
    raise AssertionError('an array on the segment still lives')


@pytest.fixture
def client(make_server, socket_dir, monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())  # Through the socket.
    server = make_server(address=f'unix:{socket_dir}/s')
    server.Bind('ones', lambda size: np.ones(size // 8))  # Written into a segment each call.
    server.Start()
    return courier.Client(server.address)


@pytest.mark.skipif(not os.path.isdir('/sys/kernel/mm/transparent_hugepage'),
                    reason='a kernel without transparent huge pages')
def test_a_sender_advises_its_segments_for_huge_pages(client):
    received = client.ones(LARGE)
    inode = segment_of(received)
    with open('/proc/self/maps') as maps:  # The server's own, writable mapping of it.
        (line,) = [line for line in maps if '/memfd:courier' in line
                   and line.split()[4] == inode and line.split()[1] == 'rw-s']
    flags = _mapping(int(line.split('-')[0], 16))['VmFlags'].split()
    assert 'hg' in flags, flags


def test_a_reader_keeps_its_small_pages_of_a_segment_mapped(client, monkeypatch):
    # Smaller than a huge page: mapping it again would cost a fault per 64 KiB at each use.
    monkeypatch.setattr(shm, 'MIN_BYTES', 1 << 20)
    received = client.ones(1 << 20)
    address = received.ctypes.data
    assert received.sum() == (1 << 20) // 8
    del received
    _idle(address)
    assert _kib(_mapping(address), 'Rss') == 1 << 20


@pytest.fixture
def huge_pages(monkeypatch):
    """Huge pages for shared memory, as an admin gives them (docs/courier.md): the kernel's
    own setting where it gives them already, else set for the test (root; tests/testbeds).
    Senders start with no segments: earlier tests' idle ones have small pages."""
    monkeypatch.setattr(shm, '_pool', shm._Pool())  # pylint: disable=protected-access
    if shm.shmem_huge_pages():
        yield
    else:
        with testbeds.shmem_huge_pages():
            assert shm.shmem_huge_pages()
            yield


def test_a_reader_lets_go_of_huge_pages_of_a_segment_it_no_longer_holds(huge_pages, client):
    received = client.ones(LARGE)
    address = received.ctypes.data
    assert received.sum() == LARGE // 8
    mapping = _mapping(address)
    assert _kib(mapping, 'ShmemPmdMapped') == _kib(mapping, 'Rss') == LARGE, mapping
    del received
    _idle(address)
    # The mapping stays (the sender keeps the segment for its next value), without pages.
    deadline = time.monotonic() + 10
    while _kib(_mapping(address), 'Rss') and time.monotonic() < deadline:
        time.sleep(0.01)
    mapped = _mapping(address)
    assert mapped['Range'] == mapping['Range'] and _kib(mapped, 'Rss') == 0, mapped
    # Read again through huge pages, wherever the next value lands.
    again = client.ones(LARGE)
    assert again.sum() == LARGE // 8
    assert _kib(_mapping(again.ctypes.data), 'ShmemPmdMapped') == LARGE
