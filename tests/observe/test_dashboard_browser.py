"""The dashboard in a real headless browser (Debian's chromium driven by Playwright): every node
shows, a metric plot grows, and a node that fails turns red.

Set LAUNCHPAD_DASHBOARD_SCREENSHOT=docs/dashboard.png to refresh README's screenshot.
"""
from __future__ import annotations

import os
import shutil

import pytest

import launchpad as lp
from tests.observe import nodes
from tests.testbeds import require_testbed

pytestmark = pytest.mark.timeout(150)
FAILED_RED = 'rgb(214, 60, 60)'  # --failed, #d63c3c
NODES = ('learner/0', 'actor/0', 'actor/1', 'simulator/0')


def _chromium() -> str:
    path = shutil.which('chromium') or shutil.which('chromium-browser')
    if path is None:
        require_testbed('no chromium to run the dashboard in: install it with '
                        'tests/testbeds/install_packages.sh (as root)')
    try:
        import playwright.sync_api  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        require_testbed("playwright is not installed: pip install -e '.[test]'")
    return path


def _points(page, metric: str) -> int:
    return int(page.get_attribute(f'.plot[data-metric="{metric}"]', 'data-points') or 0)


def test_the_dashboard_shows_the_graph_plots_and_a_node_failing(runtime_dir, tmp_path):
    del runtime_dir
    chromium = _chromium()
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
                page.wait_for_selector('#banner:has-text("program ended")', timeout=60_000)
                assert not errors, errors
            finally:
                browser.close()
    finally:
        controller.stop()
        controller.observer.close()
    with pytest.raises(lp.NodeFailedError, match='simulator/0'):
        controller.wait()
