"""Every example runs through `python -m launchpad.launch` as threads and as processes, and does
what it says."""
from __future__ import annotations

import collections
import json
import os
import re

import pytest

import launchpad as lp

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        'examples')
pytestmark = pytest.mark.timeout(120)

LAUNCH_TYPES = ['local_mt', 'local_mp']


def _ok(run):
    assert run.returncode == 0, f'exit code {run.returncode}\nstdout:\n{run.stdout}\n' \
                                f'stderr:\n{run.stderr}'
    return run


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_producer_consumer_consumes_every_value_once(run_example, launch_type):
    run = _ok(run_example('producer_consumer', launch_type, '--producers=2', '--count=3'))
    got = [re.fullmatch(r'got (\d+) from producer/(\d+)', line) for line in run.lines[:-1]]
    assert all(got), run.stdout
    assert sorted((int(m[1]), int(m[2])) for m in got) == [(v, v // 3) for v in range(6)]
    assert run.final_line == 'Consumed 6 values from 2 producers, sum 15.'


def test_readme_example_command_runs(run_example):
    with open(os.path.join(os.path.dirname(EXAMPLES), 'README.md'), encoding='utf-8') as f:
        block = re.search(r'<!-- example-command -->\n```bash\n(.*?)\n```', f.read(), re.S)[1]
    command = re.fullmatch(r'pip install -e \. && python -m launchpad\.launch --type=(\w+) '
                           r'examples/(\w+)\.py', block)
    assert command, f'README\'s example command changed shape: {block!r}'
    run = _ok(run_example(command[2], command[1]))
    assert run.final_line.startswith('Consumed ')
    assert len(run.lines) <= 10 and not run.stderr, run.stderr  # short, no warnings


def _words(text: str):
    return re.findall(r"[^\W_]+(?:'[^\W_]+)*", text.lower())


def _direct_count(paths):
    counts = collections.Counter()
    for path in paths:
        with open(path, encoding='utf-8') as f:
            counts.update(_words(f.read()))
    return counts


def _read_counts(path):
    with open(path, encoding='utf-8') as f:
        rows = [line.rstrip('\n').split('\t') for line in f]
    return {word: int(count) for word, count in rows}, [int(count) for _, count in rows]


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_mapreduce_counts_the_default_texts_like_a_direct_count(run_example, tmp_path,
                                                                launch_type):
    output = tmp_path / 'counts.tsv'
    run = _ok(run_example('mapreduce', launch_type, '--reducers=3', f'--output={output}'))
    data = os.path.join(EXAMPLES, 'data')
    paths = sorted(os.path.join(data, name) for name in os.listdir(data))
    expected = _direct_count(paths)
    counts, order = _read_counts(output)
    assert counts == expected
    assert order == sorted(order, reverse=True)
    assert run.final_line.startswith(f'Counted {sum(expected.values())} words '
                                     f'({len(expected)} distinct')
    assert run.final_line.endswith(f'in {len(paths)} files with 3 reducers; wrote {output}')


def test_mapreduce_counts_files_given_on_the_command_line(run_example, tmp_path):
    texts = ["It's a test: the keeper's lamp, the KEEPER's log; naïve café, café!",
             'one two two three three three\n' * 50, '']
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f'text{i}.txt'
        path.write_text(text, encoding='utf-8')
        paths.append(str(path))
    output = tmp_path / 'counts.tsv'
    _ok(run_example('mapreduce', 'local_mp', '--reducers=2', f'--output={output}', *paths))
    counts, _ = _read_counts(output)
    assert counts == _direct_count(paths)
    assert counts["keeper's"] == 2 and counts['café'] == 2 and counts['three'] == 150


def test_mapreduce_names_a_missing_input_file(run_example, tmp_path):
    missing = tmp_path / 'no-such-file.txt'
    run = run_example('mapreduce', 'local_mt', str(missing))
    assert run.returncode != 0
    assert f'Not a readable file: {missing}' in run.stderr


def _overlapped(evaluations) -> bool:
    return max(e['start'] for e in evaluations) < min(e['end'] for e in evaluations)


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_evolution_strategies_improves_with_evaluations_in_parallel(run_example, tmp_path,
                                                                   launch_type):
    history_path = tmp_path / 'history.json'
    run = _ok(run_example('evolution_strategies', launch_type, '--evaluators=2',
                          '--generations=15', '--population=32', f'--history={history_path}'))
    history = json.loads(history_path.read_text())
    generations = history['history']
    scores = [entry['score'] for entry in generations]
    assert history['initial_score'] == pytest.approx(-5.0)
    assert scores[-1] > history['initial_score'] + 2.5, scores  # 0 is perfect
    assert max(scores[:3]) < scores[-1], scores
    # Every generation sends both requests through futures before it waits for any result.
    assert all(len(entry['evaluations']) == 2 for entry in generations)
    assert all(max(e['sent'] for e in entry['evaluations'])
               < min(e['received'] for e in entry['evaluations']) for entry in generations)
    overlapping = sum(_overlapped(entry['evaluations']) for entry in generations)
    if launch_type == 'local_mp':
        # So evaluations (about 20 ms each) run at the same time; one call after the other, they
        # never would. As threads they often do not: the interpreter lock runs one thread at a
        # time, and the thread of a busy evaluation tends to keep it.
        assert overlapping >= len(generations) // 2, overlapping
    assert run.final_line.startswith('Score improved from -5.000 to ')
    assert run.final_line.endswith(f'ran concurrently in {overlapping} of 15 generations.')


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_actor_learner_average_return_rises(run_example, tmp_path, launch_type):
    results_path = tmp_path / 'results.json'
    run = _ok(run_example('actor_learner', launch_type, '--actors=2', '--episodes=200',
                          '--seed=1', f'--results={results_path}'))
    results = json.loads(results_path.read_text())
    returns = results['returns']
    assert len(returns) == 200 and results['updates'] == 50
    first, last = sum(returns[:20]) / 20, sum(returns[-20:]) / 20
    # The untrained (uniform) policy balances about 22 steps; a trained one nears the 200 limit.
    assert last > 1.5 * first + 10, (first, last)
    assert run.final_line.startswith(f'Average return rose from {first:.1f} (first 20 episodes) '
                                     f'to {last:.1f} (last 20) over 200 episodes')


def _parameter_server(run_example, tmp_path, launch_type, *args):
    results_path = tmp_path / 'results.json'
    run = _ok(run_example('parameter_server', launch_type, '--seconds=0.5', '--requesters=4',
                          f'--results={results_path}', *args))
    results = json.loads(results_path.read_text())
    assert results['wrong'] == 0
    assert results['queries'] == sum(r['queries'] for r in results['per_requester']) > 0
    assert run.final_line.endswith(f'{sum(results["served"]):,} reached the servers; every answer '
                                   'correct.')
    return results


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_parameter_server_requester_i_asks_partition_i_mod_p(run_example, tmp_path, launch_type):
    results = _parameter_server(run_example, tmp_path, launch_type, '--partitions=3')
    per_requester = results['per_requester']
    # Each requester's queries (and its one warm-up query) reach its own partition.
    expected = [sum(r['queries'] + 1 for i, r in enumerate(per_requester) if i % 3 == p)
                for p in range(3)]
    assert results['served'] == expected


@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_parameter_server_behind_the_papers_cacher_class(run_example, tmp_path, launch_type):
    results = _parameter_server(run_example, tmp_path, launch_type, '--cacher=class',
                                '--refresh_ms=50')
    # Queries are answered from the cacher's copy: the server sees a refresh every 50 ms at most.
    assert 1 <= sum(results['served']) < results['queries'] / 5
    assert sum(results['served']) <= 40


@pytest.mark.skipif(not hasattr(lp, 'CacherNode'), reason='lp.CacherNode has not landed yet')
@pytest.mark.parametrize('launch_type', LAUNCH_TYPES)
def test_parameter_server_behind_cacher_node(run_example, tmp_path, launch_type):
    results = _parameter_server(run_example, tmp_path, launch_type, '--cacher=node',
                                '--refresh_ms=50', '--partitions=2')
    assert 2 <= sum(results['served']) < results['queries'] / 5


def _es_pool(run_example, tmp_path, launch_type, *args):
    history_path = tmp_path / f'history{len(args)}.json'
    run = _ok(run_example('es_pool', launch_type, '--workers=2', '--generations=12',
                          f'--history={history_path}', *args))
    return run, json.loads(history_path.read_text())


def test_es_pool_improves_and_a_worker_killed_mid_map_changes_nothing(run_example, tmp_path):
    run, clean = _es_pool(run_example, tmp_path, 'local_mp')
    assert clean['initial_score'] == pytest.approx(-5.0)
    assert clean['scores'][-1] > clean['initial_score'] + 2.5, clean['scores']  # 0 is perfect
    assert clean['pool'].get('lost', 0) == 0
    assert run.final_line.endswith('on 2 pool workers; 0 worker(s) lost, 0 task(s) re-run.')
    run, killed = _es_pool(run_example, tmp_path, 'local_mp', '--kill_worker_at=4')
    assert killed['pool']['lost'] == 1 and killed['pool']['requeued'] >= 1, killed['pool']
    assert killed['scores'] == clean['scores']  # every score arrived once, in its place
    assert ' 1 worker(s) lost' in run.final_line


@pytest.mark.parametrize('name, args', [('a3c_flow', ['--updates=150']),
                                        ('ppo_flow', ['--rounds=25'])])
def test_dataflow_agents_learn_cartpole(run_example, tmp_path, name, args):
    results_path = tmp_path / 'results.json'
    run = _ok(run_example(name, 'local_mp', '--workers=2', '--seed=1',
                          f'--results={results_path}', *args))
    returns = json.loads(results_path.read_text())['returns']
    first, last = sum(returns[:20]) / 20, sum(returns[-20:]) / 20
    # The untrained (uniform) policy balances about 22 steps; a trained one nears the 200 limit.
    # (A3C's actors are asynchronous: on a busy machine its first 20 episodes already learned.)
    assert first < 60 and last > 80 and last > 2 * first, (first, last)
    assert run.final_line.startswith(f'Average return rose from {first:.1f} (first 20 episodes) '
                                     f'to {last:.1f} (last 20)')


def test_elastic_actors_asks_for_the_plot_extra_before_it_runs(run_example, tmp_path,
                                                                monkeypatch):
    """--plot without matplotlib stops at once, naming the extra that installs it, instead of a
    traceback after the whole run."""
    hidden = tmp_path / 'without_matplotlib' / 'matplotlib'
    hidden.mkdir(parents=True)
    (hidden / '__init__.py').write_text(  # what Python raises when it is not installed
        "raise ModuleNotFoundError(\"No module named 'matplotlib'\", name='matplotlib')\n")
    monkeypatch.setenv('PYTHONPATH', str(hidden.parent))
    run = run_example('elastic_actors', 'local_mp', f'--plot={tmp_path / "elastic.png"}')
    assert run.returncode != 0
    assert "pip install 'launchpad-ml[plot]'" in run.stderr, run.stderr
    assert not (tmp_path / 'elastic.json').exists()  # the program never started
    assert 'Traceback' not in run.stderr, run.stderr


def test_elastic_actors_follow_the_learner_and_plot_it(run_example, tmp_path):
    """local_mp, as CI runs it: the policy changes the actors while the learner trains, every
    change within [1, max_actors], and the plot is written."""
    plot = tmp_path / 'elastic.png'
    run = _ok(run_example('elastic_actors', 'local_mp', '--max_actors=4', f'--plot={plot}'))
    data = json.loads((tmp_path / 'elastic.json').read_text())
    actors = [n for _, n, _ in data['timeline']]
    decisions = data['decisions']
    assert decisions and all(1 <= d['target'] <= 4 for d in decisions), decisions
    assert max(actors) > 1, actors  # the actors grew while training ...
    returns = [r for _, _, r in data['timeline']]
    assert returns[-1] > returns[0] + 50, returns  # ... which made progress
    assert plot.stat().st_size > 10_000 and f'Wrote {plot}.' in run.stdout
