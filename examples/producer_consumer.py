"""Producer-consumer: the smallest launchpad program.

Topology:

    producer/0  Range(0, N)   --.
                                 >--  consumer/0  prints every value, then stops the program
    producer/1  Range(N, 2N)  --'

Each producer is a `CourierNode` serving a `Range` object; the consumer gets the producers' handles
as clients, pulls values from both in turn until they run dry, and calls `lp.stop()`.

    python -m launchpad.launch --type=local_mp examples/producer_consumer.py --count=3
"""
from __future__ import annotations

from typing import Optional, Sequence

from absl import app, flags

import launchpad as lp

_PRODUCERS = flags.DEFINE_integer('producers', 2, 'Number of producers.')
_COUNT = flags.DEFINE_integer('count', 3, 'Values each producer hands out.')


class Range:
    """Hands out start, start + 1, ..., end - 1, one per call to `next`, then None."""

    def __init__(self, start: int, end: int):
        self._next = start
        self._end = end

    def next(self) -> Optional[int]:
        if self._next >= self._end:
            return None
        value, self._next = self._next, self._next + 1
        return value


class Consumer:
    """Takes values from its producers in turn until every producer is exhausted."""

    def __init__(self, producers: Sequence):
        self._producers = list(producers)

    def run(self) -> None:
        values = []
        active = list(enumerate(self._producers))
        while active:
            for index, producer in list(active):
                value = producer.next()
                if value is None:
                    active.remove((index, producer))
                else:
                    print(f'got {value} from producer/{index}', flush=True)
                    values.append(value)
        print(f'Consumed {len(values)} values from {len(self._producers)} producers, '
              f'sum {sum(values)}.', flush=True)
        lp.stop()


def make_program(num_producers: int, count: int) -> lp.Program:
    program = lp.Program('producer_consumer')
    with program.group('producer'):
        producers = [program.add_node(lp.CourierNode(Range, i * count, (i + 1) * count))
                     for i in range(num_producers)]
    program.add_node(lp.PyClassNode(Consumer, producers), label='consumer')
    return program


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
    lp.launch(make_program(_PRODUCERS.value, _COUNT.value))


if __name__ == '__main__':
    app.run(main)
