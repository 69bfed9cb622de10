"""lp.Pool.map beside multiprocessing.Pool.map and Ray's ActorPool, on the same tasks.

Two workloads, each a `map` over a list with W workers on this machine: tiny tasks (x + 1 on
ints, where the per-task overhead is everything) and 10 ms tasks (a sleep: what a pool's
parallelism buys). Ours is a standalone `lp.Pool(W, launch_type='local_mp')`; multiprocessing's
pool is forked before ours starts any thread. Ray runs in its own interpreter, named by
LAUNCHPAD_BENCH_RAY_PYTHON (see benchmarks/README.md), as W actors (`num_cpus=0`) behind
`ray.util.ActorPool`; `ActorPool.map` has no chunksize, so it is given the same chunks as the
other two (one actor call per chunk). Each figure is the median of --repeat timed maps after a
warm-up map; pools start before the clock.

    python benchmarks/pool_bench.py [--workers 4] [--repeat 3] [--quick]

Prints tasks/s per system and the ratios ours/multiprocessing and ours/Ray; a missing Ray is
reported as such, with the reason. Every process a run starts carries a marker and is ended.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import textwrap
import time
from typing import Callable, Dict, List, Optional

import peers

sys.path.insert(0, peers.WORKLOADS_DIR)
import bench_cleanup  # noqa: E402

sys.path.insert(0, peers.REPO_ROOT)

WORKLOADS = {  # name: (items full, items quick, seconds of sleep per task or None)
    'tiny': (20000, 2000, None),
    '10ms': (400, 40, 0.01),
}


def task(x):
    return x + 1


def sleepy(x):
    time.sleep(0.01)
    return x


def chunksize(items: int, workers: int) -> int:
    """multiprocessing's default chunk size for map."""
    size, extra = divmod(items, workers * 4)
    return max(1, size + bool(extra))


def _timed(run: Callable[[], list], expected: list, repeat: int) -> float:
    run()  # warm-up
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        got = run()
        rates.append(len(expected) / (time.perf_counter() - start))
        assert got == expected, 'a map returned wrong results'
    return statistics.median(rates)


def _measure(pool, sizes: Dict[str, int], repeat: int) -> Dict[str, float]:
    """tasks/s of `pool.map` for each workload."""
    results = {}
    for name, n in sizes.items():
        fn = sleepy if WORKLOADS[name][2] else task
        items = list(range(n))
        expected = [x if fn is sleepy else x + 1 for x in items]
        results[name] = _timed(lambda: pool.map(fn, items), expected, repeat)
    return results


def measure_multiprocessing(workers: int, sizes: Dict[str, int], repeat: int) -> Dict[str, float]:
    with multiprocessing.get_context('fork').Pool(workers) as pool:
        return _measure(pool, sizes, repeat)


def measure_ours(workers: int, sizes: Dict[str, int], repeat: int) -> Dict[str, float]:
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    with lp.Pool(workers, launch_type='local_mp') as pool:
        return _measure(pool, sizes, repeat)


_RAY_SCRIPT = textwrap.dedent('''
    import json, statistics, sys, time
    import ray
    from ray.util import ActorPool
    workers, repeat, sizes = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])

    @ray.remote(num_cpus=0)
    class Worker:
        def run(self, chunk, sleep):
            out = []
            for x in chunk:
                if sleep:
                    time.sleep(sleep)
                    out.append(x)
                else:
                    out.append(x + 1)
            return out

    ray.init(include_dashboard=False, logging_level='ERROR')
    pool = ActorPool([Worker.remote() for _ in range(workers)])
    results = {}
    for name, (n, size, sleep) in sizes.items():
        chunks = [list(range(i, min(n, i + size))) for i in range(0, n, size)]
        expected = [x if sleep else x + 1 for x in range(n)]
        def run():
            return [x for out in pool.map(lambda a, c: a.run.remote(c, sleep), chunks)
                    for x in out]
        run()
        rates = []
        for _ in range(repeat):
            start = time.perf_counter()
            assert run() == expected
            rates.append(n / (time.perf_counter() - start))
        results[name] = statistics.median(rates)
    ray.shutdown()
    print(json.dumps({'version': ray.__version__, 'results': results}))
''')


def measure_ray(workers: int, sizes: Dict[str, int], repeat: int) -> Dict[str, object]:
    found, skipped = peers.discover(['ray'])
    if not found:
        return {'missing': skipped['ray']}
    ray = found[0]
    marker = bench_cleanup.new_marker()
    env = dict(ray.env(), **{bench_cleanup.MARKER_ENV: marker})
    spec = {name: (n, chunksize(n, workers), WORKLOADS[name][2]) for name, n in sizes.items()}
    try:
        done = subprocess.run([ray.python, '-c', _RAY_SCRIPT, str(workers), str(repeat),
                               json.dumps(spec)], env=env, capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL, cwd=peers.BENCHMARKS_DIR)
    finally:
        bench_cleanup.kill_marked_processes(marker)
    if done.returncode != 0:
        return {'missing': f'the Ray run failed: {done.stderr.strip().splitlines()[-1:]}'}
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    return {'version': reply['version'], **reply['results']}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--quick', action='store_true', help='small maps: a smoke run')
    args = parser.parse_args(argv)
    sizes = {name: (quick if args.quick else full) for name, (full, quick, _) in
             WORKLOADS.items()}
    marker = bench_cleanup.new_marker()
    os.environ[bench_cleanup.MARKER_ENV] = marker
    try:
        mp = measure_multiprocessing(args.workers, sizes, args.repeat)
        ours = measure_ours(args.workers, sizes, args.repeat)
    finally:
        bench_cleanup.kill_marked_processes(marker, exit_wait_s=5.0)
    ray = measure_ray(args.workers, sizes, args.repeat)
    print(f'{args.workers} workers, map with multiprocessing\'s default chunk size, tasks/s '
          f'(median of {args.repeat}):')
    print(f'{"workload":10} {"items":>6} {"ours":>10} {"multiproc":>10} {"Ray":>10} '
          f'{"ours/mp":>8} {"ours/Ray":>9}')
    for name, n in sizes.items():
        theirs = ray.get(name)
        print(f'{name:10} {n:>6} {ours[name]:>10,.0f} {mp[name]:>10,.0f} '
              f'{(f"{theirs:,.0f}" if theirs else "missing"):>10} {ours[name] / mp[name]:>7.2f}x '
              f'{(f"{ours[name] / theirs:.2f}x" if theirs else "-"):>9}')
    if 'missing' in ray:
        print(f'Ray: missing ({ray["missing"]})')
    else:
        print(f'Ray {ray["version"]}: ActorPool.map over the same chunks, one call per chunk.')
    return 0


if __name__ == '__main__':
    sys.exit(main())
