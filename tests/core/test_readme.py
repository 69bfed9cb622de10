"""The README's example program runs as shown."""
import os
import re

from tests.core.conftest import REPO, run_script


def readme_example() -> str:
    with open(os.path.join(REPO, 'README.md')) as f:
        return re.search(r'```python\n(.*?)```', f.read(), re.S).group(1)


def test_readme_example_runs_to_the_end():
    source = readme_example()
    assert "lp.launch(program, launch_type='local_mp')" in source
    for launch_type in ('local_mp', 'local_mt'):
        result = run_script(source.replace("'local_mp'", repr(launch_type)))
        assert result.returncode == 0, result.stdout + result.stderr


def test_readme_names_only_what_lp_exports():
    import launchpad as lp  # pylint: disable=import-outside-toplevel
    with open(os.path.join(REPO, 'README.md')) as f:
        names = set(re.findall(r'\blp\.([A-Za-z_]+)', f.read()))
    assert names and not {name for name in names if not hasattr(lp, name)}
