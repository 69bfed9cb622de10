"""`python -m launchpad.launch top PROGRAM`: a live terminal view of a running program (curses).

    ┌ the program: name, id, launch type, uptime ─────────────────────── keys ┐
    │ a row per node: state, host, CPU %, RSS, threads, calls served/s,       │
    │ errors/s, restarts, seconds since its last progress (`lp.heartbeat`)    │
    │ a sparkline per metric and node (`lp.report`, `lp.count`, calls/s)      │
    └─────────────────────────────────────────────────────────────────────────┘

Keys: up/down (or k/j) pick a node, `s` shows its stacks, `l` its log (followed), `w` the calls
in flight between nodes; in those, up/down and PgUp/PgDn scroll and Esc, `b` or `q` go back;
`q` quits. It ends by itself when the program ends.

Two threads: `lp-top-fetch` asks the program's observer every `interval` seconds for its view,
its nodes' process numbers (a live probe) and new plot points, and keeps the latest; the main
thread draws and reads keys. Numbers of a node that did not answer the probe are left blank.
"""
from __future__ import annotations

import collections
import curses
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

import courier

from launchpad.observe import inspect_text
from launchpad.process import probe

SPARK = '▁▂▃▄▅▆▇█'
HISTORY = 120  # points kept per sparkline
_COLUMNS = ['NODE', 'STATE', 'HOST', 'CPU%', 'RSS', 'THR', 'CALLS/S', 'ERR/S', 'RESTARTS',
            'PROGRESS']


def sparkline(values: List[float], width: int) -> str:
    """The last `width` values as bars scaled between their minimum and maximum."""
    values = values[-width:]
    if not values:
        return ''
    low, high = min(values), max(values)
    if high == low:
        return SPARK[0 if high == 0 else len(SPARK) // 2] * len(values)
    return ''.join(SPARK[int((v - low) / (high - low) * (len(SPARK) - 1))] for v in values)


def _size(count: Optional[float]) -> str:
    if count is None:
        return ''
    for unit in ('B', 'K', 'M', 'G'):
        if count < 1024 or unit == 'G':
            return f'{count:.0f}{unit}' if unit == 'B' else f'{count:.1f}{unit}'
        count /= 1024
    return ''


class Model:
    """What the view shows, fetched from the observer (`client`); no curses here."""

    def __init__(self, client, interval: float):
        self._client = client
        self._interval = interval
        self._lock = threading.Lock()
        self._cpu: Dict[str, Tuple[float, float]] = {}  # node -> (cpu seconds, wall time)
        self._seq = 0
        self.series: Dict[Tuple[str, str], Deque[float]] = {}  # (metric, node) -> values
        self.rows: List[List[str]] = []
        self.names: List[str] = []
        self.ended: Optional[str] = None  # why it ended, once it has
        self.error = ''  # why the last round failed, if it did
        self.updated = 0.0

    def fetch(self) -> None:
        """One round: view, process numbers and plot points."""
        view = self._client.view()
        probed = self._client.probe([probe.PROCESS], None, min(0.5, self._interval / 2))
        history = self._client.history(self._seq)
        here = probed.get('process')
        rows, names = [], []
        for row in view['nodes']:
            name = row['name']
            answer = here if name in probed['in_process'] else probed['nodes'].get(name, {})
            stats = (answer or {}).get(probe.PROCESS) or {}
            rows.append([name, row['state'], row['host'] or '', self._cpu_percent(name, stats),
                         _size(stats.get('rss')), str(stats.get('threads', '')),
                         f'{row["calls_per_s"]:.1f}', f'{row["errors_per_s"]:.1f}',
                         str(row['restarts']),
                         f'{stats["progress_age"]:.0f}s' if 'progress_age' in stats else ''])
            names.append(name)
        with self._lock:
            for sample in history['samples']:
                for metric, by_node in sample['values'].items():
                    for node, value in by_node.items():
                        self.series.setdefault((metric, node), collections.deque(
                            maxlen=HISTORY)).append(float(value))
            self._seq = history['next']
            self.rows, self.names, self.updated = rows, names, time.time()
            if view.get('ended'):
                self.ended = view.get('stop_reason') or 'ended'

    def _cpu_percent(self, name: str, stats: Dict[str, Any]) -> str:
        if 'cpu_seconds' not in stats:
            return ''
        now = time.monotonic()
        before = self._cpu.get(name)
        self._cpu[name] = (stats['cpu_seconds'], now)
        if before is None or now <= before[1]:
            return ''
        return f'{100 * (stats["cpu_seconds"] - before[0]) / (now - before[1]):.0f}'

    def snapshot(self):
        with self._lock:
            return (list(self.rows), list(self.names),
                    {key: list(values) for key, values in self.series.items()})

    def run(self, stop: threading.Event) -> None:
        """Fetches every interval until `stop` or the program's end."""
        while not stop.is_set() and self.ended is None:
            try:
                self.fetch()
            except courier.ServerUnavailableError:
                self.ended = 'its launcher has gone'
            except Exception as e:  # pylint: disable=broad-except  (shown; the next may do)
                self.error = f'{type(e).__name__}: {e}'
            else:
                self.error = ''
            stop.wait(self._interval)


class _View:
    """The curses screen: the node table with sparklines, or a scrolled text (stacks, a log)."""

    def __init__(self, screen, model: Model, client, title: str, interval: float):
        self._screen = screen
        self._model = model
        self._client = client
        self._title = title
        self._interval = interval
        self._selected = 0
        self._text: Optional[Tuple[str, Any]] = None  # (what, how to fetch it)
        self._lines: List[str] = []
        self._scroll = 0
        self._text_fetched = 0.0

    def loop(self) -> None:
        self._screen.timeout(100)
        while True:
            self._draw()
            key = self._screen.getch()
            if self._model.ended is not None and self._text is None:
                return
            if not self._key(key):
                return

    def _key(self, key: int) -> bool:
        """Handles `key`; False to quit."""
        if key == -1:
            return True
        if self._text is not None:
            page = max(1, self._screen.getmaxyx()[0] - 2)
            moves = {curses.KEY_UP: -1, ord('k'): -1, curses.KEY_DOWN: 1, ord('j'): 1,
                     curses.KEY_PPAGE: -page, curses.KEY_NPAGE: page}
            if key in moves:
                self._scroll = max(0, self._scroll + moves[key])
            elif key in (27, ord('b'), ord('q')):
                self._text = None
            return True
        _, names, _ = self._model.snapshot()
        if key in (ord('q'), ord('Q')):
            return False
        if key in (curses.KEY_UP, ord('k')):
            self._selected = max(0, self._selected - 1)
        elif key in (curses.KEY_DOWN, ord('j')):
            self._selected = min(max(0, len(names) - 1), self._selected + 1)
        elif key in (ord('s'), ord('l')) and names:
            node = names[min(self._selected, len(names) - 1)]
            self._open(('stacks' if key == ord('s') else 'log', node))
        elif key == ord('w'):
            self._open(('waits', None))
        return True

    def _open(self, what: Tuple[str, Optional[str]]) -> None:
        self._text, self._scroll, self._text_fetched = what, 0, 0.0
        self._lines = ['(asking...)']

    def _fetch_text(self) -> None:
        kind, node = self._text
        try:
            if kind == 'stacks':
                text = inspect_text.stacks(self._client.probe([probe.STACKS], node), time.time())
            elif kind == 'waits':
                text = inspect_text.waits(self._client.waits())
            else:
                text = '\n'.join(line for _, line in self._client.logs(node)['lines'])
                text = text or '(no output yet)'
        except Exception as e:  # pylint: disable=broad-except  (shown in place of the text)
            text = f'cannot show the {kind} of {node}: {e}'
        following = kind == 'log' and self._scroll >= max(0, len(self._lines) - 3)
        self._lines = text.splitlines()
        if following and self._text_fetched:
            self._scroll = max(0, len(self._lines) - (self._screen.getmaxyx()[0] - 2))
        elif not self._text_fetched and kind == 'log':
            self._scroll = max(0, len(self._lines) - (self._screen.getmaxyx()[0] - 2))
        self._text_fetched = time.monotonic()

    def _put(self, y: int, x: int, text: str, attr: int = 0) -> None:
        height, width = self._screen.getmaxyx()
        if 0 <= y < height and x < width:
            try:
                self._screen.addstr(y, x, text[:max(0, width - x - 1)], attr)
            except curses.error:
                pass

    def _draw(self) -> None:
        self._screen.erase()
        height, _ = self._screen.getmaxyx()
        if self._text is not None:
            kind, node = self._text
            if kind != 'stacks' or not self._text_fetched:  # stacks: once; logs, waits: live
                if time.monotonic() - self._text_fetched >= self._interval:
                    self._fetch_text()
            self._put(0, 0, f'{kind} of {node or self._title}  (up/down, PgUp/PgDn scroll; '
                            f'Esc/b/q back)', curses.A_REVERSE)
            for y, line in enumerate(self._lines[self._scroll:self._scroll + height - 1], 1):
                self._put(y, 0, line)
            self._screen.refresh()
            return
        rows, names, series = self._model.snapshot()
        ended = f'  ENDED: {self._model.ended}' if self._model.ended else ''
        self._put(0, 0, f'{self._title}  {time.strftime("%H:%M:%S")}{ended}  '
                        f'[up/down] node  [s]tacks  [l]og  [w]aits  [q]uit', curses.A_REVERSE)
        if self._model.error:
            self._put(1, 0, self._model.error)
        table = inspect_text.table_lines(_COLUMNS, rows)
        for y, line in enumerate(table, 2):
            selected = y - 3 == min(self._selected, len(names) - 1)
            self._put(y, 0, line, curses.A_BOLD if y == 2 else
                      curses.A_REVERSE if selected else 0)
        y = len(table) + 3
        if series:
            self._put(y, 0, 'METRICS', curses.A_BOLD)
            width = max(len(f'{metric} {node}') for metric, node in series)  # all-zero: left out
            for (metric, node), values in sorted(series.items()):
                if not any(values):
                    continue
                y += 1
                if y >= height:
                    break
                self._put(y, 0, f'{f"{metric} {node}".ljust(width)}  {sparkline(values, 60)}  '
                                f'{values[-1]:.4g}')
        self._screen.refresh()


def run(entry, client, interval: float = 1.0) -> int:
    """Shows program `entry` (a registry entry) through `client` (of its observer) until the
    user quits or the program ends; returns the exit status."""
    model = Model(client, interval)
    model.fetch()  # the first round here, so that a program that cannot be asked fails now
    stop = threading.Event()
    fetcher = threading.Thread(target=model.run, args=(stop,), daemon=True, name='lp-top-fetch')
    fetcher.start()
    title = f'{entry.name} ({entry.id}, {entry.launch_type}, pid {entry.pid} on {entry.host})'
    try:
        curses.wrapper(lambda screen: _View(screen, model, client, title, interval).loop())
    finally:
        stop.set()
    if model.ended is not None:
        print(f'Program {entry.name} ({entry.id}) ended: {model.ended}.')
    return 0
