// The official @vercel/sandbox SDK (pinned in package.json), unmodified, against Glovebox.
// The only Glovebox-specific lines are the configuration: a fetch that sends the SDK's
// requests to the daemon, and the key as the token. Prints one `ok:` line per check.
//
// Env: GLOVEBOX_URL, GLOVEBOX_API_KEY; GLOVEBOX_TEST_CANARY_LOG (the test internet's log),
// GLOVEBOX_TEST_SECRET (a credential only the broker may send).
import { existsSync, readFileSync } from "node:fs";
import { APIError, Sandbox, Snapshot } from "@vercel/sandbox";
import { check, done, sdkError } from "./checks.mjs";

// --- The configuration (docs/vercel.md) ---
const GLOVEBOX = process.env.GLOVEBOX_URL;
const glovebox = (url, { dispatcher, ...init } = {}) =>
  fetch(String(url).replace("https://vercel.com/api", `${GLOVEBOX}/vercel`), init);
const creds = { token: process.env.GLOVEBOX_API_KEY, teamId: "glovebox", projectId: "glovebox", fetch: glovebox };

// --- The seed program, unchanged but for `...creds` ---
async function runCode(code, budgetMs) {
  const sandbox = await Sandbox.create({
    ...creds,
    timeout: 60_000,
    resources: { vcpus: 1 },
    networkPolicy: "deny-all",
    persistent: false,
  });
  try {
    await sandbox.writeFiles([{ path: "agent-code.mjs", content: Buffer.from(code) }]);
    const cmd = await sandbox.runCommand("node", ["/vercel/sandbox/agent-code.mjs"], {
      signal: AbortSignal.timeout(budgetMs),
    });
    return { exitCode: cmd.exitCode, stdout: await cmd.stdout(), stderr: await cmd.stderr() };
  } finally {
    await sandbox.stop();
  }
}

const CANARY = "http://198.51.100.10:8080/";
// The test internet's log (it appears with the first event).
const inetLog = () => {
  const f = process.env.GLOVEBOX_TEST_CANARY_LOG;
  return existsSync(f) ? readFileSync(f, "utf8").split("\n") : [];
};
const canaryHits = () => inetLog().filter((l) => l.includes('"port": 8080')).length;
const probe = `
try {
  const r = await fetch(${JSON.stringify(CANARY)}, { signal: AbortSignal.timeout(5000) });
  console.log("reached", r.status, await r.text());
} catch (e) { console.log("blocked", e.cause?.code ?? e.name); }
`;
const poll = async (what, f, ms = 10_000) => {
  const end = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > end) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
};
const isClientError = (e) => e instanceof APIError && e.response.status >= 400 && e.response.status < 500;

// 1. The seed: output and exit code.
let t = Date.now();
const r = await runCode(`console.log("sum", [1, 2, 3].reduce((a, b) => a + b)); console.error("warn"); process.exit(3);`, 10_000);
check("seed runCode: stdout", r.stdout === "sum 6\n", r);
check("seed runCode: stderr", r.stderr === "warn\n", r);
check("seed runCode: exit code", r.exitCode === 3, r);
console.log(`seed runCode took ${Date.now() - t} ms`);

// 2. deny-all (the seed's policy): the canary sees nothing.
let before = canaryHits();
const denied = await runCode(probe, 15_000);
check("deny-all: the sandbox cannot reach the canary", denied.stdout.startsWith("blocked"), denied);
check("deny-all: the canary saw nothing", canaryHits() === before);

// 3. A budget overrun: the aborted call rejects and the command dies.
t = Date.now();
const over = await sdkError(() => runCode("for (;;) {}", 1000));
check("over budget: runCode rejects", over !== null && /abort|timeout/i.test(`${over.name} ${over.message}`), String(over));
// The loop never ends and the sandbox lives 60 s: only the abort can end the call sooner.
check("over budget: rejected by the budget", Date.now() - t < 30_000, Date.now() - t);
console.log(`over-budget runCode rejected after ${Date.now() - t} ms (budget 1000 ms)`);
{
  const sb = await Sandbox.create({ ...creds, timeout: 60_000, networkPolicy: "deny-all", persistent: false });
  try {
    await sb.writeFiles([{ path: "spin.mjs", content: "for (;;) {}" }]);
    const e = await sdkError(() => sb.runCommand("node", ["spin.mjs"], { signal: AbortSignal.timeout(1000) }));
    check("abort: the call rejects", e !== null, String(e));
    // `ps` must list itself, so an empty listing cannot pass for "gone".
    const gone = await poll("spin gone", async () => {
      const ps = await (await sb.runCommand("ps", ["-eo", "args"])).stdout();
      return ps.includes("ps -eo args") && !ps.includes("spin.mjs");
    });
    check("abort: the command's process is gone from the sandbox", gone);
  } finally {
    await sb.stop();
  }
}

// 4. Install then lock down: allow-all, then a live update to deny-all.
{
  const sb = await Sandbox.create({ ...creds, persistent: false });
  try {
    check("default policy is allow-all", sb.currentSession().networkPolicy === "allow-all", sb.currentSession().networkPolicy);
    await sb.writeFiles([{ path: "probe.mjs", content: probe }]);
    before = canaryHits();
    const open = await sb.runCommand("node", ["probe.mjs"]);
    check("allow-all: the canary answers", (await open.stdout()).startsWith("reached 200"), await open.stdout());
    check("allow-all: the canary saw it", canaryHits() > before);
    await sb.update({ networkPolicy: "deny-all" });
    before = canaryHits();
    const shut = await sb.runCommand("node", ["probe.mjs"]);
    check("after update to deny-all: blocked", (await shut.stdout()).startsWith("blocked"), await shut.stdout());
    check("after update: the canary saw nothing", canaryHits() === before);

    // Files: mkDir, writeFiles, readFile.
    await sb.mkDir("data/nested");
    await sb.writeFiles([{ path: "data/nested/in.txt", content: "héllo\n" }, { path: "/tmp/abs.txt", content: "abs" }]);
    const back = await sb.readFileToBuffer({ path: "data/nested/in.txt" });
    check("readFile gives back what writeFiles wrote", back?.toString() === "héllo\n", back?.toString());
    const abs = await sb.readFileToBuffer({ path: "/tmp/abs.txt" });
    check("absolute paths are written where they say", abs?.toString() === "abs");
    check("readFile of a missing file is null", (await sb.readFileToBuffer({ path: "nope.txt" })) === null);
    const ls = await sb.runCommand("sh", ["-c", "pwd; cat data/nested/in.txt"]);
    check("commands start in /vercel/sandbox", (await ls.stdout()) === "/vercel/sandbox\nhéllo\n", await ls.stdout());

    // Detached commands: logs() streams, wait() gives the exit code, kill() ends one.
    const cmd = await sb.runCommand({ cmd: "sh", args: ["-c", "echo one; sleep 0.3; echo two >&2; exit 4"], detached: true });
    check("detached: returns before the command ends", cmd.exitCode === null);
    const lines = [];
    for await (const l of cmd.logs()) lines.push(`${l.stream}:${l.data}`);
    check("logs() streams both streams in order", lines.join("") === "stdout:one\nstderr:two\n", lines);
    const done = await cmd.wait();
    check("wait() gives the exit code", done.exitCode === 4, done.exitCode);
    check("output after wait()", (await done.stdout()) === "one\n" && (await done.stderr()) === "two\n");
    const env = await sb.runCommand({ cmd: "sh", args: ["-c", "echo $GREETING"], env: { GREETING: "hi" }, cwd: "/tmp" });
    check("env and cwd are passed", (await env.stdout()) === "hi\n");
    const sleeper = await sb.runCommand({ cmd: "sleep", args: ["60"], detached: true });
    await sleeper.kill("SIGKILL");
    const killed = await sleeper.wait();
    check("kill() ends a detached command", killed.exitCode === 137, killed.exitCode);

    // Bad input: the SDK's own error type, never a 5xx.
    const bad = await sdkError(() => sb.readFileToBuffer({ path: "../../etc/passwd" }));
    check("a '..' path is a 4xx APIError", isClientError(bad), String(bad));
    const snap = await sdkError(() => sb.snapshot());
    check("snapshot() is answered as not supported", isClientError(snap) && snap.json?.error?.code === "not_supported", String(snap));
    const listSnaps = await sdkError(() => Snapshot.list({ ...creds }));
    check("Snapshot.list is answered as not supported", isClientError(listSnaps) && /snapshots/.test(listSnaps.message), String(listSnaps));
    const stillThere = await sb.runCommand("true");
    check("the sandbox works on after refused calls", stillThere.exitCode === 0);
  } finally {
    await sb.stop();
  }
}

// 5. An allow-list, and brokering in Vercel's shape: the header is added outside the sandbox.
{
  const secret = process.env.GLOVEBOX_TEST_SECRET;
  const sb = await Sandbox.create({
    ...creds,
    persistent: false,
    networkPolicy: {
      allow: { "api.good.test:8443": [{ transform: [{ headers: { Authorization: `Bearer ${secret}` } }] }] },
    },
  });
  try {
    const get = `require("https").get("https://api.good.test:8443/vercel-brokered", (r) => { let b = ""; r.on("data", (d) => (b += d)); r.on("end", () => console.log(r.statusCode, b)); }).on("error", (e) => console.log("error", e.message));`;
    const res = await sb.runCommand("node", ["-e", get]);
    check("brokered domain answers", (await res.stdout()) === "200 ok\n", [await res.stdout(), await res.stderr()]);
    const seen = inetLog()
      .filter((l) => l.includes("/vercel-brokered"))
      .map((l) => JSON.parse(l));
    check("the server got the brokered header", seen.length === 1 && seen[0].authorization === `Bearer ${secret}`, seen);
    const inside = await sb.runCommand("sh", ["-c", "env; cat /proc/1/environ 2>/dev/null; grep -rs . /etc/ssl /tmp | head -c 200000"]);
    check("the secret is nowhere the sandbox can read", !(await inside.output("both")).includes(secret));
    check("the policy shows header names, not values", !JSON.stringify(sb.currentSession().networkPolicy).includes(secret));
    before = canaryHits();
    await sb.writeFiles([{ path: "probe.mjs", content: probe }]);
    const other = await sb.runCommand("node", ["probe.mjs"]);
    check("allow-list: other addresses are blocked", !(await other.stdout()).includes("reached"), await other.stdout());
    check("allow-list: the canary saw nothing", canaryHits() === before);
  } finally {
    await sb.stop();
  }
}

// 5b. An allow-list in the list form: the named domain (and port) only.
{
  const sb = await Sandbox.create({ ...creds, persistent: false, networkPolicy: { allow: ["api.good.test:8443"] } });
  try {
    // The sandbox does not trust the test internet's CA (only the daemon does): no verification.
    const get = `require("https").get("https://api.good.test:8443/vercel-allowed", { rejectUnauthorized: false }, (r) => { r.resume(); r.on("end", () => console.log(r.statusCode)); }).on("error", (e) => console.log("error", e.message));`;
    const res = await sb.runCommand("node", ["-e", get]);
    check("allow-list: the listed domain answers", (await res.stdout()) === "200\n", [await res.stdout(), await res.stderr()]);
    const seen = inetLog().filter((l) => l.includes("/vercel-allowed")).map((l) => JSON.parse(l));
    check("allow-list: the server saw the request, without a credential", seen.length === 1 && !seen[0].authorization, seen);
    before = canaryHits();
    await sb.writeFiles([{ path: "probe.mjs", content: probe }]);
    const other = await sb.runCommand("node", ["probe.mjs"]);
    check("allow-list: another port of the same address is blocked", (await other.stdout()).startsWith("blocked"), await other.stdout());
    check("allow-list: the canary saw nothing", canaryHits() === before);
  } finally {
    await sb.stop();
  }
}

// 6. Bad input and unsupported options: APIError with a 4xx.
for (const [what, params] of [
  ["an unknown runtime", { runtime: "ruby3.3" }],
  ["a persistent sandbox", { persistent: true }],
  ["a port out of range", { ports: [70000] }],
  ["too many vCPUs", { resources: { vcpus: 1000 } }],
  ["a forwarding rule", { networkPolicy: { allow: { "a.test": [{ forwardURL: "https://b.test" }] } } }],
]) {
  const e = await sdkError(() => Sandbox.create({ ...creds, persistent: false, ...params }));
  check(`create with ${what}: a 4xx APIError`, isClientError(e), e && `${e.response?.status} ${e.message}`);
}
const missing = await sdkError(() => Sandbox.get({ ...creds, name: "no-such-sandbox" }));
check("get of an unknown sandbox: 404 APIError", missing instanceof APIError && missing.response.status === 404, String(missing));
const badKey = await sdkError(() => Sandbox.create({ ...creds, token: "wrong", persistent: false }));
check("a wrong key: 4xx APIError", isClientError(badKey), String(badKey));

done("sdk");
