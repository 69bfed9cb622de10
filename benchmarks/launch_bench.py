"""Wall time from `lp.launch` until every one of N courier nodes answers a ping (N = 1, 8, 32),
under local_mp, for ours and, side by side, for the peers that are installed.

    python benchmarks/launch_bench.py [--repeat 3] [--systems ours,dmlp,ray]

A shortcut for `benchmarks/run.py --workloads launch_1,launch_8,launch_32`; other flags pass through.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run  # pylint: disable=wrong-import-position

if __name__ == '__main__':
    sys.exit(run.main(['--workloads', 'launch_1,launch_8,launch_32'] + sys.argv[1:]))
