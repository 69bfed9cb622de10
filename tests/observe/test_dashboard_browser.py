"""The dashboard in a real headless browser (Debian's chromium driven by Playwright): every node
shows, a metric plot grows, with axis ticks, per-node CPU and memory, counters as rates,
smoothing and zooming, and a node that fails turns red and shows its traceback.

Set LAUNCHPAD_DASHBOARD_SCREENSHOT=docs/dashboard.png to refresh README's screenshot.
"""
from __future__ import annotations

import os

import pytest

import launchpad as lp
from tests.observe import nodes, programs

pytestmark = pytest.mark.timeout(150)
FAILED_RED = 'rgb(214, 60, 60)'  # --failed, #d63c3c
NODES = ('learner/0', 'actor/0', 'actor/1', 'simulator/0')


def _points(page, metric: str) -> int:
    return int(page.get_attribute(f'.plot[data-metric="{metric}"]', 'data-points') or 0)


def test_the_dashboard_shows_the_graph_plots_and_a_node_failing(runtime_dir, tmp_path):
    del runtime_dir
    chromium = programs.chromium()
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
    trigger = tmp_path / 'fail now'
    controller = lp.launch(nodes.agent(str(trigger)), launch_type='test_mp', dashboard=True,
                           notice_period=5)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium,
                                                 args=['--no-sandbox'])
            try:
                page = browser.new_page(viewport={'width': 1400, 'height': 840})
                errors = []
                page.on('pageerror', lambda error: errors.append(str(error)))
                page.goto(controller.observer.dashboard_url)
                for node in NODES:  # in the graph and in the table, running
                    page.wait_for_selector(f'#graph .node[data-node="{node}"]'
                                           f'[data-state="running"]', timeout=60_000)
                    page.wait_for_selector(f'#nodes tr[data-node="{node}"]', timeout=10_000)
                page.wait_for_selector('#graph .edge[data-source="actor/0"]'
                                       '[data-target="learner/0"]')
                # A plot of a reported metric grows while we watch.
                page.wait_for_function(
                    'document.querySelector(\'.plot[data-metric="episode_return"]\')'
                    '?.getAttribute("data-points") >= 2', timeout=60_000)
                seen = _points(page, 'episode_return')
                page.wait_for_function(
                    f'document.querySelector(\'.plot[data-metric="episode_return"]\')'
                    f'.getAttribute("data-points") > {seen}', timeout=30_000)
                assert page.locator('.plot[data-metric="episode_return"] polyline').count() == 2
                assert page.locator('.plot[data-metric="loss"] polyline').count() == 1
                _check_plots(page)
                page.select_option('#log-node', 'actor/0')
                page.wait_for_function('document.querySelector("#log").textContent'
                                       '.includes("actor 0: episode")', timeout=30_000)
                page.wait_for_timeout(1500)  # the edges' rates and another plot point
                page.screenshot(path=os.environ.get('LAUNCHPAD_DASHBOARD_SCREENSHOT')
                                or str(tmp_path / 'dashboard.png'), full_page=True)

                trigger.write_text('now')
                failed = page.wait_for_selector('#graph .node[data-node="simulator/0"]'
                                                '[data-state="failed"]', timeout=60_000)
                fill = failed.eval_on_selector('rect', 'r => getComputedStyle(r).fill')
                assert fill == FAILED_RED
                row = page.locator('#nodes tr[data-node="simulator/0"]')
                assert 'lost the connection to the simulator' in row.inner_text()
                row.click()  # its failures, with the traceback
                failure = page.wait_for_selector('#failures .failure[data-node="simulator/0"]',
                                                 timeout=30_000)
                assert 'lost the connection to the simulator' in failure.inner_text()
                assert "raise RuntimeError('lost the connection" in failure.inner_text()
                page.wait_for_selector('#banner:has-text("program ended")', timeout=60_000)
                assert not errors, errors
            finally:
                browser.close()
    finally:
        controller.stop()
        controller.observer.close()
    with pytest.raises(lp.NodeFailedError, match='simulator/0'):
        controller.wait()


def _check_plots(page) -> None:
    """Axis ticks with values, CPU and memory of each node process, a counter drawn as a rate,
    smoothing that changes a line and a drag that zooms every plot."""
    loss = '.plot[data-metric="loss"]'
    ticks = page.locator(f'{loss} text.axis').all_text_contents()
    assert len(ticks) >= 4 and any(':' in tick for tick in ticks), ticks  # values and 0:05...
    page.wait_for_selector('.plot[data-metric="launchpad_cpu_percent"] polyline'
                           '[data-node="learner/0"]', timeout=30_000)
    assert page.locator('.plot[data-metric="launchpad_rss_bytes"] polyline').count() == 4
    assert 'MiB' in page.locator('#nodes tr[data-node="learner/0"]').inner_text()
    steps = '.plot[data-metric="learner_steps"]'
    assert page.get_attribute(steps, 'data-kind') == 'counter'
    assert page.locator(f'{steps} h3').inner_text() == 'learner_steps /s'
    line = page.locator('.plot[data-metric="episode_return"] polyline[data-node="actor/0"]')
    raw = line.get_attribute('points')
    page.locator('#smoothing').fill('0.9')
    assert line.get_attribute('points') != raw
    page.locator('#smoothing').fill('0')
    box = page.locator(f'{loss} svg').bounding_box()
    page.mouse.move(box['x'] + box['width'] * 0.5, box['y'] + box['height'] / 2)
    page.mouse.down()
    page.mouse.move(box['x'] + box['width'] * 0.95, box['y'] + box['height'] / 2, steps=5)
    page.mouse.up()
    page.wait_for_selector('#range:has-text("zoomed")', timeout=10_000)
    assert page.is_visible('#whole-run')
    page.click('#whole-run')
    page.wait_for_selector('#range:has-text("the whole run")', timeout=10_000)
