"""What a receiver pays to map shared memory again after dropping its page tables of it.

A memfd of N MiB is written through one mapping (with or without ``MADV_HUGEPAGE``, as
courier's senders advise their segments) and read, one value per 4 KiB, through a second,
read-only one, as a receiver maps a segment. Reported: the time and page faults to read it
through the kept mapping, of ``MADV_DONTNEED`` on it, and of reading it again after that
(what an actor pays per update when it lets go of a segment's page tables), and whether its
pages were mapped huge (``ShmemPmdMapped`` in /proc/self/smaps). It measures under the
kernel's setting as it is (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``: under
``never``, its default, shared memory gets no huge pages); it changes no setting.

Usage: python benchmarks/refault_bench.py [--mib 64] [--repeat 7]
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import statistics
import time
from typing import Dict, Tuple

import numpy as np

_SETTING = '/sys/kernel/mm/transparent_hugepage/shmem_enabled'


def _read(view: np.ndarray) -> Tuple[float, int]:
    """Milliseconds and page faults to read one float32 of every 4 KiB of ``view``."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    float(view[::1024].sum())
    return ((time.perf_counter() - start) * 1e3,
            resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)


def _mapped(address: int) -> Dict[str, str]:
    """Rss and ShmemPmdMapped of this process's mapping starting at ``address``."""
    fields: Dict[str, str] = {}
    inside = False
    with open('/proc/self/smaps') as smaps:
        for line in smaps:
            if not line[:1].isupper():
                if inside:
                    break
                inside = line.startswith(f'{address:08x}-')
            elif inside and line.startswith(('Rss:', 'ShmemPmdMapped:')):
                name, value = line.split(':', 1)
                fields[name] = value.strip()
    return fields


def measure(mib: int, advise: bool, repeat: int) -> None:
    size = mib << 20
    fd = os.memfd_create('refault', os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        writer = mmap.mmap(fd, size)
        if advise:
            writer.madvise(mmap.MADV_HUGEPAGE)
        np.frombuffer(writer, np.float32)[:] = 1.0
        reader = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        view = np.frombuffer(reader, np.float32)
        _read(view)
        pages = _mapped(view.__array_interface__['data'][0])
        kept, dropped, again = [], [], []
        for _ in range(repeat):
            kept.append(_read(view))
            start = time.perf_counter()
            reader.madvise(mmap.MADV_DONTNEED)
            dropped.append((time.perf_counter() - start) * 1e3)
            again.append(_read(view))
        print(f'{mib} MiB, writer {"MADV_HUGEPAGE" if advise else "not advised":13}  mapped '
              f'{pages}  kept: {statistics.median(t for t, _ in kept):.3f} ms  MADV_DONTNEED: '
              f'{statistics.median(dropped):.3f} ms  again: '
              f'{statistics.median(t for t, _ in again):.3f} ms, {again[-1][1]} faults',
              flush=True)
        del view
        reader.close()
        writer.close()
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--mib', type=int, default=64)
    parser.add_argument('--repeat', type=int, default=7)
    args = parser.parse_args()
    try:
        with open(_SETTING) as setting:
            print(f'shmem_enabled: {setting.read().strip()}')
    except OSError:
        print('shmem_enabled: (no transparent huge pages in this kernel)')
    for advise in (False, True):
        measure(args.mib, advise, args.repeat)


if __name__ == '__main__':
    main()
