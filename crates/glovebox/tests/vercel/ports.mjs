// Exposed ports through the official @vercel/sandbox SDK (pinned in package.json),
// unmodified: `Sandbox.create({ ports })`, `routes`, `domain(port)`, `update({ ports })`.
// A server inside a deny-all sandbox is reached at `sandbox.domain(port)` with a path
// appended, the scheme swapped to http: (the daemon serves plain HTTP; docs/vercel.md).
// Prints one `ok:` line per check.
//
// Env: GLOVEBOX_URL, GLOVEBOX_API_KEY.
import http from "node:http";
import { APIError, Sandbox } from "@vercel/sandbox";
import { check, done, sdkError } from "./checks.mjs";

// --- The configuration (docs/vercel.md) ---
const GLOVEBOX = process.env.GLOVEBOX_URL;
const KEY = process.env.GLOVEBOX_API_KEY;
const glovebox = (url, { dispatcher, ...init } = {}) =>
  fetch(String(url).replace("https://vercel.com/api", `${GLOVEBOX}/vercel`), init);
const creds = { token: KEY, teamId: "glovebox", projectId: "glovebox", fetch: glovebox };

const isBadRequest = (e) => e instanceof APIError && e.response.status === 400;

// A GET of `url` on the daemon (`*.localhost` names are resolved by browsers, not by this
// host's resolver: connect to the daemon and send the URL's host as `Host`).
const daemon = new URL(GLOVEBOX);
function get(url, headers = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: daemon.hostname, port: daemon.port, path: u.pathname + u.search, headers: { host: u.host, ...headers }, timeout: 10_000 },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (d) => (body += d));
        res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body }));
      },
    );
    req.on("timeout", () => req.destroy(new Error(`GET ${url}: timed out`)));
    req.on("error", reject);
    req.end();
  });
}
const plain = (u) => u.replace(/^https:/, "http:");
const json = (r) => {
  try {
    return JSON.parse(r.body);
  } catch {
    return null;
  }
};

// Answers every request with what it saw: which port, the path, and the headers that could
// carry a credential (none must reach it).
const SERVER = `
import http from "node:http";
for (const port of [3000, 3001]) {
  http.createServer((req, res) => {
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ port, url: req.url, cookie: req.headers.cookie ?? null,
      token: req.headers["x-glovebox-port-token"] ?? null, host: req.headers.host }));
  }).listen(port, "127.0.0.1");
}
`;

const sb = await Sandbox.create({ ...creds, ports: [3000, 3001], networkPolicy: "deny-all", persistent: false, timeout: 120_000 });
try {
  const id = sb.name;
  check("create answers a route per port", sb.routes.map((r) => r.port).join(",") === "3000,3001", sb.routes);
  const d3000 = sb.domain(3000);
  const d3001 = sb.domain(3001);
  const want = new RegExp(`^https://3000-${id}\\.localhost:${daemon.port}/gbp_[0-9a-f]{64}\\.vercel\\.run$`);
  check("domain(3000) is the port's preview host with its token", want.test(d3000), d3000);
  check("each port has its own token", d3000.split("/")[3] !== d3001.split("/")[3], [d3000, d3001]);
  check("a route's url is its http: address", sb.routes[0].url === plain(d3000), sb.routes[0]);
  const again = await Sandbox.get({ ...creds, name: id });
  check("get answers the same routes", again.domain(3000) === d3000, again.routes);

  await sb.writeFiles([{ path: "server.mjs", content: Buffer.from(SERVER) }]);
  await sb.runCommand({ cmd: "node", args: ["server.mjs"], detached: true });
  const end = Date.now() + 15_000;
  let r;
  for (;;) {
    r = await get(`${plain(d3000)}/api/x?q=1`);
    if (r.status === 200 || Date.now() > end) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  check("domain(3000) + a path reaches the server", r.status === 200, r);
  const seen = json(r);
  check("the server sees the path after the token, with the query", seen?.url === "/api/x?q=1" && seen?.port === 3000, seen);
  check("the token never reaches the server", !r.body.includes("gbp_"), r.body);
  const cookie = (r.headers["set-cookie"] ?? []).find((c) => c.startsWith("gb_token="));
  check("the token is kept in a cookie for the page's own links", cookie !== undefined, r.headers);
  const root = await get(plain(d3000));
  check("domain(3000) alone is the server's /", root.status === 200 && json(root)?.url === "/", root);

  const host3000 = new URL(plain(d3000)).host;
  const bare = await get(`http://${host3000}/api/x`);
  check("the port without its token is private (401)", bare.status === 401, bare);
  const token3001 = new URL(plain(d3001)).pathname.split("/")[1].replace(".vercel.run", "");
  const crossed = await get(`http://${host3000}/${token3001}.vercel.run/api/x`);
  check("another port's token is refused (401)", crossed.status === 401, crossed);
  const byCookie = await get(`http://${host3000}/page.css`, { cookie: cookie.split(";")[0] });
  check("the cookie opens the port", byCookie.status === 200 && json(byCookie)?.url === "/page.css", byCookie);
  check("...and is not passed on", json(byCookie)?.cookie === null, byCookie.body);
  const r3001 = await get(`${plain(d3001)}/y`);
  check("domain(3001) reaches the other port", r3001.status === 200 && json(r3001)?.port === 3001, r3001);

  // update({ ports }) is the whole list: 3000 goes, 3002 comes.
  await sb.update({ ports: [3001, 3002] });
  check("update({ ports }) replaces the routes", sb.routes.map((x) => x.port).join(",") === "3001,3002", sb.routes);
  check("domain() of a port taken off throws", (await sdkError(() => sb.domain(3000))) !== null);
  check("a kept port keeps its URL", sb.domain(3001) === d3001, sb.domain(3001));
  const badUpdate = await sdkError(() => sb.update({ ports: [70000] }));
  check("update with a bad port: 400 APIError", isBadRequest(badUpdate), badUpdate && `${badUpdate.response?.status} ${badUpdate.message}`);

  // A port made public (through Glovebox's own API) needs no credential at all.
  const pub = await fetch(`${GLOVEBOX}/v1/sandboxes/${id}/ports/3001`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ public: true }),
  });
  check("the native API makes 3001 public", pub.status === 200, pub.status);
  const open = await get(`http://${new URL(plain(d3001)).host}/z`);
  check("a public port answers without credentials", open.status === 200 && json(open)?.url === "/z", open);
  const stillOk = await get(`${plain(d3001)}/z`);
  check("...and domain(p), token and all, still works", stillOk.status === 200 && json(stillOk)?.url === "/z", stillOk);

  await sb.stop();
  const gone = await get(`${plain(d3001)}/z`);
  check("after stop the preview answers 410", gone.status === 410, gone);
} finally {
  await sdkError(() => sb.stop());
}

// Bad ports: Vercel's error shape, the SDK's APIError.
for (const [what, ports] of [
  ["port 0", [0]],
  ["a port above 65535", [65536]],
  ["16 ports", Array.from({ length: 16 }, (_, i) => 3000 + i)],
]) {
  const e = await sdkError(() => Sandbox.create({ ...creds, persistent: false, ports }));
  check(`create with ${what}: 400 APIError`, isBadRequest(e) && e.json?.error?.code === "bad_request", e && `${e.response?.status} ${e.message}`);
}

done("ports");
