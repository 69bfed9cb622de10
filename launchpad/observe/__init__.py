"""Seeing a running program from outside it: a registry of running programs, node metrics, a
command line and a web dashboard.

Which module runs where:

    report.py      every node: `lp.report` / `lp.count`, and sending the node's numbers (its
                   courier call counts included) to the coordinator
    figures.py     the launching process: raw numbers -> rows, edge rates, plot points
    observer.py    the launching process: one per program; registers it, samples it, serves
                   its view to the CLI and dashboards
    registry.py    the launching process and the CLI: the user's private directory of running
                   programs
    usage.py       the launching process: CPU % and memory per node from their reports
    recorder.py    the launching process: writes each sample off the sampling thread to
    runstore.py    the run directory's SQLite file (read back by the CLI and dashboards) and
    tensorboard.py TensorBoard event files (`tensorboard_dir=`, needs tensorboardX)
    prometheus.py  wherever a dashboard serves /metrics (needs prometheus_client)
    dashboard.py   the launching process (`lp.launch(..., dashboard=True)`) or the CLI's
                   (`dashboard PROGRAM`): the web page and its API (needs aiohttp)
    cli.py         `python -m launchpad.launch list|status|logs|stop|dashboard|metrics`
    runs_cli.py    `python -m launchpad.launch list --all|sql|forget`, `dashboard` of an ended run
    inspect_cli.py `python -m launchpad.launch stacks|waits|top`, live looks inside the nodes
                   (the nodes answer through `launchpad.process.probe`)
    inspect_text.py, waits.py  the text of stacks and waits; who waits on whom, and deadlocks
    top.py         the live terminal view (curses)
    static/        the page, its script and style
"""
