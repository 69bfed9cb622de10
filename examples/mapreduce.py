"""MapReduce word count: one mapper per text file, K reducers by key hash, one output file.

Topology (F files, K reducers):

    master/0 ---- map() ----> mapper/0 .. mapper/F-1     each counts the words of its file and
                                  |                        sends reducer k the words whose hash
                                  v                        modulo K is k
                              reducer/0 .. reducer/K-1     each adds up the counts it receives
    master/0 <--- counts() ---'

The master starts every mapper at once through futures, waits for all of them, collects the
reducers' counts (their words are disjoint), writes `word<TAB>count` lines, most frequent first,
prints a summary and stops the program. A word is a lowercased run of letters and digits, with
inner apostrophes kept ("keeper's"). Without file arguments it counts the texts in examples/data/.

    python -m launchpad.launch --type=local_mp examples/mapreduce.py --reducers=3 [FILE ...]
"""
from __future__ import annotations

import collections
import os
import re
import threading
import zlib
from typing import Dict, List, Sequence

from absl import app, flags

import launchpad as lp

_REDUCERS = flags.DEFINE_integer('reducers', 2, 'Number of reducers.')
_OUTPUT = flags.DEFINE_string('output', 'wordcount.tsv', 'Where to write the word counts.')

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')


def reducer_of(word: str, num_reducers: int) -> int:
    """The reducer of a word: a hash that is the same in every process (unlike `hash`)."""
    return zlib.crc32(word.encode()) % num_reducers


class Reducer:
    """Adds up the partial counts mappers send it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()

    def reduce(self, counts: Dict[str, int]) -> None:
        with self._lock:
            self._counts.update(counts)

    def counts(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)


class Mapper:
    """Counts the words of one file and shuffles the counts to the reducers."""

    def __init__(self, path: str, reducers: Sequence):
        self._path = path
        self._reducers = list(reducers)

    def map(self) -> int:
        with open(self._path, encoding='utf-8') as f:
            counts = collections.Counter(_WORD.findall(f.read().lower()))
        shards: List[Dict[str, int]] = [{} for _ in self._reducers]
        for word, count in counts.items():
            shards[reducer_of(word, len(self._reducers))][word] = count
        for reducer, shard in zip(self._reducers, shards):
            reducer.reduce(shard)
        return sum(counts.values())


def master(mappers: Sequence, reducers: Sequence, output: str) -> None:
    """Runs the map phase, gathers the reduced counts and writes them out."""
    words = sum(future.result() for future in [mapper.futures.map() for mapper in mappers])
    counts: Dict[str, int] = {}
    for reducer in reducers:
        counts.update(reducer.counts())
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    with open(output, 'w', encoding='utf-8') as f:
        f.writelines(f'{word}\t{count}\n' for word, count in ranked)
    top = ', '.join(f'{word} {count}' for word, count in ranked[:3])
    print(f'Counted {words} words ({len(counts)} distinct; top: {top}) in {len(mappers)} files '
          f'with {len(reducers)} reducers; wrote {output}', flush=True)
    lp.stop()


def make_program(paths: Sequence[str], num_reducers: int, output: str) -> lp.Program:
    program = lp.Program('mapreduce')
    with program.group('reducer'):
        reducers = [program.add_node(lp.CourierNode(Reducer)) for _ in range(num_reducers)]
    with program.group('mapper'):
        mappers = [program.add_node(lp.CourierNode(Mapper, path, reducers)) for path in paths]
    program.add_node(lp.PyNode(master, mappers, reducers, output), label='master')
    return program


def main(argv: Sequence[str]) -> None:
    paths = [os.path.abspath(path) for path in argv[1:]]
    if not paths:
        paths = sorted(os.path.join(_DEFAULT_DATA, name) for name in os.listdir(_DEFAULT_DATA)
                       if name.endswith('.txt'))
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        raise app.UsageError(f'Not a readable file: {", ".join(missing)}')
    if _REDUCERS.value < 1:
        raise app.UsageError('--reducers must be at least 1.')
    lp.launch(make_program(paths, _REDUCERS.value, os.path.abspath(_OUTPUT.value)))


if __name__ == '__main__':
    app.run(main)
