// The dashboard page of a launchpad program: polls the dashboard server's /api once a second
// and draws, with plain SVG, the program graph (nodes coloured by state, arrows from caller to
// callee sized and labelled by calls/s), a table of nodes, plots of the metrics over time and
// a node's log. No library, nothing fetched from elsewhere.
'use strict';
(function () {
  const TOKEN = new URLSearchParams(location.search).get('token') || '';
  const SVG = 'http://www.w3.org/2000/svg';
  // launchpad.NodeState's values: restarting (failed, about to start again) and dropped
  // (failed for good, the program goes on) come from restart policies.
  const STATES = ['pending', 'running', 'restarting', 'finished', 'failed', 'dropped', 'killed'];
  const STATE_COLORS = {pending: '#b8bec8', running: '#3aa55d', restarting: '#d9b526',
                        finished: '#4a78c2', failed: '#d63c3c', dropped: '#8a5c7a',
                        killed: '#e08a2c'};
  const PALETTE = ['#4a78c2', '#d63c3c', '#3aa55d', '#e08a2c', '#8a5cc2', '#2aa5a5', '#c25c9a',
                   '#7a8a2c', '#5c6b80', '#b5651d'];
  const MAX_LOG_LINES = 1000;
  const POLL_MS = 1000;

  let program = null;      // /api/describe
  let view = null;         // /api/view
  const series = {};       // metric -> {kind, nodes: {node -> [[time, value], ...]}}
  let lastTime = 0;        // the newest time in `series`
  let zoom = null;         // [start, end] shown, or null: the whole run, growing
  let smoothing = 0;       // 0 .. 0.99
  let selected = null;     // the node whose log is shown
  let logCursor = null;
  let logLines = [];
  let failureCount = -1;   // of the selected node, as drawn
  let waits = null;        // /api/waits while its panel is open: drawn over the graph

  async function get(path, params) {
    const query = new URLSearchParams(params || {}).toString();
    const response = await fetch(path + (query ? '?' + query : ''),
                                 {headers: {'X-Launchpad-Token': TOKEN}, cache: 'no-store'});
    let body;
    try { body = await response.json(); } catch (e) { body = {error: response.statusText}; }
    if (!response.ok) { const error = new Error(body.error || response.statusText); error.status = response.status; throw error; }
    return body;
  }

  function svg(tag, attributes, parent) {
    const element = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attributes || {})) element.setAttribute(key, value);
    if (parent) parent.appendChild(element);
    return element;
  }

  function html(tag, attributes, text, parent) {
    const element = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) element.setAttribute(key, value);
    if (text !== undefined && text !== null) element.textContent = text;
    if (parent) parent.appendChild(element);
    return element;
  }

  function groupOf(name) { return name.split('/')[0]; }

  function formatRate(value) {
    if (!value) return '0';
    if (value >= 1000) return (value / 1000).toFixed(1) + 'k';
    return value >= 10 ? value.toFixed(0) : value.toFixed(1);
  }

  function formatNumber(value) {
    if (value === null || value === undefined || !isFinite(value)) return String(value);
    const size = Math.abs(value);
    if (size >= 1e6 || (size > 0 && size < 1e-3)) return value.toExponential(2);
    return Number(value.toPrecision(4)).toString();
  }

  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined) return '';
    seconds = Math.floor(seconds);
    const h = Math.floor(seconds / 3600), m = Math.floor(seconds / 60) % 60, s = seconds % 60;
    return h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
  }

  // ---- The graph ------------------------------------------------------------------------

  // Columns of groups: a group is placed right of every group calling it (longest path over
  // the group graph without its back edges), so calls flow left to right.
  function groupColumns(nodes, edges) {
    const groups = [];
    for (const name of nodes) if (!groups.includes(groupOf(name))) groups.push(groupOf(name));
    const calls = {};
    for (const g of groups) calls[g] = [];
    for (const [caller, callee] of edges) {
      const a = groupOf(caller), b = groupOf(callee);
      if (a !== b && calls[a] && calls[b] && !calls[a].includes(b)) calls[a].push(b);
    }
    const forward = [], state = {};
    function visit(g) {
      state[g] = 1;
      for (const h of calls[g]) {
        if (state[h] === 1) continue;  // a back edge: ignored for placement
        forward.push([g, h]);
        if (!state[h]) visit(h);
      }
      state[g] = 2;
    }
    for (const g of groups) if (!state[g]) visit(g);
    const column = {};
    for (const g of groups) column[g] = 0;
    for (let round = 0; round < groups.length; round++) {
      for (const [a, b] of forward) column[b] = Math.max(column[b], column[a] + 1);
    }
    return {groups, column};
  }

  function layout(nodes, edges) {
    const {groups, column} = groupColumns(nodes, edges);
    const members = {};
    for (const g of groups) members[g] = nodes.filter((name) => groupOf(name) === g);
    const columns = [];
    for (const g of groups) (columns[column[g]] = columns[column[g]] || []).push(g);
    const boxes = {}, frames = [];
    let x = 10;
    for (const inColumn of columns) {
      if (!inColumn) continue;
      let y = 10, columnWidth = 0;
      for (const g of inColumn) {
        const count = members[g].length;
        const perColumn = 10;
        const sub = Math.ceil(count / perColumn);
        const width = count > perColumn ? 84 : 120, height = count > perColumn ? 20 : 28;
        const rows = Math.min(count, perColumn);
        const frame = {group: g, x, y, width: sub * (width + 8) + 12, height: rows * (height + 8) + 28};
        members[g].forEach((name, i) => {
          boxes[name] = {x: x + 10 + Math.floor(i / perColumn) * (width + 8),
                         y: y + 24 + (i % perColumn) * (height + 8), width, height};
        });
        frames.push(frame);
        y += frame.height + 14;
        columnWidth = Math.max(columnWidth, frame.width);
      }
      x += columnWidth + 110;
    }
    const width = Math.max(200, x - 100), height = Math.max(120, ...frames.map((f) => f.y + f.height + 10));
    return {boxes, frames, width, height};
  }

  function edgeStyle(edge) {
    const rate = edge ? edge.calls_per_s : 0;
    const width = 1.2 + Math.min(6, Math.log10(1 + rate) * 1.6);
    let color = '#b9bfc9';
    if (edge && edge.errors_per_s > 0) color = '#d63c3c';
    else if (rate > 0) color = `hsl(215, 65%, ${Math.max(28, 58 - Math.log10(1 + rate) * 7)}%)`;
    return {width, color};
  }

  function drawGraph() {
    const root = document.getElementById('graph');
    const nodes = program.nodes;
    const edgeRows = (view && view.edges) || program.edges.map(([source, target]) =>
      ({source, target, calls_per_s: 0, errors_per_s: 0, in_graph: true}));
    const {boxes, frames, width, height} = layout(nodes, edgeRows.map((e) => [e.source, e.target]));
    while (root.firstChild) root.removeChild(root.firstChild);
    root.setAttribute('viewBox', `0 0 ${width} ${height}`);
    root.style.height = Math.min(560, Math.max(200, height)) + 'px';
    const defs = svg('defs', {}, root);
    const marker = svg('marker', {id: 'arrow', viewBox: '0 0 10 10', refX: 9, refY: 5,
                                  markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse',
                                  markerUnits: 'userSpaceOnUse'}, defs);
    svg('path', {d: 'M0,0 L10,5 L0,10 z', fill: '#5c6b80'}, marker);
    for (const frame of frames) {
      svg('rect', {x: frame.x, y: frame.y, width: frame.width, height: frame.height,
                   fill: '#f1f3f6', stroke: '#d8dce3', rx: 8}, root);
      svg('text', {x: frame.x + 10, y: frame.y + 16, class: 'group-label'}, root).textContent = frame.group;
    }
    const states = {};
    for (const row of (view ? view.nodes : [])) states[row.name] = row;
    const labelled = edgeRows.length <= 40;
    for (const edge of edgeRows) {
      const a = boxes[edge.source], b = boxes[edge.target];
      if (!a || !b) continue;
      const style = edgeStyle(edge);
      const x1 = a.x + a.width, y1 = a.y + a.height / 2, x2 = b.x, y2 = b.y + b.height / 2;
      const bend = Math.max(50, Math.abs(x2 - x1) / 2);
      const group = svg('g', {class: 'edge', 'data-source': edge.source, 'data-target': edge.target,
                              'data-calls-per-s': edge.calls_per_s.toFixed(2)}, root);
      svg('path', {d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
                   stroke: style.color, 'stroke-width': style.width,
                   'stroke-dasharray': edge.in_graph ? '' : '4 3', 'marker-end': 'url(#arrow)'}, group);
      const latency = edge.latency_ms === null || edge.latency_ms === undefined ? ''
        : `, ${formatNumber(edge.latency_ms)} ms`;
      svg('title', {}, group).textContent =
        `${edge.source} → ${edge.target}: ${formatRate(edge.calls_per_s)} calls/s${latency}` +
        (edge.errors_per_s ? `, ${formatRate(edge.errors_per_s)} errors/s` : '');
      if (labelled && edge.calls_per_s > 0) {
        // On the curve a third of the way from the caller, where edges have not met yet.
        const t = 0.33, u = 1 - t;
        const lx = u * u * u * x1 + 3 * u * u * t * (x1 + bend) + 3 * u * t * t * (x2 - bend) + t * t * t * x2;
        const ly = u * u * u * y1 + 3 * u * u * t * y1 + 3 * u * t * t * y2 + t * t * t * y2;
        svg('text', {x: lx, y: ly - 5, 'text-anchor': 'middle'}, group)
          .textContent = formatRate(edge.calls_per_s) + '/s';
      }
    }
    for (const name of nodes) {
      const box = boxes[name];
      const state = states[name] ? states[name].state : 'pending';
      const group = svg('g', {class: 'node' + (name === selected ? ' selected' : ''),
                              'data-node': name, 'data-state': state}, root);
      svg('rect', {x: box.x, y: box.y, width: box.width, height: box.height,
                   fill: STATE_COLORS[state] || '#888'}, group);
      const label = name.length > (box.width / 7) ? name.slice(0, Math.floor(box.width / 7) - 1) + '…' : name;
      svg('text', {x: box.x + 8, y: box.y + box.height / 2 + 4}, group).textContent = label;
      const row = states[name];
      svg('title', {}, group).textContent = `${name}: ${state}` +
        (row && row.calls_per_s ? `, serves ${formatRate(row.calls_per_s)} calls/s` : '') +
        (row && row.error ? `\n${row.error}` : '');
      group.addEventListener('click', () => selectNode(name));
    }
    drawWaits(root, boxes);
  }

  // Where the line from (x, y) to the middle of `box` meets the box's border.
  function border(box, x, y) {
    const cx = box.x + box.width / 2, cy = box.y + box.height / 2, dx = x - cx, dy = y - cy;
    const scale = Math.min(box.width / 2 / Math.abs(dx || 1e-9), box.height / 2 / Math.abs(dy || 1e-9));
    return [cx + dx * Math.min(1, scale), cy + dy * Math.min(1, scale)];
  }

  // Who waits on whom (the "calls in flight" button): an arrow from each caller to the node it
  // waits on, bowed so that a -> b and b -> a stay apart; red where the waits form a deadlock.
  function drawWaits(root, boxes) {
    if (!waits) return;
    const locked = new Set();
    for (const cycle of waits.deadlocks) {
      for (const edge of cycle) locked.add(`${edge.caller} ${edge.callee} ${edge.method}`);
    }
    const marker = svg('marker', {id: 'wait-arrow', viewBox: '0 0 10 10', refX: 9, refY: 5,
                                  markerWidth: 9, markerHeight: 9, orient: 'auto-start-reverse',
                                  markerUnits: 'userSpaceOnUse'}, root);
    svg('path', {d: 'M0,0 L10,5 L0,10 z', fill: '#1d2430'}, marker);
    for (const wait of waits.waits) {
      const a = boxes[wait.caller], b = boxes[wait.callee];
      if (!a || !b || a === b) continue;
      const deadlock = locked.has(`${wait.caller} ${wait.callee} ${wait.method}`);
      const ax = a.x + a.width / 2, ay = a.y + a.height / 2, bx = b.x + b.width / 2, by = b.y + b.height / 2;
      const mx = (ax + bx) / 2 + (by - ay) * 0.3, my = (ay + by) / 2 - (bx - ax) * 0.3;
      const [x1, y1] = border(a, mx, my), [x2, y2] = border(b, mx, my);
      const group = svg('g', {class: 'wait' + (deadlock ? ' deadlock' : ''), 'data-source': wait.caller,
                              'data-target': wait.callee, 'data-method': wait.method}, root);
      svg('path', {d: `M${x1},${y1} Q${mx},${my} ${x2},${y2}`, stroke: deadlock ? '#d63c3c' : '#e08a2c',
                   'stroke-width': 3, 'marker-end': 'url(#wait-arrow)'}, group);
      svg('title', {}, group).textContent = `${wait.caller} waits on ${wait.callee}: ` +
        `${wait.method}, for ${formatDuration(wait.age)}` + (deadlock ? ' (deadlock)' : '');
    }
  }

  function drawLegend() {
    const legend = document.getElementById('legend');
    legend.textContent = '';
    for (const state of STATES) {
      const item = html('span', {}, null, legend);
      html('i', {style: `background:${STATE_COLORS[state]}`}, null, item);
      item.appendChild(document.createTextNode(state));
    }
  }

  // ---- The table ------------------------------------------------------------------------

  function drawTable() {
    const body = document.querySelector('#nodes tbody');
    body.textContent = '';
    for (const row of view.nodes) {
      const tr = html('tr', {'data-node': row.name, 'data-state': row.state}, null, body);
      html('td', {}, row.name, tr);
      html('span', {class: 'state ' + row.state}, row.state, html('td', {}, null, tr));
      html('td', {}, row.host || '', tr);
      html('td', {class: 'number'}, row.pid === null ? '' : row.pid, tr);
      html('td', {class: 'number'}, formatDuration(row.uptime), tr);
      html('td', {class: 'number'}, row.restarts, tr);
      html('td', {}, row.devices || '', tr);
      html('td', {}, row.cores || '', tr);
      html('td', {class: 'number'}, formatRate(row.calls_per_s), tr);
      html('td', {class: 'number'}, formatRate(row.errors_per_s), tr);
      html('td', {class: 'number'}, row.cpu_percent === null || row.cpu_percent === undefined
        ? '' : row.cpu_percent.toFixed(0), tr);
      html('td', {class: 'number'}, row.rss_bytes ? formatValue(row.rss_bytes, 'launchpad_rss_bytes') : '', tr);
      html('td', {class: 'number'}, row.threads || '', tr);
      html('td', {class: 'error'}, row.error || '', tr);
      tr.addEventListener('click', () => selectNode(row.name));
    }
  }

  // ---- The plots ------------------------------------------------------------------------
  // Every metric of the whole run comes from the run's SQLite file (/api/series), then only
  // the rows newer than the last one seen. Counters (lp.count) are drawn as rates; a drag
  // across a plot zooms every plot to that time range, read again at full detail.

  const NAMES = {launchpad_calls_per_s: 'calls served/s', launchpad_errors_per_s: 'errors/s',
                 launchpad_cpu_percent: 'CPU % (100: one core)', launchpad_rss_bytes: 'memory (RSS)',
                 launchpad_threads: 'threads'};
  const FIRST = ['launchpad_calls_per_s', 'launchpad_cpu_percent', 'launchpad_rss_bytes'];
  const MAX_DRAWN = 1000;  // points per line; more are thinned out before drawing

  function metricTitle(name, kind) {
    return NAMES[name] || (kind === 'counter' ? `${name} /s` : name);
  }

  function addSeries(result, replace) {
    if (replace) for (const key of Object.keys(series)) delete series[key];
    for (const line of result.series) {
      const key = line.name;
      const lines = series[key] = series[key] || {kind: line.kind, nodes: {}};
      const points = lines.nodes[line.node] = (replace ? [] : lines.nodes[line.node] || []);
      for (const point of line.points) {
        if (!points.length || point[0] > points[points.length - 1][0]) points.push(point);
      }
      if (points.length) lastTime = Math.max(lastTime, points[points.length - 1][0]);
    }
  }

  // Counters as rates: each step's increase over its time (a restart's drop to 0 counts none).
  function rates(points) {
    const out = [];
    for (let i = 1; i < points.length; i++) {
      const dt = points[i][0] - points[i - 1][0];
      if (dt > 0) out.push([points[i][0], Math.max(0, points[i][1] - points[i - 1][1]) / dt]);
    }
    return out;
  }

  // TensorBoard's smoothing: an exponential moving average, debiased at the start.
  function smooth(points, weight) {
    if (!weight) return points;
    let last = 0, n = 0;
    return points.map(([t, v]) => {
      if (!isFinite(v)) return [t, v];
      last = last * weight + (1 - weight) * v;
      n++;
      return [t, last / (1 - Math.pow(weight, n))];
    });
  }

  function thin(points) {
    if (points.length <= MAX_DRAWN) return points;
    const step = points.length / MAX_DRAWN, out = [];
    for (let i = 0; i < MAX_DRAWN; i++) out.push(points[Math.floor(i * step)]);
    out.push(points[points.length - 1]);
    return out;
  }

  function niceStep(span, count) {
    const raw = span / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
    const fraction = raw / power;
    return (fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 5 ? 5 : 10) * power;
  }

  function valueTicks(v0, v1, count) {
    const step = niceStep(v1 - v0, count), ticks = [];
    for (let v = Math.ceil(v0 / step) * step; v <= v1 + step * 1e-9; v += step) ticks.push(v);
    return ticks;
  }

  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                      21600, 43200, 86400];
  function timeTicks(t0, t1, count) {  // in seconds since the program started
    const step = TIME_STEPS.find((s) => (t1 - t0) / s <= count) || 86400 * Math.ceil((t1 - t0) / count / 86400);
    const ticks = [];
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push(t);
    return ticks;
  }

  function formatElapsed(seconds) {
    seconds = Math.round(seconds);
    const h = Math.floor(seconds / 3600), m = Math.floor(seconds / 60) % 60, s = seconds % 60;
    const pad = (n) => String(n).padStart(2, '0');
    return h ? `${h}:${pad(m)}:${pad(s)}` : `${m}:${pad(s)}`;
  }

  function formatValue(value, name) {
    if (name === 'launchpad_rss_bytes') {
      const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
      let i = 0;
      while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i++; }
      return `${Number(value.toPrecision(3))} ${units[i]}`;
    }
    return formatNumber(value);
  }

  function drawPlot(metric, t0, t1) {
    const container = document.getElementById('plots');
    const kind = series[metric].kind;
    let plot = container.querySelector(`.plot[data-metric="${CSS.escape(metric)}"]`);
    if (!plot) {
      plot = html('div', {class: 'plot', 'data-metric': metric, 'data-kind': kind}, null, container);
      html('h3', {}, metricTitle(metric, kind), plot);
      const chart = svg('svg', {}, plot);
      html('div', {class: 'keys'}, null, plot);
      listenForZoom(chart);
    }
    const chart = plot.querySelector('svg');
    const width = Math.max(200, chart.clientWidth || 300), height = 170;
    chart.setAttribute('viewBox', `0 0 ${width} ${height}`);
    while (chart.firstChild) chart.removeChild(chart.firstChild);
    const started = program.started;
    const lines = Object.entries(series[metric].nodes).sort().map(([node, points]) => {
      let shown = kind === 'counter' ? rates(points) : points;
      shown = shown.filter((p) => p[0] >= t0 && p[0] <= t1 && isFinite(p[1]));
      return [node, smooth(thin(shown), smoothing)];
    });
    const values = lines.flatMap(([, points]) => points.map((p) => p[1]));
    let v0 = Math.min(0, ...values), v1 = Math.max(...values, v0);
    // Memory ticks fall on round numbers of its unit (MiB, GiB), not of bytes.
    const unit = metric === 'launchpad_rss_bytes'
      ? Math.pow(1024, Math.max(0, Math.floor(Math.log(Math.max(v1, 1)) / Math.log(1024)))) : 1;
    if (!(v1 > v0)) v1 = v0 + unit;
    const yTicks = valueTicks(v0 / unit, v1 / unit, 4).map((v) => v * unit);
    v1 = Math.max(v1, yTicks[yTicks.length - 1]);
    const left = 56, right = width - 8, top = 8, bottom = height - 22;
    const x = (t) => left + (t - t0) / Math.max(t1 - t0, 1e-9) * (right - left);
    const y = (v) => bottom - (v - v0) / (v1 - v0) * (bottom - top);
    chart.plotArea = {left, right, t0, t1};
    for (const v of yTicks) {
      svg('line', {x1: left, y1: y(v), x2: right, y2: y(v), class: 'grid'}, chart);
      svg('text', {x: left - 4, y: y(v) + 3, class: 'axis', 'text-anchor': 'end'}, chart)
        .textContent = formatValue(v, metric);
    }
    for (const t of timeTicks(t0 - started, t1 - started, Math.max(2, Math.floor(width / 80)))) {
      svg('line', {x1: x(t + started), y1: bottom, x2: x(t + started), y2: bottom + 4, class: 'tick'}, chart);
      svg('text', {x: x(t + started), y: height - 6, class: 'axis', 'text-anchor': 'middle'}, chart)
        .textContent = formatElapsed(t);
    }
    svg('line', {x1: left, y1: bottom, x2: right, y2: bottom, class: 'frame'}, chart);
    svg('line', {x1: left, y1: top, x2: left, y2: bottom, class: 'frame'}, chart);
    const keys = plot.querySelector('.keys');
    keys.textContent = '';
    let count = 0;
    lines.forEach(([node, points], i) => {
      const color = PALETTE[i % PALETTE.length];
      count = Math.max(count, points.length);
      svg('polyline', {points: points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' '),
                       fill: 'none', stroke: color, 'stroke-width': 1.5, 'data-node': node}, chart);
      const last = points.length ? formatValue(points[points.length - 1][1], metric) : '';
      html('span', {style: `color:${color}`}, `${node} ${last}`, keys);
    });
    plot.setAttribute('data-points', count);
  }

  function drawPlots() {
    const metrics = Object.keys(series).sort((a, b) => {
      const ia = FIRST.indexOf(a), ib = FIRST.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || a.localeCompare(b);
    });
    const [t0, t1] = zoom || [program.started, Math.max(lastTime, program.started + 1)];
    document.getElementById('range').textContent = zoom
      ? `${formatElapsed(t0 - program.started)} to ${formatElapsed(t1 - program.started)} (zoomed)`
      : `the whole run, 0:00 to ${formatElapsed(t1 - program.started)}`;
    document.getElementById('whole-run').hidden = !zoom;
    for (const metric of metrics) drawPlot(metric, t0, t1);
  }

  function listenForZoom(chart) {
    let from = null, band = null;
    const timeAt = (event) => {
      const area = chart.plotArea, box = chart.getBoundingClientRect();
      const px = (event.clientX - box.left) * (chart.viewBox.baseVal.width / box.width);
      const f = Math.min(1, Math.max(0, (px - area.left) / (area.right - area.left)));
      return {t: area.t0 + f * (area.t1 - area.t0), px: Math.min(area.right, Math.max(area.left, px))};
    };
    chart.addEventListener('mousedown', (event) => {
      from = timeAt(event);
      band = svg('rect', {x: from.px, y: 0, width: 0, height: 170, class: 'zoom-band'}, chart);
      event.preventDefault();
    });
    chart.addEventListener('mousemove', (event) => {
      if (!band) return;
      const to = timeAt(event);
      band.setAttribute('x', Math.min(from.px, to.px));
      band.setAttribute('width', Math.abs(to.px - from.px));
    });
    chart.addEventListener('mouseup', (event) => {
      if (!band) return;
      const to = timeAt(event);
      band = null;
      if (Math.abs(to.t - from.t) > 0.5) zoomTo(Math.min(from.t, to.t), Math.max(from.t, to.t));
      else drawPlots();
    });
    chart.addEventListener('dblclick', () => zoomTo(null));
  }

  async function zoomTo(t0, t1) {
    zoom = t0 === null ? null : [t0, t1];
    try {
      const params = zoom ? {start: t0, end: t1, points: 800} : {points: 400};
      addSeries(await get('/api/series', params), true);
    } catch (error) {
      banner('cannot read the run: ' + error.message);
    }
    drawPlots();
  }

  async function pollSeries() {
    if (zoom) return;  // a zoomed range stays as read
    // Reported values are stored at the time they were reported, which the launching process
    // learns up to a couple of seconds later: read again the last seconds (`addSeries` keeps
    // only the points newer than a line's last).
    const params = lastTime > 0 ? {start: lastTime - 10, points: 0} : {points: 400};
    addSeries(await get('/api/series', params), false);
  }

  // ---- The log --------------------------------------------------------------------------

  function selectNode(name) {
    if (selected === name) return;
    selected = name;
    logCursor = null;
    logLines = [];
    failureCount = -1;
    document.getElementById('log').textContent = '';
    document.getElementById('log-node').value = name;
    document.getElementById('failures').textContent = '';
    drawGraph();
    pollLog();
    pollFailures();
  }

  // The selected node's failures, each with its traceback, from the run's SQLite file.
  async function pollFailures() {
    if (!selected) return;
    const asked = selected;
    let failures;
    try {
      failures = await get('/api/failures', {node: asked});
    } catch (error) {
      return;
    }
    if (asked !== selected || failures.length === failureCount) return;
    failureCount = failures.length;
    const list = document.getElementById('failures');
    list.textContent = '';
    if (!failures.length) {
      html('p', {class: 'none'}, `${asked} has not failed.`, list);
      return;
    }
    failures.forEach((failure, i) => {
      const item = html('details', {class: 'failure', 'data-node': failure.node}, null, list);
      if (i === failures.length - 1) item.open = true;
      html('summary', {}, `failure ${failure.attempt} at ` +
        `${formatElapsed(failure.time - program.started)}: ${failure.message}`, item);
      html('pre', {}, failure.traceback || '(no traceback: it ended without raising in Python)', item);
    });
  }

  async function pollLog() {
    if (!selected) return;
    const asked = selected;
    const log = document.getElementById('log');
    try {
      const params = {node: asked};
      if (logCursor) params.cursor = JSON.stringify(logCursor);
      const result = await get('/api/logs', params);
      if (asked !== selected) return;
      logCursor = result.cursor;
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      logLines = logLines.concat(result.lines.map(([, line]) => line)).slice(-MAX_LOG_LINES);
      log.textContent = logLines.length ? logLines.join('\n') : `(${asked} has printed nothing yet)`;
      if (atBottom) log.scrollTop = log.scrollHeight;
    } catch (error) {
      if (asked === selected && error.status === 404) log.textContent = error.message;
    }
  }

  // ---- Inside the nodes: stacks and calls in flight, live, on a click ---------------------

  async function showInside(title, path, params) {
    const panel = document.getElementById('inside-panel');
    const text = document.getElementById('inside');
    panel.hidden = false;
    document.getElementById('inside-title').textContent = title;
    text.textContent = '(asking the nodes...)';
    waits = null;
    try {
      const answer = await get(path, params);
      text.textContent = answer.text;
      if (path === '/api/waits') waits = answer;
    } catch (error) {
      text.textContent = error.message;
    }
    drawGraph();
  }

  // While the calls in flight are shown, they are asked for again every poll.
  async function pollWaits() {
    if (!waits) return;
    const answer = await get('/api/waits');
    if (waits) {
      waits = answer;
      document.getElementById('inside').textContent = answer.text;
    }
  }

  // ---- Polling --------------------------------------------------------------------------

  function banner(text) {
    const element = document.getElementById('banner');
    element.hidden = !text;
    element.textContent = text || '';
  }

  async function start() {
    try {
      program = await get('/api/describe');
    } catch (error) {
      banner('cannot reach the program: ' + error.message);
      setTimeout(start, 2 * POLL_MS);
      return;
    }
    document.title = `${program.name} - launchpad`;
    document.getElementById('title').textContent = program.name;
    document.getElementById('subtitle').textContent =
      `${program.launch_type} · ${program.id} · ${program.nodes.length} nodes` +
      (program.host ? ` · launched on ${program.host} (pid ${program.pid})` : '');
    const choice = document.getElementById('log-node');
    for (const name of program.nodes) html('option', {value: name}, name, choice);
    choice.addEventListener('change', () => selectNode(choice.value));
    document.getElementById('show-stacks').addEventListener('click', () =>
      showInside(`Stacks of ${selected}, live`, '/api/stacks', {node: selected}));
    document.getElementById('show-waits').addEventListener('click', () =>
      showInside('Calls in flight between nodes, oldest first (on the graph: who waits on whom, ' +
                 'red where they deadlock)', '/api/waits', {}));
    drawLegend();
    drawGraph();
    const slider = document.getElementById('smoothing');
    slider.addEventListener('input', () => {
      smoothing = Number(slider.value);
      document.getElementById('smoothing-value').textContent = smoothing.toFixed(2);
      drawPlots();
    });
    document.getElementById('whole-run').addEventListener('click', () => zoomTo(null));
    selectNode(program.nodes[0]);
    await zoomTo(null);
    tick();
  }

  async function tick() {
    try {
      view = await get('/api/view');
      await pollWaits();
      let unread = '';
      try {
        await pollSeries();
      } catch (error) {  // the rest of the page still shows the program
        unread = 'cannot read the run\'s metrics: ' + error.message;
      }
      drawGraph();
      drawTable();
      drawPlots();
      banner(view.ended ? `program ended${view.stop_reason ? ': ' + view.stop_reason : ''}` : unread);
      await pollLog();
      await pollFailures();
    } catch (error) {
      banner('disconnected: ' + error.message);
    }
    setTimeout(tick, POLL_MS);
  }

  start();
})();
