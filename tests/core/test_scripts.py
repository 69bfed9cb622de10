"""Launches from scripts, as researchers run them: exit codes, Ctrl-C, SIGTERM, SIGKILL, the CLI."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

import launchpad as lp

from tests import testbeds
from tests.core.conftest import REPO, run_script, script_env, wait_until
from tests.leftovers import temp_dirs

PROGRAM = textwrap.dedent('''
    import os, sys, time
    import launchpad as lp

    REPORT_DIR = sys.argv[1]
    MODE = sys.argv[2]

    def report(name, text=''):
        with open(os.path.join(REPORT_DIR, name), 'w') as f:
            f.write(text)

    class Server:
        def __init__(self):
            lp.register_stop_handler(lambda: report('stop_handler_ran'))
            report(f'pid_server_{os.getpid()}')

        def double(self, x):
            return 2 * x

    def client(server):
        report(f'pid_client_{os.getpid()}')
        print('double of 21 is', server.double(21), flush=True)
        if MODE == 'fail':
            raise ValueError('client gave up')
        if MODE == 'finish':
            lp.stop()
            return
        report('ready')
        while True:  # runs until stopped (or ignores the stop, for MODE == 'stubborn')
            if MODE != 'stubborn' and lp.wait_for_stop(0.1):
                return
            time.sleep(0.1)

    program = lp.Program('script')
    server = program.add_node(lp.CourierNode(Server), label='server')
    program.add_node(lp.PyNode(client, server), label='client')
    lp.launch(program, launch_type=os.environ.get('LAUNCH_TYPE'),
              notice_period=float(os.environ.get('NOTICE', '10')))
''')


def node_pids(report_dir):
    return [int(name.rsplit('_', 1)[1]) for name in os.listdir(report_dir)
            if name.startswith('pid_')]


def assert_gone(pids):
    assert wait_until(lambda: not any(psutil.pid_exists(p) and
                                      psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                      for p in pids), timeout=30), f'still alive: {pids}'


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_launch_as_the_last_line_runs_the_program_to_the_end(launch_type, tmp_path):
    result = run_script(PROGRAM, str(tmp_path), 'finish', env={'LAUNCH_TYPE': launch_type})
    assert result.returncode == 0, result.stderr
    assert 'double of 21 is 42' in result.stdout
    if launch_type == 'local_mp':
        assert '[client/0] double of 21 is 42' in result.stdout
    assert (tmp_path / 'stop_handler_ran').exists()


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_a_failing_node_makes_the_script_exit_non_zero(launch_type, tmp_path):
    result = run_script(PROGRAM, str(tmp_path), 'fail', env={'LAUNCH_TYPE': launch_type})
    assert result.returncode == 1
    assert 'Node client/0 failed: ValueError: client gave up' in result.stderr
    # The node's traceback names the script and shows the failing line, as `python` would.
    assert f'File "{result.args[1]}", line 24, in client\n' in result.stderr, result.stderr
    assert "raise ValueError('client gave up')" in result.stderr
    assert_gone(node_pids(tmp_path))


POOL_PROGRAM = textwrap.dedent('''
    import sys
    import launchpad as lp

    def fails_on_two(x):
        if x == 2:
            raise ValueError(f'two is bad ({x})')
        return x

    if __name__ == '__main__':
        with lp.Pool(2, launch_type=sys.argv[1]) as pool:
            print(pool.map(fails_on_two, range(4)))
''')


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_a_failing_pool_task_of_a_script_shows_its_file_and_line(launch_type):
    result = run_script(POOL_PROGRAM, launch_type)
    assert result.returncode == 1
    assert f'File "{result.args[1]}", line 7, in fails_on_two\n' in result.stderr, result.stderr
    assert "raise ValueError(f'two is bad ({x})')" in result.stderr


def start_script(tmp_path, mode, launch_type='local_mp', notice='10'):
    path = tmp_path / 'program.py'
    path.write_text(PROGRAM)
    reports = tmp_path / 'reports'
    reports.mkdir()
    process = subprocess.Popen([sys.executable, str(path), str(reports), mode],
                               env=script_env({'LAUNCH_TYPE': launch_type, 'NOTICE': notice}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait_until(lambda: (reports / 'ready').exists(), timeout=30):
        process.kill()
        raise AssertionError(process.communicate())
    return process, reports


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_gracefully(tmp_path, launch_type, signum):
    process, reports = start_script(tmp_path, 'run', launch_type)
    pids = node_pids(reports)
    process.send_signal(signum)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert 'Stopping program' in err
    assert (reports / 'stop_handler_ran').exists()
    assert_gone(pids)


SLOW_LAUNCH_PROGRAM = textwrap.dedent('''
    import os, sys, time
    import launchpad as lp

    REPORT_DIR = sys.argv[1]

    class SlowLauncher(lp.Launcher):
        """Takes its time to start, like a Slurm job waiting for its allocation."""
        foreground = True

        def launch(self, program, options):
            try:  # (the test signals once 'launching' exists: it must be inside the try)
                open(os.path.join(REPORT_DIR, 'launching'), 'w').close()
                time.sleep(60)
            except BaseException as e:
                with open(os.path.join(REPORT_DIR, 'undone'), 'w') as f:
                    f.write(type(e).__name__)
                raise
            raise AssertionError('the launch was not interrupted')

    lp.register_launcher('slow', SlowLauncher)
    program = lp.Program('slow')
    program.add_node(lp.PyNode(print, 'never runs'), label='node')
    lp.launch(program, launch_type='slow')
''')


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_launch_aborts_it_and_the_launcher_undoes_it(tmp_path, signum):
    with tempfile.NamedTemporaryFile('w', suffix='.py', dir=tmp_path, delete=False) as f:
        f.write(SLOW_LAUNCH_PROGRAM)
    process = subprocess.Popen([sys.executable, f.name, str(tmp_path)], env=script_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: (tmp_path / 'launching').exists(), timeout=30)
        process.send_signal(signum)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode != 0
    assert (tmp_path / 'undone').read_text() == 'KeyboardInterrupt'
    assert (f"Launch of program 'slow' interrupted by {signal.Signals(signum).name}; what it "
            f"had started was ended.") in err
    assert 'Traceback' not in err


INTERRUPTED_PROGRAM = PROGRAM.replace('lp.launch(program,', textwrap.dedent('''
    class SlowToSend:
        """Takes 0.3 s to pickle, so the launch (which sends it to its node) takes longer."""
        def __reduce__(self):
            time.sleep(0.3)
            return SlowToSend, ()

    program.add_node(lp.PyNode(print, SlowToSend()), label='slow')
    report('launching')
    lp.launch(program, serialize_py_nodes=True,''').strip())


def processes_marked(marker):
    """Our processes whose environment carries `marker` (node processes and fork servers
    inherit the launching script's environment)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get('LP_TEST_MARKER') == marker:
                found.append(process)
        except psutil.Error:
            pass
    return found


@pytest.mark.parametrize('launch_type', ['local_mt', 'local_mp'])
def test_ctrl_c_during_the_launch_stops_as_cleanly_as_after_it(tmp_path, launch_type):
    path = tmp_path / 'program.py'
    path.write_text(INTERRUPTED_PROGRAM)
    registry_dir = tmp_path / 'registry'
    registry_dir.mkdir(mode=0o700)
    outcomes = []
    for delay in (0.05, 0.1, 0.2, 0.3, 0.5, 0.8):  # from just after the script's last line
        reports = tmp_path / f'reports-{delay}'
        reports.mkdir()
        marker = f'{os.getpid()}-{launch_type}-{delay}'
        process = subprocess.Popen(  # Ctrl-C as a terminal sends it, even if we ignore it
            [sys.executable, str(path), str(reports), 'run'], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(
                signal.SIGINT, signal.SIG_DFL),
            env=script_env({'LAUNCH_TYPE': launch_type, 'LP_TEST_MARKER': marker,
                            'LAUNCHPAD_RUNTIME_DIR': str(registry_dir)}))
        try:
            assert wait_until(lambda: (reports / 'launching').exists(), timeout=30,
                              interval=0.002)
            time.sleep(delay)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert 'Traceback' not in err + out, (delay, err)
        if 'Stopping program' in err:  # the program had started: the usual stop
            assert process.returncode == 0, (delay, err)
            outcomes.append('stopped')
        else:
            assert f"Launch of program 'script' interrupted by SIGINT" in err, (delay, err)
            assert process.returncode == -signal.SIGINT, (delay, err)
            outcomes.append('interrupted')
        assert wait_until(lambda: not processes_marked(marker), timeout=10), (
            delay, [p.cmdline() for p in processes_marked(marker)])
        assert not os.listdir(registry_dir), delay
    # The first signals came while the slow argument was being sent: in the launch.
    assert outcomes[:2] == ['interrupted', 'interrupted'], outcomes
    # (The no_leftovers fixture checks that nothing was left in TMPDIR.)


def test_second_ctrl_c_kills_at_once(tmp_path):
    process, reports = start_script(tmp_path, 'stubborn', notice='60')
    pids = node_pids(reports)
    process.send_signal(signal.SIGINT)
    assert wait_until(lambda: (reports / 'stop_handler_ran').exists(), timeout=30)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=15)  # far less than the 60 s notice period
    assert_gone(pids)


def test_nodes_exit_when_the_launcher_is_sigkilled(tmp_path):
    process, reports = start_script(tmp_path, 'run', notice='2')
    pids = node_pids(reports)
    assert len(pids) == 2
    program_dirs = [child for child in psutil.Process(process.pid).children()]
    assert program_dirs
    process.kill()
    process.communicate()
    assert_gone(pids)


COLOCATED = textwrap.dedent('''
    import os, sys
    import launchpad as lp

    def idle(ready):
        open(ready, 'w').close()
        lp.wait_for_stop()

    program = lp.Program('colocated')
    program.add_node(lp.ColocationNode([lp.PyNode(idle, sys.argv[1])], mode='processes'),
                     label='colo')
    lp.launch(program, launch_type='local_mt')
''')


def test_a_sigkilled_local_mt_launchers_directories_go_at_the_next_launch(tmp_path):
    """A local_mt launcher that was SIGKILLed cannot remove its directory (its nodes were its
    threads): the next launch does. The inner node of its process colocation ends (its parent
    is gone) and removes the colocation's directory. (local_mp: test_nodes_exit_when_...)"""
    ready = tmp_path / 'ready'
    before = temp_dirs()
    with tempfile.NamedTemporaryFile('w', suffix='.py', dir=tmp_path, delete=False) as f:
        f.write(COLOCATED)
    launcher = subprocess.Popen([sys.executable, f.name, str(ready)],
                                env=script_env(), stdout=subprocess.DEVNULL)
    try:
        assert wait_until(ready.exists, timeout=30)
        inner = psutil.Process(launcher.pid).children()
    finally:
        launcher.kill()
        launcher.wait()
    assert inner
    psutil.wait_procs(inner, timeout=30)
    assert not any(node.is_running() and node.status() != psutil.STATUS_ZOMBIE
                   for node in inner)
    assert not any('colocation' in path for path in temp_dirs() - before)
    next_program = lp.Program('next')
    next_program.add_node(lp.PyNode(print, 'next'), label='next')
    lp.launch(next_program, launch_type='test_mt').wait(timeout=30)
    assert not temp_dirs() - before


def test_cli_runs_a_script_with_the_chosen_launch_type(tmp_path):
    script = tmp_path / 'program.py'
    script.write_text(PROGRAM)
    result = subprocess.run(
        [sys.executable, '-m', 'launchpad.launch', '--type=local_mt', str(script), str(tmp_path),
         'finish'], capture_output=True, text=True, timeout=60, env=script_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert 'double of 21 is 42' in result.stdout
    assert '[client/0]' not in result.stdout  # threads: no process prefixes

    failing = subprocess.run(  # the script named relative to the working directory
        [sys.executable, '-m', 'launchpad.launch', '--type=local_mp', 'program.py', str(tmp_path),
         'fail'], capture_output=True, text=True, timeout=60, env=script_env(), cwd=tmp_path)
    assert failing.returncode == 1
    assert 'Node client/0 failed' in failing.stderr
    assert f'File "{script}", line 24, in client\n' in failing.stderr, failing.stderr
    assert "raise ValueError('client gave up')" in failing.stderr


def test_cli_explains_itself_and_rejects_unknown_types():
    help_text = subprocess.run([sys.executable, '-m', 'launchpad.launch', '--help'],
                               capture_output=True, text=True, env=script_env(), timeout=30)
    assert help_text.returncode == 0
    assert 'launch type' in help_text.stdout and 'local_mp' in help_text.stdout
    unknown = subprocess.run([sys.executable, '-m', 'launchpad.launch', '--type=mars', 'x.py'],
                             capture_output=True, text=True, env=script_env(), timeout=30)
    assert unknown.returncode == 2
    assert "unknown launch type 'mars'" in unknown.stderr and 'local_mt' in unknown.stderr


FLAGS_PROGRAM = textwrap.dedent('''
    from absl import app, flags
    import launchpad as lp

    flags.DEFINE_integer('answer', 0, 'a number the nodes read')
    FLAGS = flags.FLAGS

    def check(expected):
        assert FLAGS.answer == expected, (FLAGS.answer, expected)
        print('node sees answer', FLAGS.answer, flush=True)

    def main(argv):
        program = lp.Program('flags')
        program.add_node(lp.PyNode(check, 42), label='plain')
        program.add_node(lp.PyNode(check, 7), label='overridden')
        lp.launch(program, launch_type='local_mp',
                  local_resources={'overridden': lp.PythonProcess(args={'answer': 7})})

    if __name__ == '__main__':
        app.run(main)
''')


def test_absl_flags_of_the_script_reach_node_processes():
    result = run_script(FLAGS_PROGRAM, '--answer=42')
    assert result.returncode == 0, result.stdout + result.stderr
    assert '[plain/0] node sees answer 42' in result.stdout
    assert '[overridden/0] node sees answer 7' in result.stdout


FLAG_MODULE = textwrap.dedent('''
    from absl import flags
    flags.DEFINE_integer('steps', 1, 'how many steps the nodes take')
''')

LATE_IMPORT_PROGRAM = textwrap.dedent('''
    import sys
    from absl import app
    import launchpad as lp
    import stepflags  # defines --steps

    def check():
        import importlib
        # Node code that imports a flag-defining module only when it runs: the module's
        # DEFINE meets the flag shipped from the launcher, and the launcher's value stays.
        module = importlib.import_module('stepflags')
        print('node sees steps', module.flags.FLAGS.steps, flush=True)

    def main(argv):
        program = lp.Program('late_flags')
        program.add_node(lp.PyNode(check), label='node')
        lp.launch(program, launch_type='local_mp')

    if __name__ == '__main__':
        app.run(main)
''')


def test_a_node_may_import_a_flag_defining_module_while_it_runs(tmp_path):
    (tmp_path / 'stepflags.py').write_text(FLAG_MODULE)
    result = run_script(LATE_IMPORT_PROGRAM, '--steps=5', env={
        'PYTHONPATH': os.pathsep.join([str(tmp_path), REPO])})
    assert result.returncode == 0, result.stdout + result.stderr
    assert '[node/0] node sees steps 5' in result.stdout


FILES_PROGRAM = textwrap.dedent('''
    import launchpad as lp

    def hello(name):
        print('hello from', name, flush=True)

    program = lp.Program('files')
    with program.group('greeter'):
        program.add_node(lp.PyNode(hello, 'first'))
        program.add_node(lp.PyNode(hello, 'second'))
    lp.launch(program, launch_type='local_mp', terminal='output_to_files')
''')


def test_output_to_files_writes_one_log_per_node(tmp_path):
    """$LAUNCHPAD_LOGGING_DIR puts the logs of a run elsewhere, which its run directory's
    logs/ links to (the default, logs/ itself, is tested in tests/observe/test_runs.py)."""
    runs = tmp_path / 'runs'
    result = run_script(FILES_PROGRAM, env={'LAUNCHPAD_LOGGING_DIR': str(tmp_path / 'logs'),
                                            'LAUNCHPAD_RUNS_DIR': str(runs)})
    assert result.returncode == 0, result.stderr
    (log_dir,) = list((tmp_path / 'logs').iterdir())
    assert str(log_dir) in result.stdout
    assert sorted(p.name for p in log_dir.iterdir()) == ['greeter_0.log', 'greeter_1.log']
    assert 'hello from second' in (log_dir / 'greeter_1.log').read_text()
    assert 'hello from' not in result.stdout
    assert (runs / log_dir.name / 'logs').resolve() == log_dir  # named by the program's id
    assert (runs / log_dir.name / 'run.sqlite').is_file()


TMUX_PROGRAM = textwrap.dedent('''
    import os, sys
    import launchpad as lp

    def hello(report_dir):
        with open(os.path.join(report_dir, lp.get_context().node_name.replace('/', '_')), 'w') as f:
            f.write(os.environ.get('TMUX', ''))

    program = lp.Program('tmuxed')
    with program.group('greeter'):
        program.add_node(lp.PyNode(hello, sys.argv[1]))
        program.add_node(lp.PyNode(hello, sys.argv[1]))
    lp.launch(program, launch_type='local_mp', terminal='tmux_session')
''')


def test_tmux_session_runs_each_node_in_a_window(tmp_path):
    if shutil.which('tmux') is None:
        testbeds.require_testbed('tmux is not installed (apt-get install tmux)')
    socket_dir = tmp_path / 'tmux'
    socket_dir.mkdir()
    result = run_script(TMUX_PROGRAM, str(tmp_path), env={'TMUX_TMPDIR': str(socket_dir)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'tmux attach -t lp-tmuxed-' in result.stdout
    assert sorted(p.name for p in tmp_path.glob('greeter_*')) == ['greeter_0', 'greeter_1']
    assert all(p.read_text() for p in tmp_path.glob('greeter_*'))  # they ran inside tmux
    sessions = subprocess.run(['tmux', 'list-sessions'], capture_output=True, text=True,
                              env={**os.environ, 'TMUX_TMPDIR': str(socket_dir)})
    assert 'lp-tmuxed' not in sessions.stdout  # the session ends with the program


NO_APP_RUN_PROGRAM = textwrap.dedent('''
    import os
    import launchpad as lp

    def where():
        print('launch type', lp.get_context().launch_type, 'in launcher:',
              os.getpid() == int(os.environ['LAUNCHER_PID']), flush=True)

    os.environ['LAUNCHER_PID'] = str(os.getpid())
    program = lp.Program('no_app_run')
    program.add_node(lp.PyNode(where), label='node')
    lp.launch(program)
''')


@pytest.mark.parametrize('flag', [['--lp_launch_type=local_mp'], ['--lp_launch_type', 'local_mp']])
def test_the_launch_type_flag_counts_without_absl_app_run(flag):
    result = run_script(NO_APP_RUN_PROGRAM, *flag)
    assert result.returncode == 0, result.stderr
    assert '[node/0] launch type local_mp in launcher: False' in result.stdout


def test_without_the_flag_a_script_runs_local_mt():
    result = run_script(NO_APP_RUN_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert 'launch type local_mt in launcher: True' in result.stdout


def test_the_cli_honours_the_scripts_flag_and_refuses_a_conflicting_type(tmp_path):
    script = tmp_path / 'program.py'
    script.write_text(NO_APP_RUN_PROGRAM)
    flagged = subprocess.run(
        [sys.executable, '-m', 'launchpad.launch', str(script), '--lp_launch_type=local_mt'],
        capture_output=True, text=True, timeout=60, env=script_env())
    assert flagged.returncode == 0, flagged.stderr
    assert 'launch type local_mt in launcher: True' in flagged.stdout
    conflict = subprocess.run(
        [sys.executable, '-m', 'launchpad.launch', '--type=local_mp', str(script),
         '--lp_launch_type=local_mt'], capture_output=True, text=True, timeout=60,
        env=script_env())
    assert conflict.returncode == 2
    assert '--type=local_mp' in conflict.stderr and '--lp_launch_type=local_mt' in conflict.stderr


@pytest.mark.parametrize('source', [
    'import launchpad as lp\n\ndef broken(:\n    pass\n',
    'import launchpad as lp\n\ndef fails():\n    raise RuntimeError("boom")\n\nfails()\n',
], ids=['syntax_error', 'exception'])
def test_the_cli_shows_an_error_of_the_script_as_python_does(tmp_path, source):
    script = tmp_path / 'broken.py'
    script.write_text(source)
    ours = subprocess.run([sys.executable, '-m', 'launchpad.launch', 'broken.py'],
                          capture_output=True, text=True, timeout=60, env=script_env(),
                          cwd=tmp_path)
    python = subprocess.run([sys.executable, 'broken.py'], capture_output=True, text=True,
                            timeout=60, env=script_env(), cwd=tmp_path)
    assert python.returncode == 1 and python.stderr
    assert (ours.returncode, ours.stderr) == (python.returncode, python.stderr)
