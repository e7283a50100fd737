// Drives the dashboard (/ui) in Debian's Chromium, headless, over the DevTools protocol
// (playwright-core, pinned by setup.sh), as a person would: logs in, watches a sandbox the
// API created appear, opens it, types into its terminal, runs a command, sees a denied
// connection in the egress audit, downloads a file, reads the daemon's figures, runs code
// cells, kills it.
// One `ok:` line per check; a screenshot per step into GB_SHOTS. Run by tests/dashboard.rs.
import fs from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const URL_ = env('GB_URL');
const KEY = env('GB_KEY');
const NET = env('GB_NET'); // the test internet's allowed server
const EVIL = env('GB_EVIL'); // another of its addresses, which no rule allows
const PROFILE = env('GB_PROFILE');
const SHOTS = env('GB_SHOTS');
const CHROMIUM = process.env.GB_CHROMIUM || '/usr/bin/chromium';
const STEP_MS = 20000;

function ok(what) {
  console.log(`ok: ${what}`);
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  ok(what);
}

async function api(method, p, body) {
  const r = await fetch(`${URL_}${p}`, {
    method,
    headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(STEP_MS),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
  return { status: r.status, json, text };
}

let ctx = null;
let sandbox = null;
const problems = [];
try {
  ctx = await chromium.launchPersistentContext(PROFILE, {
    executablePath: CHROMIUM,
    headless: true,
    // Chromium refuses to run as root without --no-sandbox (CI runs as root).
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--no-first-run', '--no-default-browser-check'],
    viewport: { width: 1280, height: 860 },
    acceptDownloads: true,
    timeout: 60000,
  });
  const page = ctx.pages()[0] || (await ctx.newPage());
  page.setDefaultTimeout(STEP_MS);
  page.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  page.on('pageerror', (e) => problems.push(`page error: ${e}`));
  // Hostile output that became markup would show here: a dialog, or a request for its `src=x`.
  page.on('dialog', (d) => {
    problems.push(`dialog: ${d.type()} ${d.message()}`);
    d.dismiss().catch(() => {});
  });
  page.on('request', (r) => { if (/\/x$/.test(new URL(r.url()).pathname)) problems.push(`fetched ${r.url()}`); });
  fs.mkdirSync(SHOTS, { recursive: true });
  const shot = async (name) => {
    const file = path.join(SHOTS, `${name}.png`);
    await page.screenshot({ path: file });
    ok(`screenshot ${name}.png`);
  };
  const text = (sel) => page.locator(sel).first().textContent();

  // The page: served without a key, with a strict policy.
  const resp = await page.goto(`${URL_}/ui`);
  check(resp.status() === 200, '/ui answers 200 without a key');
  const h = resp.headers();
  check((h['content-type'] || '').startsWith('text/html'), `/ui is text/html (${h['content-type']})`);
  const csp = h['content-security-policy'] || '';
  check(csp.includes("default-src 'self'") && csp.includes("script-src 'self'") && !csp.includes('unsafe'),
    `a strict Content-Security-Policy: ${csp}`);
  const js = await api('GET', '/ui/app.js');
  check(js.status === 200 && js.text.includes('class Screen'), '/ui/app.js is served');

  // Log in: a wrong key is refused, the right one opens the list and is kept per tab.
  await page.locator('#login-view').waitFor({ state: 'visible' });
  await page.fill('#key', 'e2b_0000000000000000000000000000000000000000');
  await page.click('#login-form button[type=submit]');
  await page.waitForFunction(() => /refused/.test(document.getElementById('login-error').textContent));
  check(await page.locator('#list-view').isHidden(), 'a wrong key is refused');
  await page.fill('#key', KEY);
  await shot('01-login');
  await page.click('#login-form button[type=submit]');
  await page.locator('#list-view').waitFor({ state: 'visible' });
  check(await page.evaluate(() => sessionStorage.getItem('glovebox.key')) === KEY,
    'logged in; the key is in sessionStorage');

  // A sandbox created through the API appears, with its sparklines filling.
  const hostile = '<img src=x onerror="window.__pwned=1">';
  const created = await api('POST', '/v1/sandboxes', {
    timeout_s: 300,
    network: { mode: 'allow-list', allow: [`${NET}/32:8080`] },
    metadata: { note: hostile },
  });
  check(created.status === 201, `created a sandbox through the API (${created.status})`);
  sandbox = created.json.id;
  console.log(`sandbox: ${sandbox}`);
  // Some work in the background for the sparklines to show (ends within 8 s).
  const busy = await api('POST', `/v1/sandboxes/${sandbox}/exec`, {
    cmd: ['sh', '-c', 'for i in 1 2 3 4; do timeout 1 sh -c "while :; do :; done"; head -c 8000000 /dev/zero | tail -c 1 >/dev/null; sleep 1; done'],
    background: true,
  });
  check(busy.status === 202, 'started a background command');
  const rowSel = `#sandboxes tr[data-id="${sandbox}"]`;
  await page.locator(rowSel).waitFor({ timeout: 10000 });
  ok('the new sandbox appears in the list');
  const cells = await page.locator(`${rowSel} td`).allTextContents();
  check(cells[0] === sandbox && cells[1] === 'running' && cells[2] === 'base', `its row: ${cells.slice(0, 4).join(' | ')}`);
  await page.waitForFunction((sel) => {
    const s = document.querySelectorAll(`${sel} svg.spark`);
    return s.length === 2 && [...s].every((x) => Number(x.dataset.points) >= 4);
  }, rowSel);
  ok('CPU and memory sparklines have four samples or more');
  await shot('02-sandboxes');

  // Open it.
  await page.click(`${rowSel} a`);
  await page.waitForFunction((id) => document.getElementById('sb-id').textContent === id, sandbox);
  // The facts are filled when the sandbox's first poll answers, after the id is shown.
  await page.waitForFunction((h) => (document.getElementById('sb-facts').textContent || '').includes(h), hostile,
    { timeout: 10000 }).catch(() => {});
  check((await text('#sb-facts')).includes(hostile), 'hostile labels are shown as text');
  check(await page.evaluate(() => window.__pwned === undefined && !document.querySelector('main img')),
    'and not as markup');

  // The terminal: a login shell on a PTY over the WebSocket; type a command, read its output.
  await page.click('#term-open');
  await page.waitForFunction(() => /attached/.test(document.getElementById('term-status').textContent));
  await page.waitForFunction(() => document.getElementById('term').textContent.trim().length > 0);
  await page.locator('#term').click();
  await page.keyboard.type('echo "answer: $((6*7))"');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.getElementById('term').textContent.includes('answer: 42'));
  ok('a command typed in the browser terminal printed its output');
  await page.keyboard.type("printf '\\033[1;31m<b>red</b>\\033[0m done\\n'");
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.getElementById('term').textContent.includes('<b>red</b> done'));
  const term = await text('#term');
  const shown = term.split('\n').filter((l) => l.includes('<b>red</b> done') && !l.includes('printf'));
  check(shown.length === 1 && shown[0].trim() === '<b>red</b> done' && !term.includes('\u001b'),
    `escape sequences are interpreted, not shown: ${JSON.stringify(shown)}`);
  check(await page.locator('#term b').count() === 0, 'terminal output stays text');
  await page.keyboard.type('uname -sr; echo "size: $(stty size)"');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.getElementById('term').textContent.includes('size: 28 100'));
  ok('the terminal has the size the page asked for');
  await shot('03-terminal');

  // Commands: run one from the form (live output), and try a connection the policy denies.
  await page.click('#tabs button[data-tab=commands]');
  const attempt = `timeout 5 bash -c 'exec 3<>/dev/tcp/${EVIL}/80' 2>/dev/null && echo connected || echo blocked; echo 'done <script>x</script>'`;
  await page.fill('#exec-cmd', attempt);
  await page.click('#exec-form button[type=submit]');
  await page.waitForFunction(() => /^exit/.test(document.getElementById('exec-status').textContent), null,
    { timeout: 30000 });
  const out = await text('#exec-out');
  check(out.includes('blocked') && !out.includes('connected'), `the connection was refused: ${out.trim()}`);
  check(out.includes('done <script>x</script>'), 'the command\'s output is shown as text');
  await page.waitForFunction(() => [...document.querySelectorAll('#events td')].some((t) => t.textContent === 'created'));
  ok('the lifecycle events list the sandbox\'s creation');
  // The terminal's shell is a command of the sandbox's own (a foreground exec is not kept
  // in the agent's list once it ended).
  await page.waitForFunction(() => [...document.querySelectorAll('#commands tr')]
    .some((r) => r.cells[0].textContent === document.getElementById('term').dataset.cid && r.cells[2].textContent === 'running'));
  ok('the commands list shows the terminal\'s shell, running');
  await shot('04-commands');

  // Network: the policy and the audit, with the denied attempt in it.
  await page.click('#tabs button[data-tab=network]');
  await page.waitForFunction((ip) => [...document.querySelectorAll('#egress tr[data-verdict=denied]')]
    .some((r) => r.textContent.includes(ip)), EVIL);
  const denied = await page.locator('#egress tr[data-verdict=denied]').filter({ hasText: EVIL }).first()
    .locator('td').allTextContents();
  check(denied[1] === 'tcp' && denied[3] === EVIL && denied[4] === '80' && denied[5] === 'denied',
    `the egress view shows the denied connection: ${denied.join(' | ')}`);
  check((await text('#policy')).includes(`${NET}/32:8080`), 'the policy is shown');
  await shot('05-network');

  // Files: browse a directory, download a file through the files API.
  const token = Math.random().toString(36).slice(2);
  const made = await api('POST', `/v1/sandboxes/${sandbox}/exec`, {
    cmd: ['sh', '-c', `printf 'report %s\\n' ${token} > /home/user/report.txt && mkdir -p /home/user/data && touch '/home/user/${hostile}'`],
  });
  check(made.status === 200 && made.json.exit_code === 0, 'wrote files through the API');
  await page.click('#tabs button[data-tab=files]');
  await page.click('#files-form button[type=submit]');
  await page.locator('#files tr[data-name="report.txt"]').waitFor();
  check(await page.locator('#files tr[data-name="data"]').count() === 1, 'the directory listing shows files and directories');
  check(await page.evaluate((n) => [...document.querySelectorAll('#files tr')].some((r) => r.dataset.name === n), hostile)
    && await page.evaluate(() => window.__pwned === undefined && !document.querySelector('#files img')),
  'a hostile file name is listed as text');
  const [dl] = await Promise.all([
    page.waitForEvent('download'),
    page.click('#files tr[data-name="report.txt"] button'),
  ]);
  const got = fs.readFileSync(await dl.path(), 'utf8');
  check(dl.suggestedFilename() === 'report.txt' && got === `report ${token}\n`, `downloaded report.txt: ${JSON.stringify(got)}`);
  await shot('06-files');

  // Usage: the sandbox's charts and metered figures.
  await page.click('#tabs button[data-tab=usage]');
  await page.waitForFunction(() => document.querySelectorAll('#usage dd').length >= 5
    && Number(document.getElementById('cpu-chart').dataset.points) >= 2);
  ok('usage and CPU/memory charts are shown');
  await shot('07-usage');

  // The daemon's Prometheus figures.
  await page.click('nav a[href="#/daemon"]');
  await page.waitForFunction(() => {
    const m = document.querySelector('[data-metric="glovebox_sandboxes_created_total"] .v');
    return m && Number(m.textContent) >= 1;
  });
  ok('the daemon view shows glovebox_sandboxes_created_total >= 1');
  await page.waitForFunction(() => [...document.querySelectorAll('#histograms td')].some((t) => t.textContent === 'glovebox_create_seconds'));
  ok('and the create latency histogram');
  await shot('08-daemon');

  // Code cells: run Python from the sandbox's page. Output streams in as the cell runs; a
  // PNG result is an <img>; hostile output (printed, as text/html, as a value) stays text.
  await page.goto(`${URL_}/ui#/sandbox/${sandbox}/code`);
  await page.waitForFunction((id) => document.getElementById('sb-id').textContent === id, sandbox);
  await page.locator('#code-src').waitFor({ state: 'visible' });
  check(await page.locator('#code-lang').inputValue() === 'python', 'the code view is open, python by default');
  const submitCell = async (code) => {
    const before = await page.locator('#cells .cell').count();
    await page.fill('#code-src', code);
    await page.click('#code-form button[type=submit]');
    await page.waitForFunction((n) => document.querySelectorAll('#cells .cell').length === n + 1, before);
  };
  const ranCell = async () => {
    await page.waitForFunction(() => document.querySelector('#cells .cell').dataset.state !== 'running', null,
      { timeout: 60000 });
    return page.locator('#cells .cell').first().evaluate((c) => ({
      state: c.dataset.state,
      count: c.dataset.count,
      head: c.querySelector('.count').textContent,
      stdout: [...c.querySelectorAll('pre.stdout')].map((p) => p.textContent).join(''),
      main: [...c.querySelectorAll('.result.main pre[data-mime="text/plain"]')].map((p) => p.textContent),
      html: [...c.querySelectorAll('pre[data-mime="text/html"]')].map((p) => p.textContent),
      imgs: [...c.querySelectorAll('img')].map((i) => ({ src: i.src.slice(0, 22), w: i.naturalWidth, h: i.naturalHeight })),
      error: c.dataset.error || null,
    }));
  };
  await submitCell('x = 6*7\nprint("hi")\nx');
  const c1 = await ranCell();
  check(c1.state === 'done' && c1.stdout === 'hi\n' && c1.main.length === 1 && c1.main[0] === '42',
    `a cell printed hi and returned 42: ${JSON.stringify(c1)}`);
  check(/^[1-9][0-9]*$/.test(c1.count) && c1.head === `[${c1.count}]`, `with its execution count ${c1.head}`);
  // Streamed: the first line shows while the cell still sleeps.
  await submitCell('import time\nprint("early", flush=True)\ntime.sleep(2)\nprint("late")\nx + 1');
  await page.waitForFunction(() => {
    const c = document.querySelector('#cells .cell');
    const out = [...c.querySelectorAll('pre.stdout')].map((p) => p.textContent).join('');
    return c.dataset.state === 'running' && out.includes('early') && !out.includes('late');
  }, null, { timeout: 30000 });
  const c2 = await ranCell();
  check(c2.state === 'done' && c2.stdout === 'early\nlate\n' && c2.main[0] === '43' && Number(c2.count) === Number(c1.count) + 1,
    `stdout appears as the cell runs, and state is kept between cells: ${JSON.stringify(c2)}`);
  const evil = '<img src=x onerror=alert(1)>';
  await submitCell(`s = '${evil}'\nclass Page:\n    def _repr_html_(self):\n        return s\nprint(s)\ndisplay(Page())\ns`);
  const hostileCell = await ranCell();
  check(hostileCell.state === 'done' && hostileCell.stdout === `${evil}\n` && hostileCell.html.length === 1 && hostileCell.html[0] === evil
    && hostileCell.main[0] === `'${evil}'`, `hostile output, printed, as text/html and as a value, is shown as text: ${JSON.stringify(hostileCell)}`);
  await page.waitForTimeout(300);
  check(hostileCell.imgs.length === 0 && !problems.some((p) => /dialog|fetched|Content Security Policy|page error/.test(p)),
    `and is not markup: no element, no dialog, no request for its src (${problems.join('; ')})`);
  await submitCell('1/0');
  const errorCell = await ranCell();
  check(errorCell.state === 'error' && errorCell.error === 'ZeroDivisionError'
    && (await text('#cells .cell .cell-error')).includes('division by zero'), `an error shows its name, value and traceback: ${errorCell.error}`);
  // A PNG from the standard library, shown through the display protocol (_repr_png_): the
  // base template has no matplotlib.
  await submitCell(String.raw`import struct, zlib
class Swatch:
    def _repr_png_(self):
        w, h = 160, 48
        rows = b''.join(b'\x00' + bytes(v for x in range(w) for v in (x * 255 // w, y * 5, 160)) for y in range(h))
        def chunk(t, d):
            return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
        return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))
Swatch()`);
  const imageCell = await ranCell();
  check(imageCell.state === 'done' && imageCell.imgs.length === 1 && imageCell.imgs[0].src === 'data:image/png;base64,'
    && imageCell.imgs[0].w === 160 && imageCell.imgs[0].h === 48, `an image/png result is shown as an image: ${JSON.stringify(imageCell.imgs)}`);
  // The cells stay while the page does (another tab and back).
  await page.click('#tabs button[data-tab=commands]');
  await page.click('#tabs button[data-tab=code]');
  await page.locator('#code-src').waitFor({ state: 'visible' });
  const heads = await page.locator('#cells .cell .count').allTextContents();
  check(heads.length === 5 && heads[4] === c1.head, `the page keeps its cells, newest first: ${heads.join(' ')}`);
  await page.fill('#code-src', 'x = 6*7\nprint("hi")\nx');
  await page.evaluate(() => document.getElementById('tabs').scrollIntoView());
  await shot('09-code');

  // Kill it from its page: gone from the list, and the API says it ended.
  await page.goto(`${URL_}/ui#/sandbox/${sandbox}`);
  await page.waitForFunction((id) => document.getElementById('sb-id').textContent === id, sandbox);
  await page.click('#sb-kill');
  await page.locator('#list-view').waitFor({ state: 'visible' });
  await page.waitForFunction((sel) => !document.querySelector(sel), rowSel);
  const gone = await api('GET', `/v1/sandboxes/${sandbox}`);
  check(gone.status === 410, `killed from the page: the API answers ${gone.status}`);
  sandbox = null;

  // Log out: the key leaves the tab.
  await page.click('#logout');
  await page.locator('#login-view').waitFor({ state: 'visible' });
  check(await page.evaluate(() => sessionStorage.getItem('glovebox.key')) === null, 'logging out forgets the key');

  const csp_hits = problems.filter((p) => /Content Security Policy|page error|dialog|fetched/i.test(p));
  check(csp_hits.length === 0, `no policy violation nor script error (${csp_hits.join('; ')})`);
} finally {
  if (ctx) await ctx.close().catch((e) => console.error(`closing the browser: ${e}`));
  if (sandbox) await api('DELETE', `/v1/sandboxes/${sandbox}`).catch(() => {});
  if (problems.length) console.error(`browser console errors:\n${problems.join('\n')}`);
}
