"""Checks the wheel and sdist that `python -m build` made: each holds what users and packagers need.

    python .ci/check_distributions.py dist/

The wheel: both packages with their data (the dashboard's static files, `py.typed`, the proto
and the generated courier_pb2 with its stub), the license, and nothing else at its top level.
The sdist: every file of the packages, protos, examples, docs, tests and benchmarks that the
source tree has (caches and results aside), with README, BUILD.md, LICENSE and pyproject.toml.
Prints what is missing and exits 1, or prints a one-line summary.
"""
from __future__ import annotations

import os
import pathlib
import sys
import tarfile
import zipfile
from typing import List, Set

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ('launchpad', 'courier')
SDIST_TREES = PACKAGES + ('protos', 'examples', 'docs', 'tests', 'benchmarks')
SDIST_FILES = ('README.md', 'BUILD.md', 'LICENSE', 'pyproject.toml', 'PKG-INFO')
WHEEL_DATA = ('launchpad/py.typed', 'courier/py.typed', 'courier/courier.proto',
              'courier/courier_pb2.py', 'courier/courier_pb2.pyi')
SKIPPED = {'__pycache__', 'results', '.pytest_cache', '.mypy_cache'}


def source_files(tree: str) -> List[str]:
    """Files under `tree` in the source tree, as relative paths."""
    found = []
    for folder, dirs, files in os.walk(REPO / tree):
        dirs[:] = [d for d in dirs if d not in SKIPPED]
        found += [str(pathlib.Path(folder, f).relative_to(REPO)) for f in files
                  if not f.endswith(('.pyc', '.pyo'))]
    return found


def check_wheel(path: pathlib.Path) -> List[str]:
    with zipfile.ZipFile(path) as wheel:
        names: Set[str] = set(wheel.namelist())
    dist_info = next(n.split('/')[0] for n in names if n.split('/')[0].endswith('.dist-info'))
    wanted = [f for package in PACKAGES for f in source_files(package)
              if f.endswith('.py') or '/static/' in f]
    wanted += [*WHEEL_DATA, f'{dist_info}/licenses/LICENSE']
    stray = {n.split('/')[0] for n in names} - {*PACKAGES, dist_info}
    return ([f'wheel lacks {f}' for f in wanted if f not in names]
            + [f'wheel has a stray top-level {s}' for s in sorted(stray)])


def check_sdist(path: pathlib.Path) -> List[str]:
    with tarfile.open(path) as sdist:
        members = sdist.getnames()
    root = members[0].split('/')[0]
    names = {m[len(root) + 1:] for m in members}
    wanted = [f for tree in SDIST_TREES for f in source_files(tree)] + list(SDIST_FILES)
    return [f'sdist lacks {f}' for f in wanted if f not in names]


def main() -> None:
    dist = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else 'dist')
    wheels, sdists = sorted(dist.glob('*.whl')), sorted(dist.glob('*.tar.gz'))
    if len(wheels) != 1 or len(sdists) != 1:
        sys.exit(f'{dist} should hold one wheel and one sdist, holds {wheels + sdists}')
    problems = check_wheel(wheels[0]) + check_sdist(sdists[0])
    if problems:
        sys.exit('\n'.join(problems))
    print(f'{wheels[0].name} and {sdists[0].name} hold what they should.')


if __name__ == '__main__':
    main()
