"""The observer: lets its user see and stop a running program from outside the launching process.

`lp.launch` makes one for every program it runs in this process (`observe`). It runs in the
launching process, beside the controller:

    lp-observe-<id>    samples the program once a second: node states from the coordinator,
                       metrics the nodes reported to it (or, for threads, this process's own),
                       turned into rows, edge rates and plot points (`figures`); keeps the last
                       HISTORY samples
    the controller's   when the program has ended, `program_ended`: a last sample, and the
                       entry and its server go
    its courier server on `<registry>/<id>.sock`, token-protected (`registry`), serving
                       describe, view, history, sample, logs, stop, probe (live stacks, calls
                       and process numbers of nodes, `probe`) and waits (`waits`) to the CLI
                       and to dashboards of other processes
    the dashboard      only with `lp.launch(..., dashboard=True)` (`dashboard`); it reads the
                       observer directly and stays up, showing how the program ended, until
                       `close()` or the end of the process

The served methods return plain data (dicts, lists, numbers, strings), the same whether called
here or through courier.
"""
from __future__ import annotations

import collections
import logging
import os
import pathlib
import secrets
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import courier

from launchpad.observe import figures
from launchpad.observe import recorder
from launchpad.observe import registry
from launchpad.observe import runstore
from launchpad.observe import usage
from launchpad.observe import waits as waits_of
from launchpad import metrics
from launchpad.process import probe as node_probe
from launchpad.program import Program

if TYPE_CHECKING:
    from launchpad.launch.controller import Controller  # which runs beside the observer

SAMPLE_INTERVAL = 1.0
HISTORY = 600  # samples kept for the plots: ten minutes at one a second

_ANSWER_GRACE = 1.0  # seconds calls in flight get to finish when the program has ended

SERVED = ('describe', 'view', 'history', 'sample', 'logs', 'stop', 'series', 'failures', 'probe',
          'waits')
# Seconds a probe waits for live answers before it reports a node from its last sample.
LIVE_TIMEOUT = 0.5


class Observer:
    """One launched program as others see it (see the module docstring).

    Attributes:
      id: the program's id in the registry.
      entry: its registry entry, or None if it could not be registered.
      dashboard_url: the dashboard's URL (with its token), once `open_dashboard` ran.
    """

    def __init__(self, program: Program, controller: Controller, *,
                 interval: float = SAMPLE_INTERVAL, tensorboard_dir: Optional[str] = None,
                 program_id: Optional[str] = None, served: Optional[Dict[str, Any]] = None,
                 entry_fields: Optional[Dict[str, Any]] = None,
                 runs_dir: Optional[pathlib.Path] = None):
        """`program_id`: its id in the registry (default: a new one; a detached program's
        supervisor keeps it across supervisors); `served`: more methods to serve beside
        `SERVED`, name -> callable; `entry_fields`: registry entry fields to set (a detached
        program's control, keeper and launch time: `launchpad.launch.supervisor`); `runs_dir`:
        where its run directory goes (default: `runstore.runs_directory()`)."""
        self.id = program_id or registry.new_id(program.name)
        self._served = {name: getattr(self, name) for name in SERVED}
        self._served.update(served or {})
        self._entry_fields = dict(entry_fields or {})
        self.entry: Optional[registry.Entry] = None
        self.dashboard_url: Optional[str] = None
        self._program = program.name
        self._controller = controller
        self._interval = interval
        self._graph = figures.Graph.of(program, controller.status())
        self._started = time.time()
        self._lock = threading.Lock()
        self._totals: Optional[figures.Totals] = None
        self._view: Dict[str, Any] = {}
        self._sample: Dict[str, Any] = {}
        self._history: collections.deque = collections.deque(maxlen=HISTORY)
        self._sequence = 0
        self._ended_at: Dict[str, float] = {}
        self._server: Optional[courier.Server] = None
        self._dashboard = None
        self._closed = threading.Event()
        self._finishing = threading.Lock()
        self._finished = False
        self._stopped_by: Optional[str] = None  # who asked `stop`, if anyone did
        self._usage = usage.UsageRates()
        self._tensorboard_dir = tensorboard_dir
        self._recorder: Optional[recorder.Recorder] = None  # its run directory, once started
        self._runs_dir = runs_dir
        self._refresh()

    def start(self) -> 'Observer':
        """Registers the program (a warning if it cannot be) and starts sampling it."""
        try:
            self._register()
        except (registry.RegistryError, OSError) as e:
            logging.warning('Program %r is not registered, so `python -m launchpad.launch` '
                            'cannot see it: %s', self._program, e)
        self._recorder = recorder.Recorder(self.describe(), self._tensorboard_dir,
                                           self._runs_dir)
        threading.Thread(target=self._loop, daemon=True, name=f'lp-observe-{self.id}').start()
        return self

    def _register(self) -> None:
        # The entry first: a launcher killed before its server is up leaves an entry of a dead
        # process, which readers prune (with the socket), never a socket nobody knows of.
        token = secrets.token_hex(16)
        entry = registry.Entry(**{
            'id': self.id, 'name': self._program, 'launch_type': self._controller.launch_type,
            'address': f'unix:{registry.socket_path(self.id)}', 'token': token,
            'nodes': len(self._graph.nodes), 'started': self._started,
            'node_token': self._controller.auth_token, **self._entry_fields})
        registry.register(entry)
        try:
            server = courier.Server(address=entry.address, auth_token=token, thread_pool_size=8)
            for name, method in self._served.items():
                server.Bind(name, method)
            server.Start()
        except BaseException:
            registry.unregister(self.id)
            raise
        self._server, self.entry = server, entry

    def _loop(self) -> None:
        next_sample = time.monotonic() + self._interval
        while not (self._controller.done or self._closed.is_set() or self._finished):
            time.sleep(min(0.1, max(0.0, next_sample - time.monotonic())))
            if time.monotonic() >= next_sample and not self._finished:
                try:
                    self._refresh()
                except Exception:  # pylint: disable=broad-except  (the next one may do)
                    logging.exception('The observer of %r failed to take a sample.',
                                      self._program)
                next_sample += self._interval
        self._finish(ended=self._controller.done)

    def program_ended(self) -> None:
        """Takes the last sample and unregisters the program; the controller calls this when
        the program has ended (before its `wait` returns), so that no entry outlives it."""
        self._finish(ended=True)

    def _finish(self, ended: bool) -> None:
        with self._finishing:
            if self._finished:
                return
            self._finished = True
            try:
                self._refresh(ended=ended)
            except Exception:  # pylint: disable=broad-except
                logging.exception('The observer of %r failed to take its last sample.',
                                  self._program)
            finally:
                if self._recorder is not None:
                    self._recorder.close()
                if self.entry is not None:
                    registry.unregister(self.id)
                if self._server is not None:  # calls in flight (an attached `wait`) get answers
                    self._server.Stop(grace=_ANSWER_GRACE)
                if self._stopped_by is not None and ended:
                    print(f'Program {self._program!r} has stopped; '
                          f'{how_nodes_ended(self._controller.status())}.', file=sys.stderr,
                          flush=True)

    def _refresh(self, ended: bool = False) -> None:
        """Takes one sample of the program."""
        coordinator = self._controller.coordinator
        status = coordinator.status()
        reported = coordinator.metrics()
        reports = list(reported.values()) + [metrics.snapshot(self._program)]
        ignored = [self._server.address] if self._server is not None else []
        merged = figures.merge(reports, self._graph, self._program, ignored)
        now = time.time()
        for name, node in status.items():
            if node.state.ended:
                self._ended_at.setdefault(name, now)
        with self._lock:
            totals = figures.totals(merged, now, self._totals)
            rows = figures.node_rows(status, totals, self._ended_at)
            used = self._usage.update(reported)
            for row in rows:
                row.update(used.get(row['name'], dict.fromkeys(usage.USAGE)))
            edges = figures.edge_rows(self._graph, totals)
            self._totals = totals
            if not self._history or now - self._history[-1]['time'] > 0.5 * self._interval:
                self._sequence += 1
                self._history.append({'seq': self._sequence, 'time': now,
                                      'values': figures.plotted(rows, merged['values'])})
            self._view = {'time': now, 'ended': ended or self._controller.done,
                          'stop_reason': coordinator.stop_reason, 'nodes': rows, 'edges': edges}
            self._sample = {'time': now, 'program': self._program, 'nodes': rows, **merged}
            recorded = {**self._view, 'values': merged['values']}
        if self._recorder is not None:
            self._recorder.record({**recorded, 'failures': coordinator.failures(),
                                   'scaling': list(self._controller.scaling_log)})

    # What is served (and what an in-process dashboard calls).

    def describe(self) -> Dict[str, Any]:
        """The program: id, name, launch type, launcher host and pid, start time, node names,
        the graph's edges (caller, callee), the dashboard's URL if there is one and its run
        directory (`runstore`; None until it is made, or if it could not be)."""
        entry = self.entry
        return {'id': self.id, 'name': self._program,
                'launch_type': self._controller.launch_type,
                'host': entry.host if entry else None, 'pid': entry.pid if entry else None,
                'started': self._started, 'nodes': list(self._graph.nodes),
                'edges': [list(edge) for edge in self._graph.edges],
                'dashboard': self.dashboard_url,
                'run_dir': str(self._recorder.run_dir) if self._recorder and
                self._recorder.run_dir else None}

    def view(self) -> Dict[str, Any]:
        """The latest sample: time, ended, stop_reason, a row per node (`figures.node_rows`) and
        per edge (`figures.edge_rows`)."""
        with self._lock:
            return dict(self._view)

    def history(self, since: int = 0) -> Dict[str, Any]:
        """Plot points taken after sample number `since`: {'next': the latest number,
        'samples': [{'seq', 'time', 'values': {metric: {node: value}}}]}."""
        with self._lock:
            return {'next': self._sequence,
                    'samples': [s for s in self._history if s['seq'] > since]}

    def sample(self) -> Dict[str, Any]:
        """The latest sample's raw numbers: node rows, the courier tables of servers and clients
        (cumulative, per method) and the reported values (`figures.merge`)."""
        with self._lock:
            return dict(self._sample)

    def series(self, start: Optional[float] = None, end: Optional[float] = None,
               points: int = 600) -> Dict[str, Any]:
        """Every metric of the whole run so far, from its run directory (`runstore.read_series`:
        between `start` and `end`, at most about `points` points a series, 0: all)."""
        return self._stored(runstore.read_series, start, end, points)

    def failures(self, node: Optional[str] = None) -> List[Dict[str, Any]]:
        """The failures of the nodes (of `node` only, if given), with their tracebacks, as
        kept in the run directory (`runstore.read_failures`)."""
        return self._stored(runstore.read_failures, node)

    def _stored(self, function, *args) -> Any:
        if self._recorder is None:
            raise LookupError(f'program {self._program!r} keeps no history (it is not observed '
                              f'from its launching process).')
        return self._recorder.read(function, *args)

    def logs(self, node: Optional[str] = None,
             cursor: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
        """Lines nodes printed: {'lines': [[node, line], ...], 'cursor': {node: position}}.

        Args:
          node: one node's name (default: every node's, node after node).
          cursor: the 'cursor' of the previous call, for the lines printed since (None: the last
            lines kept).

        Raises:
          LookupError: no such node, or its output is not kept here (the message says where).
        """
        output = self._controller.output
        names = list(self._graph.nodes)
        if node is not None:
            if node not in names:
                raise LookupError(f'program {self._program!r} has no node {node!r}; its nodes '
                                  f'are {", ".join(names)}.')
            names = [node]
        if output is None:
            raise LookupError(f'program {self._program!r} ({self._controller.launch_type}) '
                              f'keeps no logs of its nodes where it is supervised: their output '
                              f'goes where the platform puts it (threads: the launching '
                              f'process\'s terminal; Kubernetes pods: `kubectl logs`, or give '
                              f'its coordinator pod a service account, create_rbac=True).')
        lines: List[List[str]] = []
        positions = dict(cursor or {})
        for name in names:
            read, positions[name] = output.read_log(name, (cursor or {}).get(name))
            lines.extend([name, line] for line in read)
        return {'lines': lines, 'cursor': positions}

    def stop(self, by: Optional[str] = None) -> None:
        """Stops the program (returns at once). `by` says who asks (the CLI sends its user,
        pids and host); the launching process prints it, and how the nodes ended once they
        have, so that a program stopped from another shell does not end without a word."""
        who = by or 'a client of its observer'
        with self._lock:
            first = self._stopped_by is None and not self._controller.coordinator.stopping
            self._stopped_by = self._stopped_by or who
        if first:
            print(f'\nStopping program {self._program!r}: asked by {who}.', file=sys.stderr,
                  flush=True)
        self._controller.coordinator.request_stop(f'stopped by {who}')

    def probe(self, kinds: List[str], node: Optional[str] = None,
              timeout: float = LIVE_TIMEOUT) -> Dict[str, Any]:
        """Asks the nodes (or `node`) live for `kinds` (of `probe.KINDS`: stacks, calls,
        process). Returns {'nodes': {name: its answer (`probe.answer`), with 'state'},
        'in_process': the running nodes that are threads of this process (their answer is
        'process'), 'process': this process's own answer if there are any}. A node that did
        not answer within `timeout` gets what is known without it
        (`launchpad.process.probe_broker`); one that is not running, {'live': False, 'state'}.

        Raises:
          LookupError: no such node, or the launcher cannot reach its nodes (the message says
            why).
        """
        coordinator = self._controller.coordinator
        status = coordinator.status()
        names = list(status)
        if node is not None:
            if node not in status:
                raise LookupError(f'program {self._program!r} has no node {node!r}; its nodes '
                                  f'are {", ".join(names)}.')
            names = [node]
        running = [name for name in names if status[name].state.value == 'running']
        here = [name for name in running  # (in a container, another host's pid 1 is not ours)
                if (status[name].pid, status[name].host) == (os.getpid(), socket.gethostname())]
        elsewhere = [name for name in running if name not in here]
        try:
            answers = coordinator.probe(elsewhere, kinds, timeout) if elsewhere else {}
        except (AttributeError, courier.UnknownMethodError):
            raise LookupError(f'the {self._controller.launch_type} launcher cannot ask its '
                              f'nodes (its coordinator runs elsewhere and knows no probes).'
                              ) from None
        for name in elsewhere if node_probe.STACKS in kinds else ():
            self._dump_if_stuck(answers[name], status[name])
        for name in here:  # answered by 'process', which holds their threads
            answers[name] = {'live': True, 'in_process': True, 'pid': os.getpid()}
        for name in names:
            answers.setdefault(name, {'live': False, 'silent': None})['state'] = (
                status[name].state.value)
        return {'nodes': answers, 'in_process': here,
                'process': node_probe.answer(kinds) if here else None}

    @staticmethod
    def _dump_if_stuck(answer: Dict[str, Any], status: Any) -> None:
        """Adds 'dumped', the current stacks of a stuck node process of this host, written by
        its fault handler (`probe.dump_stuck`), to its `answer`."""
        dump = answer.get('dump')
        if (answer.get('live') or not dump or (answer.get('silent') or 0) < node_probe.STUCK_AFTER
                or dump[0] != status.pid or status.host != socket.gethostname()):
            return  # (a pid of another host, or of an earlier process, is not signalled)
        answer['dumped'] = node_probe.dump_stuck(*dump)

    def waits(self, timeout: float = LIVE_TIMEOUT) -> Dict[str, Any]:
        """The calls in flight between the nodes now, what each node serves now and the
        deadlocks (`waits.calls_in_flight`), with 'silent': the running nodes that did not
        answer (their calls are missing)."""
        probed = self.probe([node_probe.CALLS], timeout=timeout)
        answers = {name: answer.get(node_probe.CALLS)
                   for name, answer in probed['nodes'].items()}
        if probed['process'] is not None:
            answers[''] = probed['process'][node_probe.CALLS]
        with self._lock:
            serving = {table['address']: table['node']
                       for table in self._sample.get('servers', ())}

        def node_of(owner: Any, answerer: str) -> Optional[str]:
            if owner and owner[0] == self._program:
                return self._graph.executable_of(owner[1]) or owner[1]
            return answerer or None

        result = waits_of.calls_in_flight(answers, node_of, serving)
        result['silent'] = sorted(name for name, answer in probed['nodes'].items()
                                  if answer['state'] == 'running' and not answer.get('live'))
        return result

    # In the launching process only.

    def open_dashboard(self, port: int = 0) -> str:
        """Serves the dashboard on 127.0.0.1:`port` (0: any free port); returns its URL."""
        from launchpad.observe import dashboard  # pylint: disable=import-outside-toplevel
        if self._dashboard is None:
            self._dashboard = dashboard.Dashboard(self, port=port)
            self.dashboard_url = self._dashboard.url
            if self.entry is not None:
                self.entry.dashboard = self.dashboard_url
                registry.register(self.entry)
        return self.dashboard_url

    def close(self) -> None:
        """Closes the dashboard and, if the program still runs, unregisters it (it keeps
        running, unseen)."""
        self._closed.set()
        if self._dashboard is not None:
            self._dashboard.close()
            self._dashboard = None
        if self._recorder is not None and self._finished:
            self._recorder.close()  # what the dashboard read from the run file


def how_nodes_ended(status: Dict[str, Any], named: int = 10) -> str:
    """'its 3 nodes ended: 2 finished, 1 killed (producer/1)': how many ended in each state,
    naming those that did not finish (the first `named` of each state)."""
    by_state: Dict[str, List[str]] = {}
    for name, node in status.items():
        by_state.setdefault(node.state.value, []).append(name)
    parts = []
    for state, names in by_state.items():
        listed = '' if state == 'finished' else ' (' + ', '.join(names[:named]) + (
            ', ...' if len(names) > named else '') + ')'
        parts.append(f'{len(names)} {state}{listed}')
    return f'its {len(status)} node{"s" * (len(status) != 1)} ended: {", ".join(parts)}'


def check_dashboard_option(dashboard: Union[bool, int]) -> Optional[int]:
    """The port `lp.launch(dashboard=...)` asks for (None: no dashboard); raises a clear error
    for a bad value or a missing extra, before anything is launched."""
    if dashboard is False or dashboard is None:
        return None
    if dashboard is True:
        port = 0
    elif isinstance(dashboard, int) and 0 < dashboard < 65536:
        port = dashboard
    else:
        raise ValueError(f'dashboard= takes True (any free port) or a port number, got '
                         f'{dashboard!r}.')
    from launchpad.observe import dashboard as module  # pylint: disable=import-outside-toplevel
    module.require()
    return port


def observe(program: Program, controller: Controller, dashboard_port: Optional[int] = None,
            tensorboard_dir: Optional[str] = None,
            program_id: Optional[str] = None) -> Optional[Observer]:
    """Registers a launched program (as `program_id`, default: a new id), keeps its history in
    its run directory (and TensorBoard's `tensorboard_dir`) and, if asked, serves its dashboard
    (`lp.launch` calls this); None for programs that do not run from this process (detached)."""
    if controller.detached:
        return None
    observer = Observer(program, controller, tensorboard_dir=tensorboard_dir,
                        program_id=program_id).start()
    if dashboard_port is not None:
        url = observer.open_dashboard(dashboard_port)
        print(f'Dashboard of {program.name!r}: {url}', file=sys.stderr, flush=True)
    return observer
