"""The public API (`lp.*`, `courier.*`) type-checks: mypy, strict, on code that uses it.

A user's mypy reads our annotations (the packages ship `py.typed`) and, as for every installed
package, reports no error inside our modules: what we promise is that code using the public API
type-checks, that every public name has the type its docs give it, and that a misuse is an
error. So mypy checks tests/typing/public_api.py (the README's and docs' programs, with
`assert_type` on what they get back) with `follow_imports = "silent"` (pyproject.toml): the same
view as a user's, from the source tree. `--strict` makes an unannotated public function an error
there (no-untyped-call). The bodies of our modules are not held to mypy: it finds Optional
attributes it cannot narrow in internals no user calls, and fixing those would change code, not
types. .ci/run checks the same file against the installed wheel, which also proves `py.typed`.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap
from typing import List

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
USAGE = REPO / 'tests' / 'typing' / 'public_api.py'
pytestmark = pytest.mark.timeout(600)  # a first run (no cache) analyses both packages


def mypy(*paths: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'mypy', '--strict', *map(str, paths)], cwd=REPO,
                          capture_output=True, text=True, check=False)


def test_code_using_the_public_api_type_checks():
    result = mypy(USAGE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_misusing_the_public_api_is_a_type_error(tmp_path):
    """The check has teeth: our types reach the user's code, they are not Any."""
    misuse = tmp_path / 'misuse.py'
    misuse.write_text(textwrap.dedent('''\
        import courier
        import launchpad as lp

        program = lp.Program('p')
        lp.launch(program).no_such_method()
        lp.launch([program]).scaling_log
        lp.SshHost(host=3)
        lp.RestartPolicy(max_restarts='3')
        courier.Server(port='x')
        '''))
    result = mypy(misuse)
    # By file name, not path: mypy's cache replays an unchanged module's errors under the path of
    # the run that cached them (an earlier run's tmp_path).
    errors: List[int] = sorted({int(line.split(':')[1]) for line in result.stdout.splitlines()
                                if line.split(':')[0].endswith('misuse.py') and ': error:' in line})
    assert errors == [5, 6, 7, 8, 9], result.stdout + result.stderr
