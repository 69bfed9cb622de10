"""Retried calls: a caller may have its calls re-sent to the restarted instance of a node that went
away while it had them (`handle.with_retries`, `lp.idempotent`); by default they fail fast."""
import json
import os

import courier
import pytest

import launchpad as lp


class Flaky:
    """Each instance crashes (its process exits) inside the call it is told to; the others it
    answers with the attempt that served them. Every call it gets is logged in `log`."""

    def __init__(self, log: str):
        self.attempt = lp.get_context().attempt
        self._log = log

    def _crash_in(self, attempt: int, what: str = '') -> None:
        with open(self._log, 'a') as f:
            f.write(f'{what} {self.attempt}\n')
        if self.attempt == attempt:
            os._exit(7)  # pylint: disable=protected-access  (mid-call, as a machine would)

    def echo(self, value, crash_in: int = -1):
        self._crash_in(crash_in, f'echo {value}')
        return [value, self.attempt]

    @lp.idempotent
    def read(self, value, crash_in: int = -1):
        self._crash_in(crash_in, f'read {value}')
        return [value, self.attempt]

    def always_crash(self):
        self._crash_in(self.attempt, 'always_crash')


def call(plain, retried, bounded, record: str) -> None:
    """Each instance of the server crashes in one call; records what each call got."""
    results = {}

    def attempt(key, fn):
        try:
            results[key] = fn()
        except courier.ServerUnavailableError as e:
            results[key] = [type(e).__name__, str(e)]

    plain.echo('first')  # a connection's first call may go again if it never reached the node
    attempt('plain', lambda: plain.echo('p', crash_in=0))  # fails: default is fail-fast
    attempt('retried', lambda: retried.echo('r', crash_in=1))  # re-sent to instance 2
    attempt('idempotent', lambda: plain.read('i', crash_in=2))  # declared: re-sent to 3
    attempt('other_method', lambda: retried.read('o'))  # only echo and read are listed...
    attempt('bounded', bounded.always_crash)  # ...its calls go twice, then fail
    # The same rules for futures:
    attempt('future_retried', lambda: retried.futures.echo('fr', crash_in=5).result())
    attempt('future_idempotent', lambda: plain.futures.read('fi', crash_in=6).result())
    attempt('future_plain', lambda: plain.futures.echo('fp', crash_in=7).result())
    attempt('future_bounded', lambda: bounded.futures.always_crash().result())
    in_flight = [retried.futures.read(f'f{i}', crash_in=10) for i in range(4)]  # one crash
    attempt('in_flight', lambda: [future.result() for future in in_flight])
    with open(record, 'w') as f:
        json.dump(results, f)


def test_calls_are_resent_to_the_restarted_node_only_where_asked(tmp_path):
    record, log = tmp_path / 'results.json', tmp_path / 'calls.log'
    program = lp.Program('retries')
    flaky = program.add_node(lp.CourierNode(Flaky, str(log)), label='flaky',
                             restart=lp.RestartPolicy(max_restarts=20, backoff=0.05,
                                                             max_backoff=0.1))
    program.add_node(lp.PyNode(call, flaky, flaky.with_retries(3, methods=['echo', 'read']),
                               flaky.with_retries(attempts=2), str(record)), label='caller')
    controller = lp.launch(program, launch_type='test_mp')
    assert controller.wait(labels=['caller'], timeout=120)
    controller.stop()
    results = json.loads(record.read_text())
    assert results['plain'][0] == 'ServerUnavailableError'
    assert results['retried'] == ['r', 2]
    assert results['idempotent'] == ['i', 3]
    assert results['other_method'] == ['o', 3]
    assert results['bounded'][0] == 'ServerUnavailableError'
    sent = log.read_text().splitlines()
    assert sent[:16] == [  # what each instance (attempt) was sent
        'echo first 0', 'echo p 0', 'echo r 1', 'echo r 2', 'read i 2', 'read i 3', 'read o 3',
        'always_crash 3', 'always_crash 4', 'echo fr 5', 'echo fr 6', 'read fi 6', 'read fi 7',
        'echo fp 7', 'always_crash 8', 'always_crash 9']
    assert results['future_retried'] == ['fr', 6]
    assert results['future_idempotent'] == ['fi', 7]
    assert results['future_plain'][0] == 'ServerUnavailableError'
    assert results['future_bounded'][0] == 'ServerUnavailableError'
    assert results['in_flight'] == [[f'f{i}', 11] for i in range(4)]
    # Instance 10 crashed in the first it got; each of the four was answered by instance 11.
    assert sorted(line for line in sent[16:] if line.endswith(' 11')) == [
        f'read f{i} 11' for i in range(4)]
    assert 'exit code 7' in controller.status()['flaky/0'].error


def test_retries_are_checked():
    with pytest.raises(ValueError, match='attempts'):
        lp.Retries(attempts=0)
    with pytest.raises(TypeError, match=r"methods=\['echo'\]"):
        lp.Retries(methods='echo')
