"""The launcher's Ctrl-C / SIGTERM handlers last as long as the program, not longer."""
import textwrap

from tests.core.conftest import run_script

ENDED_PROGRAM = textwrap.dedent('''
    import signal, time
    import launchpad as lp

    def on_term(signum, frame):
        print('own SIGTERM handler ran', flush=True)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    program = lp.Program('short')
    program.add_node(lp.PyNode(print, 'node ran'), label='node')
    controller = lp.launch(program, launch_type='local_mt')
    assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT], 'launcher took none over'
    controller.wait()
    after = {sig: signal.getsignal(sig) for sig in before}
    print('restored' if after == before else f'still installed: {after}', flush=True)
    signal.raise_signal(signal.SIGTERM)
    try:
        signal.raise_signal(signal.SIGINT)
    except KeyboardInterrupt:
        print('Ctrl-C raised KeyboardInterrupt', flush=True)

    # A program that ended while the main thread did not look: the next signal goes to the
    # handler of before (and puts it back).
    controller = lp.launch(program, launch_type='local_mt')
    while not controller.done:
        time.sleep(0.01)
    signal.raise_signal(signal.SIGTERM)
    print('after the unobserved end:', signal.getsignal(signal.SIGTERM) is on_term, flush=True)
''')


def test_the_handlers_of_before_are_back_once_the_program_ended():
    result = run_script(ENDED_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert 'node ran' in result.stdout
    assert 'restored' in result.stdout.splitlines(), result.stdout
    assert 'Ctrl-C raised KeyboardInterrupt' in result.stdout
    assert result.stdout.count('own SIGTERM handler ran') == 2, result.stdout
    assert 'after the unobserved end: True' in result.stdout
    assert 'Stopping program' not in result.stderr
