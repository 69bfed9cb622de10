"""What restart policies do to a node, as `status`, the dashboard's view and /metrics show it: a
node restarted once runs with one restart, a node that failed for good under on_failure='drop'
is dropped, with its error."""
from __future__ import annotations

import os

import pytest

import launchpad as lp
from launchpad.observe import cli, prometheus
from tests.observe.programs import wait_until

pytestmark = pytest.mark.timeout(180)
parser = pytest.importorskip('prometheus_client.parser')


def fails_first(marker: str) -> None:
    """Fails at its first run (which leaves `marker`), then runs until the program stops."""
    if not os.path.exists(marker):
        with open(marker, 'w', encoding='utf-8'):
            pass
        raise RuntimeError('the first run fails')
    lp.wait_for_stop()


def always_fails() -> None:
    raise RuntimeError('gone for good')


def _settled(observer) -> dict:
    rows = {row['name']: row for row in observer.view()['nodes']}
    again, dropped = rows['again/0'], rows['dropped/0']
    # (again/0 runs at first too: it is settled once it runs after its restart)
    if again['state'] == 'running' and again['restarts'] and dropped['state'] == 'dropped':
        return rows
    return {}


def test_status_view_and_metrics_show_restarts_and_dropped_nodes(runtime_dir, tmp_path, capsys):
    del runtime_dir
    program = lp.Program('restarts')
    program.add_node(lp.PyNode(fails_first, str(tmp_path / 'ran')), label='again',
                     restart=lp.RestartPolicy(max_restarts=2, backoff=0.1))
    program.add_node(lp.PyNode(always_fails), label='dropped',
                     restart=lp.RestartPolicy(max_restarts=0, on_failure='drop'))
    controller = lp.launch(program, launch_type='test_mt')
    try:
        observer = controller.observer
        rows = wait_until(lambda: _settled(observer), timeout=90,
                          what='again/0 running again, dropped/0 dropped')
        assert rows['again/0']['restarts'] == 1 and rows['again/0']['uptime'] is not None
        assert not controller.done  # the restarted thread runs on: the program too
        assert rows['dropped/0']['restarts'] == 0
        assert 'gone for good' in rows['dropped/0']['error']

        assert cli.main(['status', 'restarts']) == 0
        table = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()
                 if line.startswith(('again/', 'dropped/'))}
        assert table['again/0'][1] == 'running' and 'dropped' == table['dropped/0'][1]
        assert 'RuntimeError: gone for good' in ' '.join(table['dropped/0'])

        samples = {(sample.name, frozenset(sample.labels.items())): sample.value
                   for family in parser.text_string_to_metric_families(
                       prometheus.exposition(observer.sample()).decode())
                   for sample in family.samples}

        def value(name, **labels):
            return samples[(name, frozenset({'program': 'restarts', **labels}.items()))]

        assert value('launchpad_node_restarts_total', node='again/0') == 1
        assert value('launchpad_node_state', node='dropped/0', state='dropped') == 1
        assert value('launchpad_node_state', node='again/0', state='restarting') == 0
        assert value('launchpad_node_state', node='again/0', state='running') == 1
    finally:
        controller.stop()
        controller.wait(raise_error=False)
        controller.observer.close()
