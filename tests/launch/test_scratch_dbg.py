import json, os, subprocess, sys, glob, time, pathlib, tempfile
import pytest
from tests.launch.test_ssh import REPO, host_options
from tests.launch.test_ssh_detach import LAUNCH
def test_dbg(ssh_testbed):
    remote = pathlib.Path(tempfile.mkdtemp(prefix='lpd-'))
    env = {'LAUNCHPAD_RUNTIME_DIR': str(remote / 'runtime'), 'LAUNCHPAD_RUNS_DIR':
           str(remote / 'runs'), 'LAUNCHPAD_LOGGING_DIR': str(remote / 'logs')}
    options = {}
    for h in ssh_testbed:
        options[h.name] = host_options(h); options[h.name]['env'].update(env)
    p = subprocess.run([sys.executable, '-c', LAUNCH, str(remote/'counter.json'), json.dumps(options)], capture_output=True, text=True, cwd=REPO, timeout=100)
    print(p.stdout, p.stderr[-3000:])
    for f in glob.glob(str(remote / 'logs/*/*')):
        print('==', f); print(open(f).read()[-3000:])
