"""A node's process tree (`launchpad.process.tree`): the quick look for children that lets a
worker with none skip the search of every process on the host when it ends."""
import subprocess
import sys

_SCRIPT = '''
import signal, subprocess, time
from launchpad.process import tree
seen = [tree.has_children()]
child = subprocess.Popen(['sleep', '30'])
seen.append(tree.has_children())
child.send_signal(signal.SIGKILL)
while open(f'/proc/{child.pid}/stat').read().split(')')[1].split()[0] != 'Z':
    time.sleep(0.01)
seen.append(tree.has_children())  # a zombie: a child still, and still the Popen's to reap
seen.append(child.wait())
seen.append(tree.has_children())
print(seen)
'''


def test_has_children_sees_running_and_unreaped_children_and_reaps_none():
    result = subprocess.run([sys.executable, '-c', _SCRIPT], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.split('\n')[0] == str([False, True, True, -9, False]), result.stderr
