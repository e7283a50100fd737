#!/usr/bin/env node
// Glovebox Node.js kernel: one long-lived JavaScript realm per code-interpreter context.
//
// Protocol (the same for the Python, Node and bash kernels; python_kernel.py has the full
// text): JSON-line requests {"id", "code", "env"?, "scoped_env"?} on fd 0; JSON-line events on fd 1:
// ready {"language":"javascript"}, then per request stdout/stderr {text}, result {data,
// is_main_result}, error {name, value, traceback} and always, last, end {execution_count}.
// SIGINT interrupts the running cell (error named KeyboardInterrupt, state kept); SIGINT
// while idle is ignored; EOF on fd 0 exits 0 once queued cells have run.
//
// Decisions:
// * Cells run in the kernel's own realm (vm.Script#runInThisContext with breakOnSigint),
//   so `instanceof Error`, Buffers and objects from `require`d modules behave as in a
//   script. `require` resolves from the kernel's starting directory.
// * Top-level `let`/`const` become `var` and `class X {}` becomes `var X = class X {};`,
//   so re-running a cell never fails with "Identifier has already been declared" (a
//   const can therefore be reassigned by a later cell). Declarations inside blocks and
//   functions are untouched. The rewrite keeps line numbers.
// * A cell that only compiles with top-level `await` runs as an async function: its
//   top-level declarations are copied to the global object when it finishes, and its
//   last expression statement is its value. SIGINT stops it while it awaits; a busy loop
//   after an `await` cannot be interrupted (V8 only breaks synchronous script runs).
// * The main result is the cell's completion value (what the REPL prints) as text/plain
//   via util.inspect; undefined gives no result. `display(value)` and
//   `display.html(s)`/`.markdown`/`.svg`/`.png`/`.json`/`.latex` give non-main results.
// * `env` is set in process.env before the cell and kept afterwards; `scoped_env` is set
//   for the cell only (afterwards each name gets back its value, or is removed).
// * Static `import` declarations at the start of a line (`import x from 'm'`,
//   `import { a as b } from 'm'`, `import * as ns from 'm'`, `import 'm'`) become dynamic
//   imports awaited in place (so such a cell runs as an async cell); bare names resolve from
//   the kernel's starting directory, then as Node's own `import()` would.
// * A string value's text/plain is the string itself (as E2B shows it); other values are
//   util.inspect'ed.
// * Started with `--typescript`, the kernel transpiles each cell with the `typescript`
//   package (found next to the cell's directory or among global npm packages) before
//   running it: types are erased, nothing is type-checked.
// * Output: fds 1 and 2 are FIFOs drained by a worker thread (so child processes started
//   with stdio "inherit" are captured), process.stdout/stderr write to them
//   synchronously, fd 0 is /dev/null. The protocol channel moves to private fds reopened
//   through /proc/self/fd. Without /proc or mkfifo the kernel falls back to sending
//   JavaScript-level output directly; fd-level output of children is then not captured.
// * Uncaught exceptions and unhandled rejections from callbacks are reported on stderr;
//   they never end the kernel. process.exit() does end it.
'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const { Writable } = require('stream');
const { Worker } = require('worker_threads');
const { StringDecoder } = require('string_decoder');
const { execFileSync } = require('child_process');

const { O_RDONLY, O_WRONLY, O_APPEND, O_NONBLOCK } = fs.constants;
const CELL_PREFIX = '<cell-';
const EXPORTS_KEY = 'glovebox.kernel.exports';
const SYNC_TIMEOUT_MS = 2000;
// `JSON`, `process` and friends may be reassigned by cells; the kernel keeps its own.
const stringify = JSON.stringify;
const parse = JSON.parse;
const env = process.env;

// ---- file descriptors -----------------------------------------------------------------

function reopen(fd, flags) {
  try {
    return fs.openSync(`/proc/self/fd/${fd}`, flags);
  } catch {
    return null;
  }
}

function moveTo(fd, open) {
  fs.closeSync(fd);
  const got = open();
  if (got !== fd) throw new Error(`expected fd ${fd}, got ${got}`);
}

function setupFds() {
  let requests = reopen(0, O_RDONLY);
  const events = reopen(1, O_WRONLY | O_APPEND);
  if (requests !== null) moveTo(0, () => fs.openSync('/dev/null', O_RDONLY));
  else requests = 0;
  if (events === null) return { requests, events: 1, capture: null };
  // Node can neither dup2 nor pipe(2); a FIFO opened right after closing fd N lands on N.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'glovebox-node-'));
  const capture = [];
  try {
    for (const [fd, name] of [[1, 'stdout'], [2, 'stderr']]) {
      const fifo = path.join(dir, name);
      execFileSync('mkfifo', ['-m', '600', fifo], { stdio: 'ignore' });
      const read = fs.openSync(fifo, O_RDONLY | O_NONBLOCK);
      moveTo(fd, () => fs.openSync(fifo, O_WRONLY));
      capture.push([name, read]);
    }
  } catch {
    // Keep the protocol channel clean at least: children's fd-1 output goes nowhere.
    if (capture.length === 0) moveTo(1, () => fs.openSync('/dev/null', O_WRONLY));
    if (capture.length < 2) {
      for (const [, read] of capture) fs.closeSync(read);
      capture.length = 0;
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
  return { requests, events, capture: capture.length === 2 ? capture : null };
}

const fds = setupFds();

// ---- protocol channel -----------------------------------------------------------------

// Word 0: lock over the events fd (main thread and output worker both write lines).
// Word 1: the last sync request the worker has completed.
const shared = new SharedArrayBuffer(8);
const words = new Int32Array(shared);

function lock() {
  while (Atomics.compareExchange(words, 0, 0, 1) !== 0) Atomics.wait(words, 0, 1, 50);
}

function unlock() {
  Atomics.store(words, 0, 0);
  Atomics.notify(words, 0, 1);
}

function writeAll(fd, buf) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(fd, buf, off, buf.length - off);
    } catch (err) {
      if (err.code === 'EAGAIN') continue;
      if (err.code === 'EPIPE') process.exit(0);
      throw err;
    }
  }
}

function send(event) {
  const line = Buffer.from(stringify(event) + '\n', 'utf8');
  lock();
  try {
    writeAll(fds.events, line);
  } finally {
    unlock();
  }
}

// ---- captured output ------------------------------------------------------------------

const WORKER_SOURCE = `
'use strict';
const fs = require('fs');
const net = require('net');
const { workerData, parentPort } = require('worker_threads');
const { StringDecoder } = require('string_decoder');
const { events, capture, shared } = workerData;
const words = new Int32Array(shared);
const BATCH_MS = 20;
const CHUNK = 32 * 1024;
let id = null;
// Output from before the kernel is ready (preloading) is dropped.
let forward = false;

function send(event) {
  const buf = Buffer.from(JSON.stringify(event) + '\\n', 'utf8');
  while (Atomics.compareExchange(words, 0, 0, 1) !== 0) Atomics.wait(words, 0, 1, 50);
  try {
    let off = 0;
    while (off < buf.length) {
      try { off += fs.writeSync(events, buf, off, buf.length - off); }
      catch (err) { if (err.code !== 'EAGAIN') return; }
    }
  } finally {
    Atomics.store(words, 0, 0);
    Atomics.notify(words, 0, 1);
  }
}

const streams = capture.map(([name, fd]) => ({ name, fd, parts: [], size: 0, timer: null,
  decoder: new StringDecoder('utf8') }));

function flush(s) {
  if (s.timer) { clearTimeout(s.timer); s.timer = null; }
  if (!s.size) return;
  const text = s.decoder.write(Buffer.concat(s.parts));
  s.parts = []; s.size = 0;
  if (text && forward) send({ type: s.name, id, text });
}

function add(s, chunk) {
  s.parts.push(chunk); s.size += chunk.length;
  if (s.size >= CHUNK) flush(s);
  else if (!s.timer) s.timer = setTimeout(() => flush(s), BATCH_MS);
}

function drain(s) {
  const buf = Buffer.allocUnsafe(65536);
  for (;;) {
    let n;
    try { n = fs.readSync(s.fd, buf, 0, buf.length, null); }
    catch (err) { if (err.code === 'EINTR') continue; return; }
    if (n <= 0) return;
    add(s, Buffer.from(buf.subarray(0, n)));
  }
}

for (const s of streams) {
  const sock = new net.Socket({ fd: s.fd, readable: true, writable: false });
  sock.on('data', (chunk) => add(s, chunk));
  sock.on('error', () => {});
}

parentPort.on('message', (msg) => {
  for (const s of streams) { drain(s); flush(s); }
  if ('id' in msg) id = msg.id;
  if (msg.forward) forward = true;
  Atomics.store(words, 1, msg.seq);
  Atomics.notify(words, 1);
});
`;

let outputId = null;
let syncSeq = 0;
let worker = null;
const direct = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };

if (fds.capture) {
  worker = new Worker(WORKER_SOURCE, {
    eval: true,
    workerData: { events: fds.events, capture: fds.capture, shared },
    stdout: false,
    stderr: false,
  });
  worker.unref();
}

// Everything written to fds 1 and 2 so far is sent before this returns; `nextId`, if
// given, labels the output that follows.
function syncOutput(nextId, forward = false) {
  if (!worker) {
    if (nextId !== undefined) outputId = nextId;
    return;
  }
  const seq = ++syncSeq;
  const msg = { seq };
  if (nextId !== undefined) msg.id = nextId;
  if (forward) msg.forward = true;
  worker.postMessage(msg);
  const deadline = Date.now() + SYNC_TIMEOUT_MS;
  for (;;) {
    const done = Atomics.load(words, 1);
    if (done >= seq) break;
    const left = deadline - Date.now();
    if (left <= 0) break;
    Atomics.wait(words, 1, done, left);
  }
  if (nextId !== undefined) outputId = nextId;
}

function writeStream(fd, name, chunk) {
  const buf = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : Buffer.from(chunk);
  if (worker) {
    writeAll(fd, buf);
    return;
  }
  const text = direct[name].write(buf);
  if (text) send({ type: name, id: outputId, text });
}

function stdioStream(fd, name) {
  const stream = new Writable({
    write(chunk, _encoding, callback) {
      try {
        writeStream(fd, name, chunk);
        callback();
      } catch (err) {
        callback(err);
      }
    },
  });
  stream.fd = fd;
  stream.isTTY = false;
  stream._isStdio = true;
  stream.destroySoon = stream.destroy;
  stream._destroy = (err, callback) => callback(err);
  return stream;
}

for (const [fd, name] of [[1, 'stdout'], [2, 'stderr']]) {
  const stream = stdioStream(fd, name);
  Object.defineProperty(process, name, { configurable: true, enumerable: true, get: () => stream });
}

// ---- source rewriting -----------------------------------------------------------------

const REGEX_AFTER_WORD = new Set(['return', 'typeof', 'instanceof', 'in', 'of', 'new', 'delete',
  'void', 'throw', 'case', 'do', 'else', 'yield', 'await']);
const CONTINUES_EXPRESSION = new Set(['in', 'of', 'instanceof']);
const NOT_A_NAME = new Set(['await', 'yield', 'this', 'super', 'true', 'false', 'null', 'undefined',
  'new', 'typeof', 'void', 'delete', 'in', 'of', 'instanceof', 'function', 'class', 'async',
  'let', 'const', 'var', 'static', 'get', 'set', 'return', 'if', 'else', 'for', 'while', 'do',
  'switch', 'case', 'default', 'break', 'continue', 'throw', 'try', 'catch', 'finally',
  'import', 'export', 'extends', 'with', 'debugger', 'enum', 'arguments', 'eval']);
const IDENT_START = /[A-Za-z_$\u00a0-\uffff#\\]/;
const IDENT_PART = /[\w$\u00a0-\uffff\\]/;

// Splits JavaScript into tokens well enough to find top-level statements: strings,
// templates, comments and regular expressions are skipped as units; `depth` counts open
// brackets (and template substitutions) around a token.
function tokenize(src) {
  const tokens = [];
  const stack = [];
  const n = src.length;
  let i = 0;
  let nl = true;
  const push = (type, value, start, end, depth) => {
    tokens.push({ type, value, start, end, depth, nl });
    nl = false;
  };
  const template = (j) => {
    while (j < n) {
      if (src[j] === '\\') j += 2;
      else if (src[j] === '`') return [j + 1, false];
      else if (src[j] === '$' && src[j + 1] === '{') return [j + 2, true];
      else j++;
    }
    return [n, false];
  };
  const regexAllowed = () => {
    const p = tokens[tokens.length - 1];
    if (!p) return true;
    if (p.type === 'word') return REGEX_AFTER_WORD.has(p.value);
    return p.type === 'punct' && p.value !== ')' && p.value !== ']';
  };
  if (src.startsWith('#!')) i = src.indexOf('\n') < 0 ? n : src.indexOf('\n');
  while (i < n) {
    const c = src[i];
    const start = i;
    if (c === '\n' || c === '\r' || c === '\u2028' || c === '\u2029') {
      nl = true;
      i++;
    } else if (/\s/.test(c)) {
      i++;
    } else if (c === '/' && src[i + 1] === '/') {
      while (i < n && src[i] !== '\n') i++;
    } else if (c === '/' && src[i + 1] === '*') {
      const e = src.indexOf('*/', i + 2);
      i = e < 0 ? n : e + 2;
      if (src.slice(start, i).includes('\n')) nl = true;
    } else if (c === '"' || c === "'") {
      i++;
      while (i < n && src[i] !== c && src[i] !== '\n') i += src[i] === '\\' ? 2 : 1;
      i++;
      push('str', '', start, Math.min(i, n), stack.length);
    } else if (c === '`' || (c === '}' && stack[stack.length - 1] === '${')) {
      if (c === '}') stack.pop();
      const [end, open] = template(i + 1);
      push('tmpl', '', start, end, stack.length);
      if (open) stack.push('${');
      i = end;
    } else if (c === '/' && regexAllowed()) {
      let j = i + 1;
      let cls = false;
      while (j < n && src[j] !== '\n') {
        const ch = src[j];
        if (ch === '\\') j++;
        else if (cls) cls = ch !== ']';
        else if (ch === '[') cls = true;
        else if (ch === '/') { j++; break; }
        j++;
      }
      while (j < n && /[a-z]/i.test(src[j])) j++;
      push('regex', '', start, j, stack.length);
      i = j;
    } else if (IDENT_START.test(c)) {
      i++;
      while (i < n && IDENT_PART.test(src[i])) i++;
      push('word', src.slice(start, i), start, i, stack.length);
    } else if (/[0-9]/.test(c) || (c === '.' && /[0-9]/.test(src[i + 1] || ''))) {
      i++;
      while (i < n && /[\w.]/.test(src[i])) i++;
      push('num', '', start, i, stack.length);
    } else if (c === '(' || c === '[' || c === '{') {
      push('punct', c, start, i + 1, stack.length);
      stack.push(c);
      i++;
    } else if (c === ')' || c === ']' || c === '}') {
      if (stack.length && stack[stack.length - 1] !== '${') stack.pop();
      push('punct', c, start, i + 1, stack.length);
      i++;
    } else {
      push('punct', c, start, i + 1, stack.length);
      i++;
    }
  }
  return tokens;
}

// True when tokens[k] (at depth 0) can only begin a new statement.
function startsStatement(tokens, k) {
  const t = tokens[k];
  const p = tokens[k - 1];
  if (!p) return true;
  if (p.type === 'punct' && (p.value === ';' || p.value === '}')) return true;
  if (!t.nl) return false;
  if (t.type === 'punct' || t.type === 'tmpl') return false;
  if (t.type === 'word' && CONTINUES_EXPRESSION.has(t.value)) return false;
  if (p.type === 'punct') return p.value === ')' || p.value === ']';
  return p.type !== 'word' || !REGEX_AFTER_WORD.has(p.value);
}

function closing(tokens, k) {
  const depth = tokens[k].depth;
  for (let m = k + 1; m < tokens.length; m++) if (tokens[m].depth === depth) return m;
  return -1;
}

// The names a declaration starting at tokens[k] (var/let/const) binds, generously: any
// identifier in a binding pattern counts. Extra names only cost a no-op copy.
function declaredNames(tokens, k, names) {
  const binding = (m) => {
    const t = tokens[m];
    if (!t) return;
    if (t.type === 'word') names.add(t.value);
    else if (t.value === '{' || t.value === '[') {
      const end = closing(tokens, m);
      for (let q = m + 1; q < (end < 0 ? tokens.length : end); q++) {
        const next = tokens[q + 1];
        if (tokens[q].type === 'word' && !(next && next.value === ':')) names.add(tokens[q].value);
      }
    }
  };
  binding(k + 1);
  for (let m = k + 1; m < tokens.length; m++) {
    const t = tokens[m];
    if (t.depth !== 0) continue;
    if (t.value === ';' || (t.type === 'word' && ['var', 'let', 'const'].includes(t.value) && m > k + 1)) break;
    if (t.value === ',') binding(m + 1);
  }
}

// Rewrites top-level lexical declarations so that cells can be re-run; returns the new
// source and the names the cell declares at top level.
function rewrite(src, tokens) {
  const edits = [];
  const names = new Set();
  for (let k = 0; k < tokens.length; k++) {
    const t = tokens[k];
    if (t.depth !== 0 || t.type !== 'word') continue;
    const p = tokens[k - 1];
    const next = tokens[k + 1];
    if (p && p.value === '.') continue;
    const isLet = t.value === 'let' && next && (next.type === 'word' || next.value === '[' || next.value === '{');
    if (t.value === 'const' || isLet) {
      edits.push([t.start, t.end, t.value === 'const' ? 'var  ' : 'var']);
      declaredNames(tokens, k, names);
    } else if (t.value === 'var') {
      declaredNames(tokens, k, names);
    } else if (t.value === 'class' && next && next.type === 'word' && next.value !== 'extends' && startsStatement(tokens, k)) {
      let body = k + 2;
      while (body < tokens.length && !(tokens[body].value === '{' && tokens[body].depth === 0)) body++;
      const end = body < tokens.length ? closing(tokens, body) : -1;
      if (end < 0) continue;
      edits.push([t.start, t.start, `var ${next.value} = `]);
      edits.push([tokens[end].end, tokens[end].end, ';']);
      names.add(next.value);
    } else if (t.value === 'function' && (startsStatement(tokens, k) || (p && p.value === 'async' && startsStatement(tokens, k - 1)))) {
      const name = next && next.value === '*' ? tokens[k + 2] : next;
      if (name && name.type === 'word') names.add(name.value);
    }
  }
  let out = src;
  for (const [start, end, text] of edits.sort((a, b) => b[0] - a[0])) out = out.slice(0, start) + text + out.slice(end);
  for (const name of names) if (NOT_A_NAME.has(name) || !/^[A-Za-z_$][\w$]*$/.test(name)) names.delete(name);
  return { code: out, names };
}

// Builds the async function that runs a cell using top-level await; returns a compiled
// vm.Script or throws the compile error.
function asyncScript(src, filename) {
  const { code, names } = rewrite(src, tokenize(src));
  // The copy-out closure sits at the top of the function body, where it sees every
  // declaration of the cell (a block would hide async function declarations); the
  // kernel calls it once the cell has settled.
  const copies = [...names].map((name) => `try { globalThis[${stringify(name)}] = ${name}; } catch {}`).join(' ');
  const wrap = (body) => `(async () => { globalThis[Symbol.for(${stringify(EXPORTS_KEY)})] = () => { ${copies} };\n${body}\n})()`;
  const options = { filename, lineOffset: -1 };
  const tokens = tokenize(code);
  const candidates = [];
  for (let k = tokens.length - 1; k >= 0 && candidates.length < 12; k--) {
    if (tokens[k].depth === 0 && startsStatement(tokens, k)) candidates.push(k);
  }
  let last = tokens.length - 1;
  if (last >= 0 && tokens[last].value === ';') last--;
  for (const k of candidates) {
    if (k > last) continue;
    const start = tokens[k].start;
    const end = tokens[last].end;
    const body = `${code.slice(0, start)};return (${code.slice(start, end)}\n);${code.slice(end)}`;
    try {
      return new vm.Script(wrap(body), options);
    } catch {
      // Not an expression statement; try an earlier start.
    }
  }
  return new vm.Script(wrap(code), options);
}

// ---- display --------------------------------------------------------------------------

const REPR_METHODS = [
  ['text/html', '_repr_html_'], ['text/markdown', '_repr_markdown_'], ['image/svg+xml', '_repr_svg_'],
  ['image/png', '_repr_png_'], ['image/jpeg', '_repr_jpeg_'], ['text/latex', '_repr_latex_'],
  ['application/json', '_repr_json_'],
];

function bundle(value) {
  const data = {};
  if (value !== null && typeof value === 'object') {
    for (const [mime, name] of REPR_METHODS) {
      let method;
      try {
        method = value[name];
      } catch {
        continue;
      }
      if (typeof method !== 'function') continue;
      try {
        let out = method.call(value);
        if (out === undefined || out === null) continue;
        if (Buffer.isBuffer(out) || out instanceof Uint8Array) out = Buffer.from(out).toString('base64');
        data[mime] = out;
      } catch (err) {
        process.stderr.write(`${name}() failed: ${err && err.message}\n`);
      }
    }
  }
  data['text/plain'] = typeof value === 'string' ? value : util.inspect(value);
  return data;
}

function emitResult(data, main) {
  syncOutput();
  send({ type: 'result', id: outputId, data, is_main_result: main });
}

function display(...values) {
  let raw = false;
  if (values.length > 1) {
    const last = values[values.length - 1];
    if (last && typeof last === 'object' && Object.keys(last).length === 1 && 'raw' in last) {
      raw = Boolean(last.raw);
      values.pop();
    }
  }
  for (const value of values) emitResult(raw ? { ...value } : bundle(value), false);
}
display.html = (html) => emitResult({ 'text/html': String(html), 'text/plain': '<HTML>' }, false);
display.markdown = (md) => emitResult({ 'text/markdown': String(md), 'text/plain': String(md) }, false);
display.svg = (svg) => emitResult({ 'image/svg+xml': String(svg), 'text/plain': '<SVG>' }, false);
display.latex = (tex) => emitResult({ 'text/latex': String(tex), 'text/plain': String(tex) }, false);
display.json = (obj) => emitResult({ 'application/json': obj, 'text/plain': util.inspect(obj) }, false);
display.png = (png) => emitResult({
  'image/png': Buffer.isBuffer(png) || png instanceof Uint8Array ? Buffer.from(png).toString('base64') : String(png),
  'text/plain': '<PNG>',
}, false);

// ---- errors ---------------------------------------------------------------------------

const KERNEL_FILE = __filename;

function isInternalFrame(line) {
  return line.includes(KERNEL_FILE) || line.includes('node:vm') || line.includes('node:internal/vm')
    || line.includes('[worker eval]');
}

function cleanStack(stack) {
  const lines = String(stack).split('\n');
  const frame = (l) => /^\s+at /.test(l);
  let lastCell = -1;
  lines.forEach((l, i) => { if (frame(l) && l.includes(CELL_PREFIX)) lastCell = i; });
  // Frames past the last cell frame belong to the kernel; without any cell frame (a
  // compile error) every frame does.
  return lines
    .filter((l, i) => !frame(l) || (lastCell >= 0 && i <= lastCell && !isInternalFrame(l)))
    .join('\n');
}

const cellSources = new Map();

// Node decorates synchronous errors with the failing source line; add it for errors that
// surfaced asynchronously (cells using await) the same way.
function withSourceLine(traceback) {
  if (traceback.startsWith(CELL_PREFIX)) return traceback;
  // A decoration pointing into Node's own sources says nothing to the user.
  const decorated = /^\S[^\n]*:\d+\n[^\n]*\n[^\n]*\n\n/.exec(traceback);
  if (decorated) traceback = traceback.slice(decorated[0].length);
  const m = /<cell-(\d+)>:(\d+):(\d+)/.exec(traceback);
  const lines = m && cellSources.get(Number(m[1]));
  const line = lines && lines[Number(m[2]) - 1];
  if (line === undefined) return traceback;
  return `<cell-${m[1]}>:${m[2]}\n${line}\n${' '.repeat(Math.max(0, Number(m[3]) - 1))}^\n\n${traceback}`;
}

function describe(err) {
  if (err && err.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
    return { name: 'KeyboardInterrupt', value: 'interrupted', traceback: 'KeyboardInterrupt: interrupted by SIGINT' };
  }
  if (util.types.isNativeError(err) || err instanceof Error) {
    let name;
    try {
      name = err.name || (err.constructor && err.constructor.name) || 'Error';
    } catch {
      name = 'Error';
    }
    const stack = typeof err.stack === 'string' ? err.stack : `${name}: ${err.message}`;
    return { name: String(name), value: String(err.message), traceback: withSourceLine(cleanStack(stack)) };
  }
  const shown = util.inspect(err);
  return { name: 'Error', value: shown, traceback: `Uncaught ${shown}` };
}

class Interrupted extends Error {
  constructor() {
    super('interrupted');
    this.code = 'ERR_SCRIPT_EXECUTION_INTERRUPTED';
  }
}

// ---- cells ----------------------------------------------------------------------------

let count = 0;
let interruptCell = null;

globalThis.require = Module.createRequire(path.join(process.cwd(), '[cell]'));
globalThis.display = display;

// ---- ESM imports and TypeScript -------------------------------------------------------

const TYPESCRIPT = process.argv.includes('--typescript');
const IMPORT_KEY = 'glovebox.kernel.import';
const cellRequire = globalThis.require;

globalThis[Symbol.for(IMPORT_KEY)] = (spec) => {
  let target = spec;
  if (!/^[a-z][a-z0-9+.-]*:/i.test(spec) && !Module.builtinModules.includes(spec)) {
    try {
      target = require('url').pathToFileURL(cellRequire.resolve(spec)).href;
    } catch {
      if (spec.startsWith('.') || spec.startsWith('/')) {
        target = require('url').pathToFileURL(path.resolve(process.cwd(), spec)).href;
      }
    }
  }
  return import(target);
};

const IMPORT_RE = /^([ \t]*)import[ \t]+(?:([\w$]+)[ \t]*(?:,[ \t]*)?)?(\{[^}]*\}|\*[ \t]*as[ \t]+[\w$]+)?[ \t]*(?:from[ \t]*)?(['"])([^'"\n]+)\4[ \t]*;?/gm;

// Rewrites static import declarations into awaited dynamic imports, line for line.
function esmImports(code) {
  if (!/^[ \t]*import[ \t{*'"]/m.test(code)) return code;
  let n = 0;
  return code.replace(IMPORT_RE, (all, indent, def, clause, _q, spec) => {
    const load = `await globalThis[Symbol.for(${stringify(IMPORT_KEY)})](${stringify(spec)})`;
    const lines = '\n'.repeat((all.match(/\n/g) || []).length);
    if (!def && !clause) return `${indent}${load};${lines}`;
    const parts = [];
    n += 1;
    const ns = `__glovebox_ns_${count}_${n}`;
    parts.push(`const ${ns} = ${load};`);
    if (def) parts.push(`const ${def} = ${ns}.default;`);
    if (clause && clause.startsWith('*')) parts.push(`const ${clause.replace(/^\*\s*as\s+/, '')} = ${ns};`);
    if (clause && clause.startsWith('{')) {
      const names = clause.slice(1, -1).split(',').map((n) => n.trim()).filter(Boolean)
        .map((n) => n.replace(/^([\w$]+)\s+as\s+([\w$]+)$/, '$1: $2'));
      parts.push(`const { ${names.join(', ')} } = ${ns};`);
    }
    return `${indent}${parts.join(' ')}${lines}`;
  });
}

let typescript = null;

function loadTypescript() {
  if (typescript) return typescript;
  const tries = [() => cellRequire('typescript')];
  for (const dir of ['/usr/local/lib/node_modules', '/usr/lib/node_modules']) {
    tries.push(() => require(path.join(dir, 'typescript')));
  }
  tries.push(() => require(path.join(execFileSync('npm', ['root', '-g'], { encoding: 'utf8' }).trim(), 'typescript')));
  for (const t of tries) {
    try {
      typescript = t();
      return typescript;
    } catch {
      // Next place.
    }
  }
  throw new Error('the typescript package is not installed in this sandbox (npm install -g typescript)');
}

// Erases a cell's types; imports stay for esmImports, top-level await stays as written.
function transpile(code) {
  const ts = loadTypescript();
  const out = ts.transpileModule(code, {
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.ESNext,
      verbatimModuleSyntax: false,
      isolatedModules: true,
      sourceMap: false,
    },
    reportDiagnostics: false,
  }).outputText;
  return out.replace(/^export \{\};?\s*$/m, '').replace(/\n\/\/# sourceMappingURL=.*$/, '');
}

function compile(code, filename) {
  const { code: rewritten } = rewrite(code, tokenize(code));
  for (const src of rewritten === code ? [code] : [rewritten, code]) {
    try {
      return { script: new vm.Script(src, { filename }), async: false };
    } catch (err) {
      if (!(err instanceof SyntaxError)) throw err;
    }
  }
  let original;
  try {
    new vm.Script(code, { filename }); // eslint-disable-line no-new
  } catch (err) {
    original = err;
  }
  if (/\bawait\b/.test(code)) {
    try {
      return { script: asyncScript(code, filename), async: true };
    } catch {
      // Report the error of the cell as written, not of the wrapper.
    }
  }
  throw original;
}

async function evaluate(code, filename) {
  const { script, async } = compile(code, filename);
  const exportsSlot = Symbol.for(EXPORTS_KEY);
  delete globalThis[exportsSlot];
  try {
    const value = script.runInThisContext({ breakOnSigint: true, displayErrors: true });
    if (!async) return value;
    const interrupted = new Promise((_, reject) => { interruptCell = () => reject(new Interrupted()); });
    return await Promise.race([value, interrupted]);
  } finally {
    const copyOut = globalThis[exportsSlot];
    delete globalThis[exportsSlot];
    if (typeof copyOut === 'function') copyOut();
  }
}


async function runCell(id, code, vars, scoped) {
  syncOutput(id);
  count += 1;
  const filename = `${CELL_PREFIX}${count}>`;
  cellSources.set(count, code.split('\n'));
  for (const [k, v] of Object.entries(vars)) env[k] = String(v);
  // Scoped variables hold for this cell only: afterwards each gets back its earlier value.
  const saved = Object.keys(scoped).map((k) => [k, k in env ? env[k] : undefined]);
  for (const [k, v] of Object.entries(scoped)) env[k] = String(v);
  try {
    const value = await evaluate(esmImports(TYPESCRIPT ? transpile(code) : code), filename);
    if (value !== undefined) emitResult(bundle(value), true);
  } catch (err) {
    let described;
    try {
      described = describe(err);
    } catch {
      described = { name: 'Error', value: 'unprintable error', traceback: '' };
    }
    syncOutput();
    send({ type: 'error', id: outputId, ...described });
  } finally {
    interruptCell = null;
    for (const [k, v] of saved) {
      if (v === undefined) delete env[k];
      else env[k] = v;
    }
  }
  syncOutput();
  send({ type: 'end', id, execution_count: count });
}

function protocolError(id, message) {
  send({ type: 'error', id, name: 'ProtocolError', value: message, traceback: message });
  if (id !== null) send({ type: 'end', id, execution_count: count });
}

const queue = [];
let running = false;
let inputDone = false;

async function drainQueue() {
  if (running) return;
  running = true;
  while (queue.length) {
    const req = queue.shift();
    await runCell(req.id, req.code, req.env, req.scoped);
  }
  running = false;
  if (inputDone) finish();
}

function finish() {
  syncOutput();
  process.exit(0);
}

function handleLine(line) {
  if (!line.trim()) return;
  let req;
  try {
    req = parse(line);
  } catch (err) {
    protocolError(null, `request is not JSON: ${err.message}`);
    return;
  }
  const id = req && typeof req === 'object' && typeof req.id === 'string' ? req.id : null;
  if (id === null) return protocolError(null, 'request needs a string "id"');
  if (typeof req.code !== 'string') return protocolError(id, 'request needs a string "code"');
  const envMap = (m) => (m === undefined || m === null ? {} : m);
  const okEnv = (vars) => typeof vars === 'object' && !Array.isArray(vars)
    && Object.entries(vars).every(([k, v]) => k && !k.includes('=') && !k.includes('\0')
      && ['string', 'number', 'boolean'].includes(typeof v) && !String(v).includes('\0'));
  const vars = envMap(req.env);
  const scoped = envMap(req.scoped_env);
  if (!okEnv(vars) || !okEnv(scoped)) return protocolError(id, '"env" and "scoped_env" must map names to strings');
  queue.push({ id, code: req.code, env: vars, scoped });
  drainQueue();
}

function readRequests() {
  let input;
  try {
    input = new (require('net').Socket)({ fd: fds.requests, readable: true, writable: false });
  } catch {
    input = fs.createReadStream(null, { fd: fds.requests, autoClose: false });
  }
  const decoder = new StringDecoder('utf8');
  let buffered = '';
  input.on('data', (chunk) => {
    buffered += decoder.write(chunk);
    let nl;
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl);
      buffered = buffered.slice(nl + 1);
      handleLine(line);
    }
  });
  const end = () => {
    if (inputDone) return;
    if (buffered.trim()) handleLine(buffered);
    inputDone = true;
    if (!running) finish();
  };
  input.on('end', end);
  input.on('error', end);
}

process.on('SIGINT', () => {
  if (interruptCell) interruptCell();
});
process.on('uncaughtException', (err) => {
  try {
    process.stderr.write(`Uncaught ${describe(err).traceback}\n`);
  } catch {
    // Reporting must never take the kernel down.
  }
});
process.on('unhandledRejection', (reason) => {
  try {
    process.stderr.write(`Uncaught (in promise) ${describe(reason).traceback}\n`);
  } catch {
    // As above.
  }
});

for (const name of (env.GLOVEBOX_PRELOAD || '').split(',')) {
  if (name.trim()) {
    try {
      globalThis.require(name.trim());
    } catch {
      // Preloading is only a warm-up.
    }
  }
}
if (TYPESCRIPT) {
  try {
    loadTypescript();
  } catch {
    // Reported with the first cell.
  }
}
syncOutput(null, true);
send({ type: 'ready', language: TYPESCRIPT ? 'typescript' : 'javascript' });
readRequests();
