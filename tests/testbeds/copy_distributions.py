"""Puts launchpad's runtime dependencies (with its kubernetes extra) into a directory for the
podman test image.

podman_image.sh runs this with the interpreter the tests use:

    python copy_distributions.py list PYPROJECT       # name==version lines (the image cache key)
    python copy_distributions.py copy PYPROJECT DIR   # fill DIR (the image's dist-packages)

The image's Python is Debian's python3.11. When this interpreter is also CPython 3.11 (e.g. a
pyenv 3.11 beside Debian's), the installed distributions are copied file by file: cp311 wheels
load in any 3.11 patch release, so no registry is needed. Any other version cannot share binary
extensions, so pip fetches cp311 wheels of the same versions instead, or of the newest version
that runs on 3.11 when the installed one does not (this needs the package index).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import platform
import shutil
import subprocess
import sys

try:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
except ImportError:  # an interpreter without pytest's dependencies still has pip's copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.utils import canonicalize_name
try:
    import tomllib
except ImportError:  # Python < 3.11: pip's copy of tomli, the same parser
    from pip._vendor import tomli as tomllib

IMAGE_PYTHON = (3, 11)
IMAGE_GLIBC = (2, 36)  # Debian 12: wheels built for this glibc or an older one load there
IMAGE_MARKER_ENV = {
    'python_version': '3.11',
    'python_full_version': '3.11.2',
    'implementation_name': 'cpython',
    'platform_python_implementation': 'CPython',
    'sys_platform': 'linux',
    'platform_system': 'Linux',
    'os_name': 'posix',
    'platform_machine': platform.machine(),
    'extra': '',
}


IMAGE_EXTRAS = ('kubernetes',)  # a coordinator pod uses the API to restart node pods


def dependencies(pyproject: pathlib.Path) -> list[str]:
    """Returns the runtime dependencies of the project (`[project] dependencies`) and those of
    the extras pods use (IMAGE_EXTRAS)."""
    with open(pyproject, 'rb') as f:
        project = tomllib.load(f)['project']
    return project['dependencies'] + [requirement for extra in IMAGE_EXTRAS
                                      for requirement in project['optional-dependencies'][extra]]


def _installed(name: str) -> importlib.metadata.Distribution | None:
    for candidate in (name, name.replace('-', '_'), canonicalize_name(name)):
        try:
            return importlib.metadata.distribution(candidate)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution | None]:
    """Maps every distribution the image needs (with dependencies) to its local install, if any."""
    found: dict[str, importlib.metadata.Distribution | None] = {}
    pending = [Requirement(r) for r in requirements]
    while pending:
        req = pending.pop()
        if req.marker is not None and not req.marker.evaluate(IMAGE_MARKER_ENV):
            continue
        key = canonicalize_name(req.name)
        if key in found:
            continue
        dist = found[key] = _installed(req.name)
        if dist is not None:
            pending.extend(Requirement(r) for r in dist.requires or [])
    return found


def copy_installed(dists: dict[str, importlib.metadata.Distribution | None],
                   target: pathlib.Path) -> None:
    for dist in dists.values():
        for file in dist.files or []:
            if file.parts[0] == '..':  # console scripts and data outside site-packages
                continue
            source = pathlib.Path(file.locate())
            if source.is_file():
                destination = target / file
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)


def _for_image(name: str, dist: importlib.metadata.Distribution | None) -> str:
    """`name==version` of the local install, unless that version does not run on the image's
    Python (numpy 2.5 needs 3.12): then the newest that does."""
    requires_python = dist.metadata.get('Requires-Python') if dist is not None else None
    if dist is None or (requires_python and IMAGE_MARKER_ENV['python_full_version']
                        not in SpecifierSet(requires_python)):
        return name
    return f'{name}=={dist.version}'


def pip_install(dists: dict[str, importlib.metadata.Distribution | None],
                target: pathlib.Path) -> None:
    pins = [_for_image(name, dist) for name, dist in dists.items()]
    # Older pips do not widen a manylinux tag to older glibcs: list every acceptable tag.
    platforms = [f'manylinux_{IMAGE_GLIBC[0]}_{minor}_{platform.machine()}'
                 for minor in range(IMAGE_GLIBC[1], 16, -1)] + [f'manylinux2014_{platform.machine()}']
    subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--quiet', '--target', str(target),
         '--only-binary=:all:', '--implementation', 'cp', '--abi', 'cp311',
         '--python-version', '.'.join(map(str, IMAGE_PYTHON)),
         *(arg for tag in platforms for arg in ('--platform', tag)), *pins],
        check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('command', choices=['list', 'copy'])
    parser.add_argument('pyproject', type=pathlib.Path)
    parser.add_argument('target', type=pathlib.Path, nargs='?')
    args = parser.parse_args()
    dists = closure(dependencies(args.pyproject))
    same_python = sys.implementation.name == 'cpython' and sys.version_info[:2] == IMAGE_PYTHON
    missing = sorted(name for name, dist in dists.items() if dist is None)
    if same_python and missing:
        raise SystemExit(f'not installed for {sys.executable}: {", ".join(missing)}; '
                         "install the project first (pip install -e .)")
    if args.command == 'list':
        for name, dist in sorted(dists.items()):
            print(f'{name}=={dist.version if dist else "?"}')
    elif args.target is None:
        parser.error('copy needs a target directory')
    elif same_python:
        copy_installed(dists, args.target)
    else:
        pip_install(dists, args.target)


if __name__ == '__main__':
    main()
