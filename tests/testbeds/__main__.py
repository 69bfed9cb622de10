"""Measures how long each test bed takes to come up and go down: python -m tests.testbeds.

Run as root from the repository root. --cold-image removes the podman image first, so the first
podman round includes a full image build.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Callable, ContextManager

from tests import testbeds


def measure(name: str, bed: Callable[[], ContextManager], repeat: int) -> None:
    ups, downs = [], []
    for _ in range(repeat):
        start = time.monotonic()
        context = bed()
        context.__enter__()
        ups.append(time.monotonic() - start)
        start = time.monotonic()
        context.__exit__(None, None, None)
        downs.append(time.monotonic() - start)
    print(f'{name:<14} up {statistics.median(ups):6.2f} s (first {ups[0]:.2f} s)   '
          f'down {statistics.median(downs):5.2f} s   median of {repeat}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--repeat', type=int, default=3)
    parser.add_argument('--cold-image', action='store_true',
                        help='remove the podman image first to time a full build')
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:  # wait for other sessions here, not inside the timings
        for bed in ('ssh', 'slurm', 'podman'):
            stack.enter_context(testbeds.holding(bed))
        if args.cold_image:
            testbeds._Script('podman', 'podman_image.sh').run('purge')
        measure_all(args.repeat)


def measure_all(repeat: int) -> None:
    measure('ssh (3 hosts)', lambda: testbeds.ssh_hosts(3), repeat)
    measure('slurm single', lambda: testbeds.slurm_cluster('single'), repeat)
    measure('slurm multi 3', lambda: testbeds.slurm_cluster('multi', 3), repeat)
    measure('podman', testbeds.podman_network, repeat)


if __name__ == '__main__':
    main()
