"""courier.shared_array: a sender's value that lives in shared memory is sent as its own
pages, with no second copy (courier/transport/shm.py)."""

from __future__ import annotations

import numpy as np
import pytest

import courier
from courier.transport import _here
from courier.transport import shm
from tests.courier.conftest import NoServersHere
from tests.courier.test_shared_memory_reuse import _segments, segment_of

pytestmark = pytest.mark.skipif(not shm.ENABLED, reason='no memfd here, or COURIER_SHARED_MEMORY=0')


class _Learner:
    """Parameters made anew in a shared array at each update, as a learner would."""

    def __init__(self):
        self.params = None

    def update(self, value: float, read_only: bool = True) -> None:
        params = courier.shared_array((4, 1 << 18), np.float32)
        params[...] = value
        params.setflags(write=not read_only)
        self.params = params

    def get_params(self):
        return self.params


def test_a_read_only_shared_array_is_sent_as_its_own_pages(make_server, socket_dir,
                                                           monkeypatch):
    monkeypatch.setattr(_here, 'servers', NoServersHere())  # Through the socket.
    monkeypatch.setattr(shm, 'KEEP_BYTES', 0)
    learner = _Learner()
    server = make_server(address=f'unix:{socket_dir}/learner')
    server.bind_object(learner)
    server.Start()
    client = courier.Client(server.address)

    client.update(1.0)
    first, again = client.get_params(), client.get_params()
    # The callers map the learner's own pages: no segment besides the array's exists.
    assert first[0, 0] == 1.0 and not first.flags.writeable
    assert segment_of(first) == segment_of(again) == segment_of(learner.params)
    assert _segments() == {segment_of(learner.params)}

    # The next update never writes into pages a reader still holds.
    held = segment_of(first)
    client.update(2.0)
    second = client.get_params()
    assert segment_of(second) == segment_of(learner.params) != held
    assert (first == 1.0).all() and (second == 2.0).all()
    # Once the readers let go of an update's array, and the learner of it too, its memory
    # serves a later one: two updates' pages in all, not one per update.
    del first, again
    client.update(3.0)
    assert segment_of(learner.params) == held and (client.get_params() == 3.0).all()
    assert len(_segments()) == 2

    # A writable shared array is copied at each send, like any writable array: the learner
    # may still change it.
    client.update(4.0, read_only=False)
    copied = client.get_params()
    assert copied[0, 0] == 4.0 and segment_of(copied) != segment_of(learner.params)


def test_a_small_or_unshared_shared_array_is_a_plain_array(monkeypatch):
    small = courier.shared_array(8, np.int64)
    assert small.shape == (8,) and small.dtype == np.int64 and small.flags.owndata
    shared = courier.shared_array(np.int64(1 << 18), np.float32)  # numpy's ints are lengths.
    assert shared.shape == (1 << 18,) and not shared.flags.owndata and shared.flags.writeable
    with pytest.raises(TypeError, match='not Python objects'):
        courier.shared_array(4, object)
    for shape in ((-1, 1 << 20), (-2, -(1 << 20))):
        with pytest.raises(ValueError, match='negative'):
            courier.shared_array(shape)
    monkeypatch.setattr(shm, 'ENABLED', False)
    large = courier.shared_array((1 << 20,), np.float64)
    assert large.flags.owndata and large.flags.writeable
