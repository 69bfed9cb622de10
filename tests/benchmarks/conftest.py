"""Makes the benchmark driver's modules importable: they are scripts, not a package."""
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPO, 'benchmarks')
WORKLOADS = os.path.join(BENCHMARKS, 'workloads')

for path in (WORKLOADS, BENCHMARKS):
    if path not in sys.path:
        sys.path.insert(0, path)


def load_driver():
    """benchmarks/run.py as a module (its file name is too generic to import by name)."""
    spec = importlib.util.spec_from_file_location('benchmarks_run', os.path.join(BENCHMARKS, 'run.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
