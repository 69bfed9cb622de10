"""The benchmark workloads: names, parameters and the metrics each one reports.

Every per-system workload script and the driver read this one table, so a workload means the
same thing for every system it runs against.
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple

MIB = 1 << 20


class Metric(NamedTuple):
    """How to print and compare one reported number."""
    unit: str
    better: str  # 'higher' or 'lower'


METRICS: Dict[str, Metric] = {
    'calls_per_s': Metric('calls/s', 'higher'),
    'p50_us': Metric('us', 'lower'),
    'p99_us': Metric('us', 'lower'),
    'mb_per_s': Metric('MB/s', 'higher'),
    'launch_s': Metric('s', 'lower'),
    'qps': Metric('queries/s', 'higher'),
    'rss_mib': Metric('MiB', 'lower'),
    'uss_mib': Metric('MiB', 'lower'),
}


class Workload(NamedTuple):
    """One named workload: a kind of measurement plus its full and quick parameters."""
    name: str
    kind: str
    summary: str
    full: Dict[str, Any]
    quick: Dict[str, Any]
    timeout_s: float = 180.0

    def params(self, quick: bool) -> Dict[str, Any]:
        return dict(self.quick if quick else self.full)


def _fanin(requesters: int, quick_requesters: int, cached: bool) -> Dict[str, Dict[str, Any]]:
    common = {'server_sleep_s': 0.001, 'cached': cached, 'cache_refresh_s': 0.1}
    return {
        'full': {**common, 'requesters': requesters, 'duration_s': 3.0},
        'quick': {**common, 'requesters': quick_requesters, 'duration_s': 0.3},
    }


_ALL = [
    Workload('sync_calls', 'sync_calls',
             'blocking calls with a small argument from one node to another',
             full={'duration_s': 3.0, 'warmup_s': 0.5},
             quick={'duration_s': 0.3, 'warmup_s': 0.05}),
    Workload('futures_calls', 'futures_calls',
             'calls through futures from one node to another, 64 in flight',
             full={'duration_s': 3.0, 'warmup_s': 0.5, 'in_flight': 64},
             quick={'duration_s': 0.3, 'warmup_s': 0.05, 'in_flight': 64}),
    Workload('numpy_echo_1mib', 'numpy_echo',
             'a 1 MiB uint8 array sent to a node and returned; MB/s of array bytes per round trip',
             full={'nbytes': MIB, 'duration_s': 3.0, 'min_rounds': 5},
             quick={'nbytes': 64 * 1024, 'duration_s': 0.3, 'min_rounds': 2}),
    Workload('numpy_echo_64mib', 'numpy_echo',
             'a 64 MiB uint8 array sent to a node and returned; MB/s of array bytes per round trip',
             full={'nbytes': 64 * MIB, 'duration_s': 4.0, 'min_rounds': 3},
             quick={'nbytes': MIB, 'duration_s': 0.3, 'min_rounds': 2}),
    Workload('launch_1', 'launch', 'wall time from launch until 1 courier node answers a ping',
             full={'nodes': 1}, quick={'nodes': 1}),
    Workload('launch_8', 'launch', 'wall time from launch until 8 courier nodes answer a ping',
             full={'nodes': 8}, quick={'nodes': 2}),
    Workload('launch_32', 'launch', 'wall time from launch until 32 courier nodes answer a ping',
             full={'nodes': 32}, quick={'nodes': 3}, timeout_s=300.0),
    Workload('fanin_1', 'fanin', '1 requester against a server that sleeps 1 ms per request',
             **_fanin(1, 1, cached=False)),
    Workload('fanin_4', 'fanin', '4 requesters against a server that sleeps 1 ms per request',
             **_fanin(4, 2, cached=False)),
    Workload('fanin_16', 'fanin', '16 requesters against a server that sleeps 1 ms per request',
             **_fanin(16, 3, cached=False)),
    Workload('fanin_16_cached', 'fanin',
             '16 requesters behind a memoizing cacher node in front of the 1 ms server',
             **_fanin(16, 3, cached=True)),
    Workload('idle_rss', 'idle_rss', 'memory of an idle courier node process after one ping',
             full={'settle_s': 2.0}, quick={'settle_s': 0.2}),
]

WORKLOADS: Dict[str, Workload] = {w.name: w for w in _ALL}


def get(name: str) -> Workload:
    """Returns the workload called `name`, or raises a ValueError listing the known names."""
    try:
        return WORKLOADS[name]
    except KeyError:
        known = ', '.join(WORKLOADS)
        raise ValueError(f'unknown workload {name!r}; known workloads: {known}') from None
