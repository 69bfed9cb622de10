"""The dashboard's /metrics endpoint, scraped over HTTP and read with the Prometheus client's own
parser."""
from __future__ import annotations

import urllib.error
import urllib.request

import pytest

import launchpad as lp
from tests.observe import nodes
from tests.observe.programs import wait_until

pytestmark = pytest.mark.timeout(120)
parser = pytest.importorskip('prometheus_client.parser')


def _scrape(url: str, **headers: str) -> str:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers['Content-Type'].startswith('text/plain')
        return response.read().decode()


def _samples(text: str) -> dict:
    """(name, frozenset of labels) -> value, for every sample of the exposition."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in parser.text_string_to_metric_families(text)
            for sample in family.samples}


def _everyone_reported(sample: dict) -> bool:
    values = sample['values']
    calls = {(table['node'], table['target']) for table in sample['clients']}
    return ({('actor/0', 'learner/0'), ('actor/1', 'learner/0')} <= calls
            and all('episode_return' in values.get(actor, {}) for actor in ('actor/0', 'actor/1'))
            and {'loss', 'learner_steps'} <= set(values.get('learner/0', {}))
            and all(row['uptime'] for row in sample['nodes']))


def test_metrics_endpoint_is_scraped_by_the_prometheus_parser(runtime_dir, tmp_path):
    del runtime_dir
    program = nodes.agent(str(tmp_path / 'never'))
    controller = lp.launch(program, launch_type='test_mp', dashboard=True)
    try:
        observer = controller.observer
        base, token = observer.dashboard_url.split('/?token=')
        wait_until(lambda: _everyone_reported(observer.sample()), what='reports of every node')
        text = _scrape(base + '/metrics', Authorization=f'Bearer {token}')
        families = {family.name: family for family in parser.text_string_to_metric_families(text)}
        samples = _samples(text)

        def value(name, **labels):
            return samples[(name, frozenset({'program': 'agent', **labels}.items()))]

        assert families['launchpad_node_state'].type == 'gauge'
        for node in ('learner/0', 'actor/0', 'actor/1', 'simulator/0'):
            assert value('launchpad_node_state', node=node, state='running') == 1
            assert value('launchpad_node_state', node=node, state='failed') == 0
            assert value('launchpad_node_restarts_total', node=node) == 0
            assert value('launchpad_node_uptime_seconds', node=node) > 0
        served = value('courier_server_calls_total', node='learner/0', method='update')
        assert served > 0
        assert value('courier_server_errors_total', node='learner/0', method='update') == 0
        assert families['courier_server_call_seconds'].type == 'histogram'
        buckets = sorted((float(dict(labels)['le']), v) for (name, labels), v in samples.items()
                         if name == 'courier_server_call_seconds_bucket'
                         and dict(labels)['node'] == 'learner/0')
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
        assert buckets[-1] == (float('inf'), served)
        for actor in ('actor/0', 'actor/1'):
            assert value('courier_client_calls_total', node=actor, target='learner/0',
                         method='update') > 0
        assert families['episode_return'].type == 'gauge'
        assert value('episode_return', node='actor/1') >= 0
        assert families['learner_steps'].type == 'counter'
        assert value('learner_steps_total', node='learner/0') > 0
        assert 0 < value('loss', node='learner/0') < 1

        assert _scrape(base + '/metrics?token=' + token)  # a scraper's `params:` works too
        for headers in ({}, {'Authorization': 'Bearer wrong'}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                _scrape(base + '/metrics', **headers)
            assert refused.value.code == 403
    finally:
        controller.stop()
        controller.observer.close()
