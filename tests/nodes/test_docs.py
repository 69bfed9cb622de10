"""Every program in docs/nodes.md runs and prints what it promises."""
import os
import re
import subprocess
import sys

import pytest

from launchpad.nodes.reverb import missing_reverb_message

from tests.core.conftest import REPO, script_env

DOC = os.path.join(REPO, 'docs', 'nodes.md')
EXPECTED = {  # program name -> text its output must contain
    'adder': '2 + 3 = 5',
    'cacher': 'source calls for 4 x 200 requests: ',
    'colocation': 'sees 2',
    'replay': 'sampled [',
    'batching': '[14 14 14]',
}


def doc_programs():
    with open(DOC) as f:
        blocks = re.findall(r'```python\n(.*?)```', f.read(), re.S)
    return {re.search(r"lp\.Program\('(\w+)'\)", block).group(1): block for block in blocks}


def test_every_program_is_checked():
    assert set(doc_programs()) == set(EXPECTED)


@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_doc_program_runs(name, tmp_path):
    source = doc_programs()[name]
    if 'import reverb' in source and missing_reverb_message():
        pytest.skip(missing_reverb_message())
    script = tmp_path / f'{name}.py'
    script.write_text(source)
    result = subprocess.run(
        [sys.executable, '-m', 'launchpad.launch', '--type=local_mt', str(script)],
        capture_output=True, text=True, timeout=120, env=script_env(), cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert EXPECTED[name] in result.stdout, result.stdout + result.stderr
