"""`lp.batched_handler` on a CourierNode, the way Acme serves batched inference."""
import numpy as np
import pytest

import launchpad as lp

from tests.nodes.conftest import LAUNCH_TYPES, in_threads, launch_and_wait

BATCH_SIZE = 4


class BatchedPolicy:
    """Wraps a bound method with lp.batched_handler in __init__, as Acme's inference servers do."""

    def __init__(self):
        self._batch_sizes = []
        self.compute = lp.batched_handler(batch_size=BATCH_SIZE, timeout=0.5, pad_batch=True,
                                          max_parallelism=2)(self._compute)

    def _compute(self, observation):
        self._batch_sizes.append(len(observation))
        return observation * 2

    def batch_sizes(self):
        return list(self._batch_sizes)


def call_concurrently(policy):
    callers = 2 * BATCH_SIZE
    results = in_threads(callers, lambda index: policy.compute(np.full(3, index)))
    for index, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full(3, 2 * index))
    sizes = policy.batch_sizes()
    assert all(size == BATCH_SIZE for size in sizes), sizes  # short batches were padded
    assert len(sizes) < callers, sizes  # callers shared calls
    lp.stop()


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_concurrent_callers_get_batched_results(launch_type):
    program = lp.Program('batching')
    policy = program.add_node(
        lp.CourierNode(BatchedPolicy, courier_kwargs={'thread_pool_size': 4 * BATCH_SIZE}),
        label='policy')
    program.add_node(lp.PyNode(call_concurrently, policy), label='actors')
    launch_and_wait(program, launch_type)
