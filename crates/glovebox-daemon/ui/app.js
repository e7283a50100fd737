// The Glovebox dashboard: one script, no dependencies, only the public API.
//
// Everything that comes from the API (ids, names, file names, command output, terminal
// bytes) is hostile: it reaches the page only as text (textContent, text nodes, SVG
// attributes), never as markup. The Content-Security-Policy forbids inline script besides.
'use strict';

const KEY_SLOT = 'glovebox.key';
const POLL_MS = 1500;
const HISTORY = 60; // samples kept per sparkline
const SVG_NS = 'http://www.w3.org/2000/svg';

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------------------------------
// Small DOM helpers (text only)
// ---------------------------------------------------------------------------------------

/** An element with text content and optional class. */
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

/** A table row of cells: strings become text cells, nodes are put in as they are. */
function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) {
    const td = document.createElement('td');
    if (c instanceof Node) td.appendChild(c);
    else td.textContent = c === undefined || c === null ? '' : String(c);
    tr.appendChild(td);
  }
  return tr;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

/** Replaces a <dl>'s content with [term, value] pairs. */
function facts(dl, pairs) {
  clear(dl);
  for (const [k, v] of pairs) {
    dl.appendChild(el('dt', k));
    dl.appendChild(el('dd', v === undefined || v === null ? '—' : v));
  }
}

/** A polyline of `values` across an SVG's viewBox (scaled to the largest, at least `floor`). */
function drawLine(svg, values, floor) {
  const vb = (svg.getAttribute('viewBox') || '0 0 300 80').split(' ').map(Number);
  clear(svg);
  svg.dataset.points = String(values.length);
  if (values.length === 0) return;
  const vs = values.length === 1 ? [values[0], values[0]] : values;
  const max = Math.max(floor || 0, ...vs) * 1.1 || 1;
  const step = vb[2] / (vs.length - 1);
  const pts = vs.map((v, i) => `${(i * step).toFixed(1)},${(vb[3] - 1 - (v / max) * (vb[3] - 2)).toFixed(1)}`);
  const line = document.createElementNS(SVG_NS, 'polyline');
  line.setAttribute('points', pts.join(' '));
  svg.appendChild(line);
}

function sparkline(values, floor) {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', '0 0 120 24');
  svg.setAttribute('preserveAspectRatio', 'none');
  drawLine(svg, values, floor);
  return svg;
}

function bytes(n) {
  if (typeof n !== 'number') return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function age(iso) {
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
  if (!Number.isFinite(s)) return '—';
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function time(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleTimeString();
}

// ---------------------------------------------------------------------------------------
// The API
// ---------------------------------------------------------------------------------------

const key = () => sessionStorage.getItem(KEY_SLOT);

class ApiError extends Error {
  constructor(status, code, message) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

/** One API call; the parsed JSON (or the Response itself with `raw`). */
async function api(method, path, body, opts = {}) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (opts.accept) headers.Accept = opts.accept;
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (!r.ok) {
    let code, message;
    try {
      const e = (await r.json()).error || {};
      code = e.code;
      message = e.message;
    } catch (_) { /* not JSON */ }
    if (r.status === 401) logout('the key was refused');
    throw new ApiError(r.status, code, message);
  }
  if (opts.raw) return r;
  if (r.status === 204) return null;
  const ct = r.headers.get('content-type') || '';
  return ct.includes('json') ? r.json() : r.text();
}

const sbPath = (id, rest = '') => `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;

// ---------------------------------------------------------------------------------------
// Views and routing (#/, #/sandbox/ID/TAB, #/daemon)
// ---------------------------------------------------------------------------------------

const views = ['login-view', 'list-view', 'sandbox-view', 'daemon-view'];
let timer = null;
let current = null; // the sandbox shown

function show(view) {
  for (const v of views) $(v).hidden = v !== view;
  $('nav').hidden = view === 'login-view';
}

function route() {
  if (timer) clearInterval(timer);
  timer = null;
  if (!key()) {
    show('login-view');
    $('key').focus();
    return;
  }
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  if (parts[0] === 'sandbox' && parts[1]) {
    openSandbox(parts[1], parts[2] || 'terminal');
  } else if (parts[0] === 'daemon') {
    show('daemon-view');
    every(pollDaemon);
  } else {
    show('list-view');
    every(pollList);
  }
}

/** Runs `f` now and every POLL_MS while the view stays. */
function every(f) {
  const tick = () => f().catch((e) => console.warn('poll:', e.message));
  tick();
  timer = setInterval(tick, POLL_MS);
}

function logout(why) {
  sessionStorage.removeItem(KEY_SLOT);
  closeTerminal();
  $('login-error').textContent = why || '';
  location.hash = '#/';
  route();
}

// ---------------------------------------------------------------------------------------
// Sandbox list, with CPU and memory history per sandbox
// ---------------------------------------------------------------------------------------

const seen = new Map(); // id -> {cpu: [], mem: [], limit}

function record(id, m) {
  let h = seen.get(id);
  if (!h) seen.set(id, (h = { cpu: [], mem: [], limit: 0 }));
  h.cpu.push(m.cpu_percent || 0);
  h.mem.push(m.memory_used_bytes || 0);
  h.limit = m.memory_limit_bytes || h.limit;
  for (const k of ['cpu', 'mem']) if (h[k].length > HISTORY) h[k].shift();
  return h;
}

async function pollList() {
  const { sandboxes } = await api('GET', '/v1/sandboxes');
  const metrics = await Promise.all(
    sandboxes.map((s) => api('GET', sbPath(s.id, '/metrics')).catch(() => null)),
  );
  const body = $('sandboxes').tBodies[0];
  clear(body);
  sandboxes.sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
  sandboxes.forEach((s, i) => {
    const h = metrics[i] ? record(s.id, metrics[i]) : seen.get(s.id) || { cpu: [], mem: [], limit: 0 };
    const link = el('a', s.id, 'mono');
    link.href = `#/sandbox/${encodeURIComponent(s.id)}`;
    const state = el('span', s.state, `state ${s.state === 'paused' ? 'paused' : ''}`);
    const cpu = el('div', null, 'spark-cell');
    cpu.appendChild(sparkline(h.cpu, 100));
    cpu.appendChild(el('span', `${(h.cpu[h.cpu.length - 1] || 0).toFixed(1)} %`, 'muted'));
    const mem = el('div', null, 'spark-cell');
    mem.appendChild(sparkline(h.mem, 0));
    mem.appendChild(el('span', bytes(h.mem[h.mem.length - 1]), 'muted'));
    const tr = row([link, state, s.template, age(s.created_at), cpu, mem]);
    tr.dataset.id = s.id;
    body.appendChild(tr);
  });
  for (const id of seen.keys()) if (!sandboxes.some((s) => s.id === id)) seen.delete(id);
  $('count').textContent = `(${sandboxes.length})`;
  $('list-empty').hidden = sandboxes.length > 0;
  $('list-error').textContent = '';
}

// ---------------------------------------------------------------------------------------
// One sandbox
// ---------------------------------------------------------------------------------------

function openSandbox(id, tab) {
  if (current !== id) {
    closeTerminal();
    clear($('exec-out'));
    $('exec-status').textContent = '';
    $('sb-error').textContent = '';
    $('term-status').textContent = '';
    clear($('term'));
    $('files-path').value = '/home/user';
    clear($('files').tBodies[0]);
    showCells(id);
    current = id;
  }
  show('sandbox-view');
  $('sb-id').textContent = id;
  for (const b of $('tabs').querySelectorAll('button')) b.classList.toggle('on', b.dataset.tab === tab);
  for (const t of document.querySelectorAll('.tab')) t.classList.toggle('on', t.id === `tab-${tab}`);
  if (tab === 'files') listFiles().catch(showFilesError);
  every(() => pollSandbox(id));
}

async function pollSandbox(id) {
  let sb;
  try {
    sb = await api('GET', sbPath(id));
  } catch (e) {
    $('sb-state').textContent = e.status === 410 ? 'ended' : 'unknown';
    $('sb-error').textContent = e.message;
    return;
  }
  $('sb-state').textContent = sb.state;
  $('sb-state').className = `state ${sb.state === 'paused' ? 'paused' : ''}`;
  facts($('sb-facts'), [
    ['template', sb.template],
    ['created', `${sb.created_at} (${age(sb.created_at)} ago)`],
    ['expires', sb.expires_at],
    ['limits', `${sb.limits.cpus} CPU · ${sb.limits.memory_mb} MiB · disk ${sb.limits.disk_mb} MiB · ${sb.limits.pids} pids`],
    ['labels', Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', ') || '—'],
  ]);
  const tab = document.querySelector('.tab.on');
  const which = tab ? tab.id : '';
  const jobs = [];
  if (which === 'tab-commands') jobs.push(pollCommands(id));
  if (which === 'tab-network') jobs.push(pollNetwork(id, sb));
  jobs.push(pollMetrics(id)); // every tick, so the charts have a history
  await Promise.all(jobs);
}

async function pollCommands(id) {
  const [{ commands }, { events }] = await Promise.all([
    api('GET', sbPath(id, '/commands')),
    api('GET', sbPath(id, '/events')),
  ]);
  const cb = $('commands').tBodies[0];
  clear(cb);
  for (const c of commands.slice().reverse()) {
    const cmd = Array.isArray(c.cmd) ? c.cmd.join(' ') : String(c.cmd);
    const status = c.running ? 'running' : `exit ${c.exit_code === undefined || c.exit_code === null ? '?' : c.exit_code}`;
    cb.appendChild(row([String(c.id), el('span', cmd, 'mono'), status]));
  }
  const eb = $('events').tBodies[0];
  clear(eb);
  for (const e of events.slice().reverse()) {
    eb.appendChild(row([time(e.time), e.type, e.state, [e.reason, e.detail].filter(Boolean).join(': ')]));
  }
}

async function pollNetwork(id, sb) {
  const n = sb.network || {};
  facts($('policy'), [
    ['mode', n.mode],
    ['allow', (n.allow || []).join(', ') || '—'],
    ['deny', (n.deny || []).join(', ') || '—'],
  ]);
  const log = await api('GET', sbPath(id, '/egress'));
  const body = $('egress').tBodies[0];
  clear(body);
  for (const e of log.entries.slice().reverse()) {
    const verdict = el('span', e.allowed ? 'allowed' : 'denied', e.allowed ? 'verdict-allowed' : 'verdict-denied');
    const tr = row([time(e.time), e.kind, e.name || '', e.ip || '', e.port, verdict, e.reason || '',
      `${bytes(e.bytes_up)} / ${bytes(e.bytes_down)}`]);
    tr.dataset.verdict = e.allowed ? 'allowed' : 'denied';
    body.appendChild(tr);
  }
  $('egress-empty').hidden = log.entries.length > 0;
  $('egress-unlisted').textContent = log.unlisted ? `(${log.unlisted} more not listed)` : '';
}

async function pollMetrics(id) {
  const m = await api('GET', sbPath(id, '/metrics'));
  const h = record(id, m);
  drawLine($('cpu-chart'), h.cpu, 100);
  drawLine($('mem-chart'), h.mem, 0);
  $('cpu-now').textContent = `${(m.cpu_percent || 0).toFixed(1)} %`;
  $('mem-now').textContent = `${bytes(m.memory_used_bytes)} of ${bytes(m.memory_limit_bytes)}`;
  if (!$('tab-usage').classList.contains('on')) return;
  facts($('metrics'), [
    ['CPU time', `${((m.cpu_usage_ms || 0) / 1000).toFixed(2)} s`],
    ['memory peak', bytes(m.memory_peak_bytes)],
    ['disk', `${bytes(m.disk_used_bytes)} of ${bytes(m.disk_limit_bytes)}`],
    ['processes', `${m.pids} of ${m.pids_limit}`],
    ['OOM kills', m.oom_kills],
  ]);
  const u = await api('GET', sbPath(id, '/usage'));
  facts($('usage'), [
    ['CPU', `${u.cpu_seconds.toFixed(2)} s`],
    ['memory', `${u.memory_gib_seconds.toFixed(3)} GiB·s`],
    ['memory peak', bytes(u.memory_peak_bytes)],
    ['wall time', `${u.wall_seconds.toFixed(0)} s`],
    ['egress', `${bytes(u.egress_bytes_up)} up, ${bytes(u.egress_bytes_down)} down`],
  ]);
}

/** Reads an NDJSON response line by line as it arrives, handing each parsed line to `f`. */
async function readNdjson(r, f) {
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  const take = (line) => {
    if (line.trim()) f(JSON.parse(line));
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      take(buf.slice(0, nl));
      buf = buf.slice(nl + 1);
    }
  }
  take(buf + dec.decode());
}

/** Runs the form's command, streaming its output (NDJSON) into the page as text. */
async function runCommand(ev) {
  ev.preventDefault();
  const id = current;
  const out = $('exec-out');
  clear(out);
  $('exec-status').textContent = 'running…';
  try {
    const r = await api('POST', sbPath(id, '/exec'), { cmd: $('exec-cmd').value, timeout_ms: 60000 },
      { accept: 'application/x-ndjson', raw: true });
    await readNdjson(r, (m) => {
      if (m.type === 'stdout' || m.type === 'stderr') {
        out.appendChild(el('span', m.data, m.type));
        out.scrollTop = out.scrollHeight;
      } else if (m.type === 'exited') {
        $('exec-status').textContent = `exit ${m.exit_code}${m.timed_out ? ' (timed out)' : ''} in ${m.duration_ms} ms`;
      } else if (m.type === 'error') {
        $('exec-status').textContent = `error: ${m.error.message}`;
      }
    });
  } catch (e) {
    $('exec-status').textContent = `error: ${e.message}`;
  }
}

// Code cells ----------------------------------------------------------------------------
//
// A cell's output is hostile like everything else: streams, `text/plain`, `text/html`
// (shown as its source, never rendered) and errors go in as text; `image/png` and
// `image/jpeg` become an <img> whose src is a data: URL built from the base64, set as an
// attribute.

const cellLogs = new Map(); // sandbox id -> the element holding its cells, newest first
const IMAGE_MIMES = ['image/png', 'image/jpeg'];
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** Terminal colours and such in tracebacks (IPython colours them): dropped. */
const plain = (s) => String(s === undefined || s === null ? '' : s).replace(/\x1b\[[0-9;?]*[ -/]*[@-~]/g, '');

function cellLog(id) {
  let log = cellLogs.get(id);
  if (!log) cellLogs.set(id, (log = el('div', null, 'cell-log')));
  return log;
}

function showCells(id) {
  const box = $('cells');
  clear(box);
  box.appendChild(cellLog(id));
}

/** One MIME bundle as page elements: images as <img>, everything else as text. */
function renderResult(r) {
  const box = el('div', null, r.is_main_result ? 'result main' : 'result');
  const data = r.data && typeof r.data === 'object' ? r.data : {};
  let image = false;
  for (const mime of IMAGE_MIMES) {
    const b64 = typeof data[mime] === 'string' ? data[mime].replace(/\s+/g, '') : null;
    if (!b64 || !BASE64.test(b64)) continue;
    const img = document.createElement('img');
    img.alt = `${mime} result`;
    img.dataset.mime = mime;
    img.src = `data:${mime};base64,${b64}`;
    box.appendChild(img);
    image = true;
  }
  for (const [mime, v] of Object.entries(data)) {
    if (mime === 'text/plain' || (IMAGE_MIMES.includes(mime) && image)) continue;
    const what = mime === 'text/html' ? 'text/html, shown as source' : mime;
    box.appendChild(el('div', what, 'mime'));
    const pre = el('pre', typeof v === 'string' ? v : JSON.stringify(v, null, 2), 'data');
    pre.dataset.mime = mime;
    box.appendChild(pre);
  }
  if (!image && data['text/plain'] !== undefined) {
    const pre = el('pre', plain(data['text/plain']), 'data');
    pre.dataset.mime = 'text/plain';
    box.appendChild(pre);
  }
  return box;
}

/** Runs the editor's cell in the current sandbox, streaming its events (NDJSON) into a new cell. */
async function runCell(ev) {
  if (ev) ev.preventDefault();
  const id = current;
  const code = $('code-src').value;
  const language = $('code-lang').value;
  if (!code.trim()) return;
  const cell = el('div', null, 'cell');
  cell.dataset.state = 'running';
  const head = el('div', null, 'cell-head');
  const count = el('span', '[*]', 'count');
  const status = el('span', 'running…', 'muted');
  head.appendChild(count);
  head.appendChild(el('span', language, 'lang'));
  head.appendChild(status);
  cell.appendChild(head);
  cell.appendChild(el('pre', code, 'cell-code'));
  const out = el('div', null, 'cell-out');
  cell.appendChild(out);
  const log = cellLog(id);
  log.insertBefore(cell, log.firstChild);
  const started = performance.now();
  let stream = null; // the <pre> the last stdout/stderr text went into
  const failed = (name, value, traceback) => {
    stream = null;
    const box = el('div', null, 'cell-error');
    box.appendChild(el('div', `${plain(name)}: ${plain(value)}`, 'error-head'));
    if (traceback) box.appendChild(el('pre', plain(traceback), 'traceback'));
    out.appendChild(box);
    cell.dataset.error = plain(name);
  };
  let ended = false;
  try {
    const r = await api('POST', sbPath(id, '/code'), { code, language, timeout_ms: 60000 },
      { accept: 'application/x-ndjson', raw: true });
    await readNdjson(r, (m) => {
      if (m.type === 'stdout' || m.type === 'stderr') {
        if (!stream || stream.dataset.stream !== m.type) {
          stream = el('pre', null, `stream ${m.type}`);
          stream.dataset.stream = m.type;
          out.appendChild(stream);
        }
        stream.appendChild(document.createTextNode(String(m.text)));
      } else if (m.type === 'result') {
        stream = null;
        out.appendChild(renderResult(m));
      } else if (m.type === 'error') {
        failed(m.name, m.value, m.traceback);
      } else if (m.type === 'end') {
        ended = true;
        count.textContent = `[${m.execution_count}]`;
        cell.dataset.count = String(m.execution_count);
        if (m.context_restarted) out.appendChild(el('div', 'the context was restarted: its state is lost', 'error'));
      }
    });
  } catch (e) {
    failed('error', e.message, '');
  }
  const ms = Math.round(performance.now() - started);
  if (!ended && !cell.dataset.error) failed('error', 'the stream ended before the cell did', '');
  if (!ended) count.textContent = '[!]';
  cell.dataset.state = cell.dataset.error ? 'error' : 'done';
  status.textContent = `${cell.dataset.error ? 'failed' : 'done'} in ${ms} ms`;
}

// Files ---------------------------------------------------------------------------------

function showFilesError(e) {
  $('files-error').textContent = e.message;
}

async function listFiles() {
  const dir = $('files-path').value || '/';
  const { entries } = await api('GET', `${sbPath(current, '/files/list')}?path=${encodeURIComponent(dir)}&depth=1`);
  const body = $('files').tBodies[0];
  clear(body);
  entries.sort((a, b) => (a.type === b.type ? (a.name < b.name ? -1 : 1) : a.type === 'dir' ? -1 : 1));
  for (const f of entries) {
    const name = el('a', f.name, 'mono');
    name.href = '#';
    name.addEventListener('click', (e) => {
      e.preventDefault();
      if (f.type === 'dir') {
        $('files-path').value = f.path;
        listFiles().catch(showFilesError);
      } else {
        download(f).catch(showFilesError);
      }
    });
    let action = '';
    if (f.type === 'file') {
      action = el('button', 'Download');
      action.type = 'button';
      action.addEventListener('click', () => download(f).catch(showFilesError));
    }
    const tr = row([name, f.type, f.type === 'file' ? bytes(f.size) : '', typeof f.mtime === 'number' ? new Date(f.mtime * 1000).toLocaleString() : String(f.mtime || ''), action]);
    tr.dataset.name = f.name;
    body.appendChild(tr);
  }
  $('files-error').textContent = entries.length ? '' : 'empty directory';
}

/** Downloads a file through the API (the key goes in a header, so: fetch, then a blob). */
async function download(f) {
  const r = await api('GET', `${sbPath(current, '/files')}?path=${encodeURIComponent(f.path)}`, undefined, { raw: true });
  const url = URL.createObjectURL(await r.blob());
  const a = document.createElement('a');
  a.href = url;
  a.download = f.name.replace(/[\\/]/g, '_') || 'download';
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// ---------------------------------------------------------------------------------------
// The terminal: a small screen model fed by the PTY WebSocket. It handles what shells and
// line editors send (text, CR/LF/BS/TAB, cursor moves, erase in line and display) and
// drops the rest (colours, titles, modes); it is not a full VT100.
// ---------------------------------------------------------------------------------------

class Screen {
  constructor(cols, rows) {
    this.cols = cols;
    this.rows = rows;
    this.lines = [[]]; // scrollback + screen, arrays of characters
    this.x = 0;
    this.y = 0; // index into lines
    this.state = 'text';
    this.seq = '';
  }

  top() {
    return Math.max(0, this.lines.length - this.rows);
  }

  line() {
    while (this.lines.length <= this.y) this.lines.push([]);
    return this.lines[this.y];
  }

  newline() {
    this.y++;
    this.line();
    if (this.lines.length > 2000) {
      this.lines.splice(0, this.lines.length - 2000);
      this.y = this.lines.length - 1;
    }
  }

  put(ch) {
    if (this.x >= this.cols) {
      this.x = 0;
      this.newline();
    }
    const l = this.line();
    while (l.length < this.x) l.push(' ');
    l[this.x++] = ch;
  }

  write(text) {
    for (const ch of text) {
      const c = ch.codePointAt(0);
      if (this.state === 'esc') {
        if (ch === '[') { this.state = 'csi'; this.seq = ''; }
        else if (ch === ']') { this.state = 'osc'; }
        else if (ch === '(' || ch === ')') { this.state = 'charset'; }
        else this.state = 'text';
        continue;
      }
      if (this.state === 'charset') { this.state = 'text'; continue; }
      if (this.state === 'osc') {
        if (c === 7) this.state = 'text';
        else if (c === 27) this.state = 'osc-esc';
        continue;
      }
      if (this.state === 'osc-esc') { this.state = 'text'; continue; }
      if (this.state === 'csi') {
        if (c >= 0x40 && c <= 0x7e) {
          this.csi(this.seq, ch);
          this.state = 'text';
        } else if (this.seq.length < 32) this.seq += ch;
        continue;
      }
      if (c === 27) this.state = 'esc';
      else if (c === 13) this.x = 0;
      else if (c === 10) this.newline();
      else if (c === 8) this.x = Math.max(0, this.x - 1);
      else if (c === 9) this.x = Math.min(this.cols - 1, (Math.floor(this.x / 8) + 1) * 8);
      else if (c >= 32 && c !== 127) this.put(ch);
    }
  }

  csi(params, final) {
    const priv = params.startsWith('?');
    const n = params.replace(/^[?>=]/, '').split(';').map((p) => parseInt(p, 10));
    const a = Number.isFinite(n[0]) && n[0] > 0 ? n[0] : 1;
    const top = this.top();
    const l = () => this.line();
    switch (final) {
      case 'A': this.y = Math.max(top, this.y - a); break;
      case 'B': this.y = Math.min(top + this.rows - 1, this.y + a); break;
      case 'C': this.x = Math.min(this.cols - 1, this.x + a); break;
      case 'D': this.x = Math.max(0, this.x - a); break;
      case 'G': this.x = Math.min(this.cols - 1, a - 1); break;
      case 'd': this.y = top + Math.min(this.rows - 1, a - 1); break;
      case 'H': case 'f': {
        const r = Number.isFinite(n[0]) && n[0] > 0 ? n[0] : 1;
        const col = Number.isFinite(n[1]) && n[1] > 0 ? n[1] : 1;
        this.y = top + Math.min(this.rows - 1, r - 1);
        this.x = Math.min(this.cols - 1, col - 1);
        break;
      }
      case 'K': {
        const mode = Number.isFinite(n[0]) ? n[0] : 0;
        const line = l();
        if (mode === 0) line.length = Math.min(line.length, this.x);
        else if (mode === 1) for (let i = 0; i <= this.x && i < line.length; i++) line[i] = ' ';
        else line.length = 0;
        break;
      }
      case 'J': {
        const mode = Number.isFinite(n[0]) ? n[0] : 0;
        if (mode === 0) {
          l().length = Math.min(l().length, this.x);
          this.lines.length = this.y + 1;
        } else if (mode >= 2) {
          // Clear the screen: keep the scrollback, start a fresh page.
          const y = this.y - top;
          for (let i = 0; i < this.rows; i++) this.lines.push([]);
          this.y = this.top() + y;
        }
        break;
      }
      case 'P': l().splice(this.x, a); break;
      case '@': l().splice(this.x, 0, ...' '.repeat(a)); break;
      case 'X': for (let i = 0; i < a; i++) l()[this.x + i] = ' '; break;
      default: if (priv) { /* modes: ignored */ }
    }
  }

  /** Renders into `pre` as text: the lines, with the cursor as a one-character span. */
  render(pre) {
    const before = this.lines.slice(0, this.y).map((l) => l.join(''));
    const cur = this.line();
    const head = cur.slice(0, this.x).join('').padEnd(this.x, ' ');
    const under = cur[this.x] || ' ';
    const tail = cur.slice(this.x + 1).join('');
    const after = this.lines.slice(this.y + 1).map((l) => l.join(''));
    clear(pre);
    pre.appendChild(document.createTextNode((before.length ? `${before.join('\n')}\n` : '') + head));
    pre.appendChild(el('span', under, 'cursor'));
    pre.appendChild(document.createTextNode(tail + (after.length ? `\n${after.join('\n')}` : '')));
    pre.scrollTop = pre.scrollHeight;
  }

  /** Everything on screen and in the scrollback, as plain text. */
  text() {
    return this.lines.map((l) => l.join('')).join('\n');
  }
}

let term = null; // {ws, screen, cid}

function b64url(s) {
  const bytes = new TextEncoder().encode(s);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function closeTerminal() {
  if (term && term.ws) term.ws.close(1000);
  term = null;
}

async function openTerminal() {
  closeTerminal();
  const id = current;
  const pre = $('term');
  const cols = 100;
  const rows = 28;
  $('term-status').textContent = 'starting…';
  let started;
  try {
    started = await api('POST', sbPath(id, '/pty'), { cols, rows });
  } catch (e) {
    $('term-status').textContent = `error: ${e.message}`;
    return;
  }
  const screen = new Screen(cols, rows);
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const url = `${scheme}://${location.host}${sbPath(id, `/pty/${started.id}/ws`)}`;
  // A browser cannot put the key in a header here: it goes as a second subprotocol.
  const ws = new WebSocket(url, ['glovebox', `glovebox.bearer.${b64url(key())}`]);
  ws.binaryType = 'arraybuffer';
  const dec = new TextDecoder();
  term = { ws, screen, cid: started.id };
  pre.dataset.cid = String(started.id);
  ws.onopen = () => {
    $('term-status').textContent = `terminal ${started.id} attached`;
    pre.focus();
  };
  ws.onmessage = (m) => {
    if (typeof m.data === 'string') {
      let ev = {};
      try { ev = JSON.parse(m.data); } catch (_) { /* ignored */ }
      if (ev.exited) $('term-status').textContent = `exited with ${ev.exited.exit_code}`;
      if (ev.error) $('term-status').textContent = `error: ${ev.error.message}`;
      return;
    }
    screen.write(dec.decode(new Uint8Array(m.data), { stream: true }));
    screen.render(pre);
  };
  ws.onclose = (e) => {
    if (term && term.ws === ws) {
      if (!/^exited/.test($('term-status').textContent)) {
        $('term-status').textContent = e.code === 4001 ? 'taken over by another client' : 'detached';
      }
      term = null;
    }
  };
  screen.render(pre);
}

const KEYS = {
  Enter: '\r', Backspace: '\x7f', Tab: '\t', Escape: '\x1b',
  ArrowUp: '\x1b[A', ArrowDown: '\x1b[B', ArrowRight: '\x1b[C', ArrowLeft: '\x1b[D',
  Home: '\x1b[H', End: '\x1b[F', Delete: '\x1b[3~', PageUp: '\x1b[5~', PageDown: '\x1b[6~',
};

function sendToTerminal(s) {
  if (term && term.ws.readyState === WebSocket.OPEN) term.ws.send(new TextEncoder().encode(s));
}

function onTerminalKey(e) {
  if (!term) return;
  let s = null;
  if (e.ctrlKey && !e.altKey && e.key.length === 1) {
    const c = e.key.toUpperCase().charCodeAt(0);
    if (c >= 64 && c <= 95) s = String.fromCharCode(c - 64);
  } else if (KEYS[e.key]) {
    s = KEYS[e.key];
  } else if (e.key.length === 1 && !e.metaKey) {
    s = (e.altKey ? '\x1b' : '') + e.key;
  }
  if (s !== null) {
    e.preventDefault();
    sendToTerminal(s);
  }
}

// ---------------------------------------------------------------------------------------
// The daemon's Prometheus figures
// ---------------------------------------------------------------------------------------

/** Parses Prometheus text: [{name, labels: {}, value}]. */
function parseProm(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

const daemonHistory = new Map(); // figure -> values

async function pollDaemon() {
  let text;
  try {
    text = await api('GET', '/metrics');
  } catch (e) {
    $('daemon-error').textContent = e.status === 403
      ? 'The daemon\'s figures need the admin key.' : `error: ${e.message}`;
    return;
  }
  $('daemon-error').textContent = '';
  const samples = parseProm(text);
  const figures = [];
  const hist = new Map();
  for (const s of samples) {
    const suffix = /_(bucket|sum|count)$/.exec(s.name);
    if (suffix) {
      const base = s.name.slice(0, -suffix[0].length);
      if (!hist.has(base)) hist.set(base, { buckets: [], sum: 0, count: 0 });
      const h = hist.get(base);
      if (suffix[1] === 'bucket') h.buckets.push([s.labels.le, s.value]);
      else h[suffix[1]] = s.value;
      continue;
    }
    const labels = Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(',');
    figures.push({ key: labels ? `${s.name}{${labels}}` : s.name, value: s.value });
  }
  const numbers = $('daemon-numbers');
  clear(numbers);
  for (const f of figures) {
    let h = daemonHistory.get(f.key);
    if (!h) daemonHistory.set(f.key, (h = []));
    h.push(f.value);
    if (h.length > HISTORY) h.shift();
    const box = el('div', null, 'number');
    box.dataset.metric = f.key;
    box.appendChild(el('div', Number.isInteger(f.value) ? f.value : f.value.toFixed(3), 'v'));
    box.appendChild(el('div', f.key, 'k'));
    box.appendChild(sparkline(h, 1));
    numbers.appendChild(box);
  }
  const charts = $('daemon-charts');
  clear(charts);
  const hb = $('histograms').tBodies[0];
  clear(hb);
  for (const [name, h] of [...hist.entries()].filter(([, v]) => v.buckets.length)) {
    // Bucket counts are cumulative: draw each bucket's own share as a bar.
    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('viewBox', `0 0 ${h.buckets.length * 10} 24`);
    svg.setAttribute('preserveAspectRatio', 'none');
    let prev = 0;
    const own = h.buckets.map(([, c]) => { const v = c - prev; prev = c; return v; });
    const max = Math.max(1, ...own);
    own.forEach((v, i) => {
      const r = document.createElementNS(SVG_NS, 'rect');
      const height = (v / max) * 24;
      r.setAttribute('x', String(i * 10 + 1));
      r.setAttribute('y', String(24 - height));
      r.setAttribute('width', '8');
      r.setAttribute('height', String(height));
      r.setAttribute('fill', '#2f6f5e');
      const t = document.createElementNS(SVG_NS, 'title');
      t.textContent = `≤ ${h.buckets[i][0]}: ${v}`;
      r.appendChild(t);
      svg.appendChild(r);
    });
    const mean = h.count ? `${((h.sum / h.count) * 1000).toFixed(1)} ms` : '—';
    hb.appendChild(row([el('span', name, 'mono'), String(h.count), mean, svg]));
  }
}

// ---------------------------------------------------------------------------------------
// Wiring
// ---------------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  $('login-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const k = $('key').value.trim();
    sessionStorage.setItem(KEY_SLOT, k);
    try {
      await api('GET', '/v1/sandboxes');
    } catch (err) {
      sessionStorage.removeItem(KEY_SLOT);
      $('login-error').textContent = err.status === 401 ? 'That key was refused.' : `error: ${err.message}`;
      return;
    }
    $('key').value = '';
    $('login-error').textContent = '';
    $('who').textContent = `key ${k.slice(0, 8)}…`;
    location.hash = '#/';
    route();
  });
  $('logout').addEventListener('click', () => logout(''));
  $('create').addEventListener('click', async () => {
    try {
      const sb = await api('POST', '/v1/sandboxes', {});
      location.hash = `#/sandbox/${encodeURIComponent(sb.id)}`;
    } catch (e) {
      $('list-error').textContent = e.message;
    }
  });
  for (const b of $('tabs').querySelectorAll('button')) {
    b.addEventListener('click', () => {
      location.hash = `#/sandbox/${encodeURIComponent(current)}/${b.dataset.tab}`;
    });
  }
  $('sb-kill').addEventListener('click', async () => {
    try {
      await api('DELETE', sbPath(current));
      closeTerminal();
      location.hash = '#/';
    } catch (e) {
      $('sb-error').textContent = e.message;
    }
  });
  $('exec-form').addEventListener('submit', runCommand);
  $('code-form').addEventListener('submit', runCell);
  $('code-src').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) runCell(e);
  });
  $('files-form').addEventListener('submit', (e) => {
    e.preventDefault();
    listFiles().catch(showFilesError);
  });
  $('files-up').addEventListener('click', () => {
    const p = $('files-path').value.replace(/\/+$/, '');
    $('files-path').value = p.slice(0, p.lastIndexOf('/')) || '/';
    listFiles().catch(showFilesError);
  });
  $('term-open').addEventListener('click', openTerminal);
  $('term').addEventListener('keydown', onTerminalKey);
  $('term').addEventListener('paste', (e) => {
    e.preventDefault();
    sendToTerminal(e.clipboardData.getData('text'));
  });
  if (key()) $('who').textContent = `key ${key().slice(0, 8)}…`;
  window.addEventListener('hashchange', route);
  route();
});
