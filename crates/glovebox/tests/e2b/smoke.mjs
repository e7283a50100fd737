// Smoke test of the npm @e2b/code-interpreter SDK against Glovebox: create -> runCode -> kill.
// Run by tests/e2b.rs with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.
import assert from "node:assert/strict";
import { Sandbox } from "@e2b/code-interpreter";

const sbx = await Sandbox.create({ timeoutMs: 120_000 });
assert.ok(sbx.sandboxId.length > 8, "a sandbox id");
const exec = await sbx.runCode("import numpy as np\nprint(int(np.arange(10).sum()))\n6 * 7");
assert.equal(exec.error, undefined, `no error: ${JSON.stringify(exec.error)}`);
assert.deepEqual(exec.logs.stdout, ["45\n"]);
assert.equal(exec.text, "42");
const err = await sbx.runCode("raise KeyError('k')");
assert.equal(err.error?.name, "KeyError");
const cmd = await sbx.commands.run("echo from-node");
assert.equal(cmd.stdout, "from-node\n");
await sbx.files.write("/home/user/n.txt", "node file");
assert.equal(await sbx.files.read("/home/user/n.txt"), "node file");
const id = sbx.sandboxId;
await sbx.kill();
const running = (await Sandbox.list().nextItems()).map((s) => s.sandboxId);
assert.ok(!running.includes(id), "killed sandbox is not listed");
console.log("e2b node smoke: 7 checks ok");
