"""What pyproject.toml promises, checked against the rest of the tree: every install instruction
(in code, messages, docs and scripts) names this distribution and one of its extras, and the test
extra installs what every feature's extra does. (.ci/run builds the wheel and sdist and checks
their contents.)"""
from __future__ import annotations

import os
import pathlib
import re
import sys
from typing import Dict, Iterator, List, Tuple

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = pathlib.Path(__file__).resolve().parent.parent
SKIP_DIRS = {'.git', '.venv', 'build', 'dist', '__pycache__', 'results'}
TEXT_SUFFIXES = {'.py', '.md', '.sh', '.toml', '.in', '.txt', '.cfg', '.yaml', '.html', '.js'}
# `pip install` followed by options, then one requirement: a name or a path, maybe with extras.
INSTALL = re.compile(r"""pip install\s+(?:-[-\w]+(?:[= ]\S+)?\s+)*['"]?(?P<target>[\w.\-/]+)"""
                     r"""(?:\[(?P<extras>[\w,\- ]+)\])?""")


def _project() -> dict:
    with open(REPO / 'pyproject.toml', 'rb') as f:
        return tomllib.load(f)['project']


def _text_files() -> Iterator[pathlib.Path]:
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith('.egg-info'))
        for name in sorted(files):
            path = pathlib.Path(folder, name)
            if path.suffix in TEXT_SUFFIXES or path.parent.name == '.ci':
                yield path


def install_instructions() -> List[Tuple[str, str, List[str]]]:
    """(where, requirement name or path, extras) of every `pip install` of this project."""
    found = []
    for path in _text_files():
        for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
            for match in INSTALL.finditer(line):
                target = match['target']
                if target == '.' or target.startswith(('./', '/')) or 'launchpad' in target:
                    extras = [e.strip() for e in (match['extras'] or '').split(',') if e.strip()]
                    found.append((f'{path.relative_to(REPO)}:{number}', target, extras))
    return found


def test_install_instructions_name_this_distribution_and_its_extras():
    project = _project()
    extras = set(project['optional-dependencies'])
    instructions = install_instructions()
    assert any(target == project['name'] for _, target, _ in instructions), instructions
    wrong = [(where, target, wanted) for where, target, wanted in instructions
             if target != 'dm-launchpad' and not target.startswith(('.', '/', '$'))
             and (target != project['name'] or not set(wanted) <= extras)]
    assert not wrong, (f"install instructions must name {project['name']!r} and one of its extras "
                       f'{sorted(extras)}: {wrong}')


def test_no_message_names_the_index_project_called_launchpad():
    """`launchpad` on the package index is somebody else's project: an instruction to install it
    with an extra, in a message or a doc, would install that project."""
    bare = re.compile(r"(?<![\w.\-/])launchpad\[")
    hits = [f'{path.relative_to(REPO)}:{number}' for path in _text_files()
            for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1)
            if bare.search(line)]
    assert not hits, hits


def _names(requirements: List[str]) -> Dict[str, str]:
    return {re.split(r'[\s\[<>=!~;]', r, maxsplit=1)[0].lower().replace('_', '-'): r
            for r in requirements}


def test_the_test_extra_installs_every_feature_extra_but_reverb():
    """README's test command installs `.[test]` only: it must bring what each feature's tests
    need. Reverb's tests have an environment of their own (tests/reverb/run.sh)."""
    extras = _project()['optional-dependencies']
    test = _names(extras['test'])
    missing = {extra: sorted(set(_names(requirements)) - set(test))
               for extra, requirements in extras.items() if extra not in ('test', 'reverb')}
    assert not any(missing.values()), missing
