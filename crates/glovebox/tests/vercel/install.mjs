// "Install then lock down" with the official SDK: a sandbox with Vercel's default policy
// (allow-all) installs a package from the public npm registry, then a live update to
// deny-all cuts it off while the installed package keeps working. Prints `ok:` lines.
import { APIError, Sandbox } from "@vercel/sandbox";
import { check, done } from "./checks.mjs";

const GLOVEBOX = process.env.GLOVEBOX_URL;
const glovebox = (url, { dispatcher, ...init } = {}) =>
  fetch(String(url).replace("https://vercel.com/api", `${GLOVEBOX}/vercel`), init);
const creds = { token: process.env.GLOVEBOX_API_KEY, teamId: "glovebox", projectId: "glovebox", fetch: glovebox };

const sandbox = await Sandbox.create({ ...creds, runtime: "node22", persistent: false });
try {
  check("runtime node22 is reported", sandbox.currentSession().runtime === "node22");
  const again = await Sandbox.get({ ...creds, name: sandbox.name });
  check("Sandbox.get finds it", again.currentSession().sessionId === sandbox.currentSession().sessionId);
  const listed = await Sandbox.list({ ...creds });
  check("Sandbox.list lists it", JSON.stringify(listed.json ?? listed).includes(sandbox.name));
  const env = { HOME: "/tmp", npm_config_update_notifier: "false", npm_config_fund: "false", npm_config_audit: "false" };
  let t = Date.now();
  const install = await sandbox.runCommand({ cmd: "npm", args: ["install", "--no-package-lock", "mathjs"], env });
  check("npm install mathjs against the registry", install.exitCode === 0, [install.exitCode, await install.stderr()]);
  console.log(`npm install took ${Date.now() - t} ms`);
  await sandbox.update({ networkPolicy: "deny-all" });
  check("the policy is now deny-all", sandbox.currentSession().networkPolicy === "deny-all", sandbox.currentSession().networkPolicy);
  await sandbox.writeFiles([{ path: "use.mjs", content: 'import { evaluate } from "mathjs"; console.log(evaluate("sqrt(16) + 2^3"));' }]);
  const use = await sandbox.runCommand("node", ["use.mjs"]);
  check("the installed package works offline", (await use.stdout()) === "12\n", [await use.stdout(), await use.stderr()]);
  // (Not `npm view`: npm answers from its cache when the registry is unreachable.)
  const registry = `
try {
  const r = await fetch("https://registry.npmjs.org/mathjs", { signal: AbortSignal.timeout(5000) });
  console.log("reached", r.status);
} catch (e) { console.log("blocked", e.cause?.code ?? e.name); }
`;
  await sandbox.writeFiles([{ path: "registry.mjs", content: registry }]);
  const cut = await sandbox.runCommand("node", ["registry.mjs"]);
  check("after the update the registry is unreachable", (await cut.stdout()).startsWith("blocked"), await cut.stdout());
  // Lifetimes are kept to the second: within 2 s of what was asked.
  const near = (a, b) => Math.abs(a - b) <= 2000;
  const t0 = sandbox.currentSession().timeout;
  await sandbox.extendTimeout(60_000);
  const t1 = sandbox.currentSession().timeout;
  check("extendTimeout adds to the lifetime", near(t1, t0 + 60_000), [t0, t1]);
  await sandbox.update({ timeout: t1 + 30_000 });
  const t2 = sandbox.currentSession().timeout;
  check("update({ timeout }) moves the running sandbox's deadline once", near(t2, t1 + 30_000), [t1, t2]);
} finally {
  await sandbox.stop();
}
const stopped = await Sandbox.get({ ...creds, name: sandbox.name }).catch((e) => e);
check("a stopped sandbox is gone (404 APIError)", stopped instanceof APIError && stopped.response.status === 404);
done("install");
