"""The dashboard server without a browser: its option, its extra, its token, and a page that
needs nothing from the internet."""
from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request

import pytest

import launchpad as lp
from launchpad.observe import dashboard
from tests.observe import nodes

pytestmark = pytest.mark.timeout(60)


def test_a_bad_dashboard_option_fails_before_anything_starts(runtime_dir):
    del runtime_dir
    with pytest.raises(ValueError, match=r'dashboard= takes True .* or a port number'):
        lp.launch(nodes.agent('unused'), launch_type='test_mt', dashboard='yes')


def test_several_programs_get_a_dashboard_each_on_free_ports(runtime_dir, tmp_path):
    del runtime_dir
    programs = [nodes.agent(str(tmp_path / 'never')) for _ in range(2)]
    with pytest.raises(ValueError, match=r'several programs .* pass dashboard=True'):
        lp.launch(programs, launch_type='test_mt', dashboard=8765)
    controllers = lp.launch(programs, launch_type='test_mt', dashboard=True)
    try:
        urls = [controller.observer.dashboard_url for controller in controllers]
        assert len(set(urls)) == 2 and all(url.startswith('http://127.0.0.1:') for url in urls)
        assert len({controller.observer.entry.id for controller in controllers}) == 2
    finally:
        controllers.stop()
        controllers.wait()
        for controller in controllers:
            controller.observer.close()


def test_without_its_extra_the_dashboard_names_the_extra(runtime_dir, monkeypatch):
    del runtime_dir
    monkeypatch.setitem(sys.modules, 'aiohttp', None)  # makes `import aiohttp` fail
    with pytest.raises(ImportError, match=re.escape("pip install 'launchpad-ml[dashboard]'")):
        lp.launch(nodes.agent('unused'), launch_type='test_mt', dashboard=True)


def test_the_page_needs_the_token_and_nothing_from_the_internet(runtime_dir, tmp_path):
    del runtime_dir
    for asset in dashboard.STATIC.iterdir():
        text = asset.read_text()
        assert not re.findall(r'https?://(?!www\.w3\.org/2000/svg)', text), asset.name
        assert not re.search(r'<(script|link)[^>]+(src|href)="(?!/static/)', text), asset.name
    controller = lp.launch(nodes.agent(str(tmp_path / 'never')), launch_type='test_mt',
                           dashboard=True)
    try:
        url = controller.observer.dashboard_url
        assert url.startswith('http://127.0.0.1:')
        base, token = url.split('/?token=')
        with urllib.request.urlopen(url, timeout=30) as page:
            assert '/static/dashboard.js' in page.read().decode()
        for path in ('/', '/?token=wrong', '/api/view', '/api/logs?node=actor/0'):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 403
        request = urllib.request.Request(base + '/api/logs?node=nobody',
                                         headers={dashboard.TOKEN_HEADER: token})
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(request, timeout=30)
        assert missing.value.code == 404
    finally:
        controller.stop()
        controller.observer.close()
