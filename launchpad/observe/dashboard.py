"""The web dashboard of a running program, served with aiohttp (`pip install
'launchpad-ml[dashboard]'`).

It binds 127.0.0.1 only, on a port of its own, and every request but the page's static files
must carry its random token (the URL it prints has it; the page passes it on as a header; a
Prometheus scraper sends `Authorization: Bearer TOKEN` or `?token=TOKEN`):

    /?token=T             the page (static/index.html, dashboard.js, dashboard.css: no file
                          from the internet): the graph, a table of nodes, a node's log, plots
    /api/describe         the program (names, edges)             - Observer.describe
    /api/view             the latest rows of nodes and edges      - Observer.view
    /api/history?since=N  plot points after sample N              - Observer.history
    /api/logs?node=&cursor=  a node's log lines since the cursor  - Observer.logs
    /api/series?start=&end=&points=  the run's metrics from its   - Observer.series
                          run directory, whole or a time range
    /api/failures?node=   failures with their tracebacks          - Observer.failures
    /api/stacks?node=     a node's (or every node's) stacks, live, with their text
                                                                  - Observer.probe
    /api/waits            the calls in flight, deadlocks, with their text - Observer.waits
    /metrics              the Prometheus text (`prometheus`)

Its source is the program's observer: the object itself in the launching process
(`lp.launch(..., dashboard=True)`), or a courier client of it in another process
(`python -m launchpad.launch dashboard PROGRAM`), or the run file of a run that has ended
(`runstore.StoredRun`); all answer the same methods. The server runs
an asyncio loop in a thread of its own; calls to the source run in the loop's executor, since a
remote one blocks.
"""
from __future__ import annotations

import asyncio
import json
import pathlib
import secrets
import threading
import time
from typing import Any, Callable, Dict, Optional

from launchpad.observe import inspect_text
from launchpad.observe import prometheus
from launchpad.process import probe

EXTRA = 'launchpad-ml[dashboard]'
STATIC = pathlib.Path(__file__).resolve().parent / 'static'
TOKEN_HEADER = 'X-Launchpad-Token'


def require() -> None:
    """Raises ImportError naming the extra to install if the dashboard's libraries are missing."""
    missing = []
    for module in ('aiohttp', 'prometheus_client'):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(f'The dashboard needs {" and ".join(missing)}, which are not '
                          f"installed: pip install '{EXTRA}'")


class Dashboard:
    """Serves the dashboard of `source` (an observer, or a courier client of one) until closed.

    Attributes:
      url: where to open it, token included.
      port: the port it listens on (127.0.0.1).
      token: the token every request must carry.
    """

    def __init__(self, source: Any, *, port: int = 0, host: str = '127.0.0.1'):
        require()
        self._source = source
        self.token = secrets.token_urlsafe(16)
        self.port: Optional[int] = None
        self._loop = asyncio.new_event_loop()
        self._runner = None
        started = threading.Event()
        failure: list = []
        self._thread = threading.Thread(target=self._serve, args=(host, port, started, failure),
                                        daemon=True, name='lp-dashboard')
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            raise OSError(f'cannot serve the dashboard on {host}:{port}: {failure[0]}') \
                from failure[0]
        self.url = f'http://{host}:{self.port}/?token={self.token}'

    def _serve(self, host: str, port: int, started: threading.Event, failure: list) -> None:
        from aiohttp import web  # pylint: disable=import-outside-toplevel
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get('/', self._page)
        app.router.add_static('/static/', STATIC)
        app.router.add_get('/api/describe', self._api(lambda request: self._source.describe()))
        app.router.add_get('/api/view', self._api(lambda request: self._source.view()))
        app.router.add_get('/api/history', self._api(
            lambda request: self._source.history(int(request.query.get('since', 0)))))
        app.router.add_get('/api/logs', self._api(lambda request: self._source.logs(
            request.query.get('node') or None,
            json.loads(request.query['cursor']) if request.query.get('cursor') else None)))
        app.router.add_get('/api/series', self._api(lambda request: self._source.series(
            _number(request, 'start'), _number(request, 'end'),
            int(request.query.get('points', 600)))))
        app.router.add_get('/api/failures', self._api(
            lambda request: self._source.failures(request.query.get('node') or None)))
        app.router.add_get('/api/stacks', self._api(lambda request: self._stacks(
            request.query.get('node') or None)))
        app.router.add_get('/api/waits', self._api(lambda request: self._waits()))
        app.router.add_get('/metrics', self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        try:
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host, port)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # pylint: disable=protected-access
        except OSError as e:
            failure.append(e)
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()
            started.set()
            return
        started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    def close(self) -> None:
        """Stops serving and frees the port."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    # Requests.

    def _allowed(self, request) -> bool:
        offered = (request.headers.get(TOKEN_HEADER) or request.query.get('token')
                   or request.headers.get('Authorization', '').partition('Bearer ')[2])
        return secrets.compare_digest(offered.encode(), self.token.encode())

    def _refused(self):
        from aiohttp import web  # pylint: disable=import-outside-toplevel
        return web.Response(status=403, text='This dashboard needs its token: open the URL it '
                                             'printed, which ends in ?token=...\n')

    async def _page(self, request):
        from aiohttp import web  # pylint: disable=import-outside-toplevel
        if not self._allowed(request):
            return self._refused()
        return web.FileResponse(STATIC / 'index.html',
                                headers={'Cache-Control': 'no-store',
                                         'Referrer-Policy': 'no-referrer'})

    def _api(self, call: Callable[[Any], Any]):
        from aiohttp import web  # pylint: disable=import-outside-toplevel

        async def handle(request):
            if not self._allowed(request):
                return self._refused()
            try:
                result = await self._loop.run_in_executor(None, call, request)
            except (LookupError, ValueError) as e:
                return web.json_response({'error': str(e)}, status=404)
            except Exception as e:  # pylint: disable=broad-except  (the program is gone)
                return web.json_response({'error': f'the program cannot be reached: {e}'},
                                         status=503)
            return web.json_response(result)

        return handle

    def _stacks(self, node: Optional[str]) -> Dict[str, Any]:
        probed = self._source.probe([probe.STACKS], node)
        return {'text': inspect_text.stacks(probed, time.time()), **probed}

    def _waits(self) -> Dict[str, Any]:
        found = self._source.waits()
        return {'text': inspect_text.waits(found), **found}

    async def _metrics(self, request):
        from aiohttp import web  # pylint: disable=import-outside-toplevel
        if not self._allowed(request):
            return self._refused()
        try:
            sample = await self._loop.run_in_executor(None, self._source.sample)
        except Exception as e:  # pylint: disable=broad-except
            return web.Response(status=503, text=f'the program cannot be reached: {e}\n')
        body = prometheus.exposition(sample)
        return web.Response(body=body, headers={'Content-Type': prometheus.content_type()})


def _number(request, name: str) -> Optional[float]:
    """The number query parameter `name` carries (None if absent); ValueError if not one."""
    text = request.query.get(name)
    return None if text in (None, '') else float(text)
