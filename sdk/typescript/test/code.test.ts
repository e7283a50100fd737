import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";

import { Execution, Result, Sandbox } from "@glovebox/sdk";
import type { ExecutionError } from "@glovebox/sdk";
import { useDaemon } from "./daemon.js";

useDaemon();

describe("code interpreter", () => {
  let sb: Sandbox;
  before(async () => {
    sb = await Sandbox.create({ timeoutMs: 120_000 });
  });
  after(async () => {
    await sb?.kill();
  });

  it("keeps state between cells: x = 41, then x + 1", async () => {
    const first = await sb.runCode("x = 41");
    assert.ok(first instanceof Execution);
    assert.equal(first.error, undefined);
    assert.deepEqual(first.results, []);
    const second = await sb.runCode("x + 1");
    assert.equal(second.error, undefined);
    assert.equal(second.text, "42");
    const main = second.results.find((r) => r.isMainResult);
    assert.ok(main instanceof Result);
    assert.equal(main.text, "42");
    assert.deepEqual(main.formats(), ["text/plain"]);
    assert.ok(second.executionCount > first.executionCount);
    assert.equal(second.contextRestarted, false);
  });

  it("captures logs and reports exceptions as execution.error", async () => {
    const ex = await sb.runCode("print('to out')\nimport sys; print('to err', file=sys.stderr)\n1/0");
    assert.deepEqual(ex.logs.stdout.join(""), "to out\n");
    assert.deepEqual(ex.logs.stderr.join(""), "to err\n");
    assert.ok(ex.error);
    assert.equal(ex.error.name, "ZeroDivisionError");
    assert.match(ex.error.value, /division by zero/);
    assert.match(ex.error.traceback, /ZeroDivisionError/);
    assert.equal(ex.text, undefined);
  });

  it("streams stdout, results and errors to callbacks", async () => {
    const out: string[] = [];
    const results: Result[] = [];
    const errors: ExecutionError[] = [];
    const ex = await sb.runCode("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.1)\n'done'", {
      onStdout: (t) => out.push(t),
      onResult: (r) => results.push(r),
      onError: (e) => errors.push(e),
    });
    assert.equal(out.join(""), "0\n1\n2\n");
    assert.equal(results.length, 1);
    assert.equal(results[0]?.text, "'done'");
    assert.equal(ex.text, "'done'");
    assert.equal(errors.length, 0);
    const failed = await sb.runCode("raise ValueError('bad')", { onError: (e) => errors.push(e) });
    assert.equal(errors.length, 1);
    assert.equal(errors[0]?.name, "ValueError");
    assert.equal(failed.error?.value, "bad");
  });

  it("rich results: display() and the _repr_*_ protocol map to the getters", async () => {
    const ex = await sb.runCode(
      [
        "class Rich:",
        "    def _repr_html_(self): return '<b>bold</b>'",
        "    def _repr_markdown_(self): return '# title'",
        "    def _repr_json_(self): return {'a': [1, 2]}",
        "    def _repr_latex_(self): return r'$x^2$'",
        "    def _repr_svg_(self): return '<svg></svg>'",
        "display(Rich())",
        "Rich()",
      ].join("\n"),
    );
    assert.equal(ex.error, undefined, ex.error?.traceback);
    assert.equal(ex.results.length, 2);
    const [shown, main] = ex.results;
    assert.equal(shown?.isMainResult, false);
    assert.equal(main?.isMainResult, true);
    for (const r of [shown, main]) {
      assert.equal(r?.html, "<b>bold</b>");
      assert.equal(r?.markdown, "# title");
      assert.deepEqual(r?.json, { a: [1, 2] });
      assert.equal(r?.latex, "$x^2$");
      assert.equal(r?.svg, "<svg></svg>");
      assert.equal(r?.png, undefined);
    }
  });

  it("times a cell out, keeps the context", async () => {
    await sb.runCode("kept = 'yes'");
    const t0 = Date.now();
    const ex = await sb.runCode("import time\ntime.sleep(30)", { timeoutMs: 1000 });
    assert.ok(Date.now() - t0 < 10_000);
    assert.equal(ex.error?.name, "TimeoutError");
    if (!ex.contextRestarted) assert.equal((await sb.runCode("kept")).text, "'yes'");
  });

  it("runs JavaScript", async () => {
    const ex = await sb.runCode("[1,2,3].map(x => x*2)", { language: "javascript" });
    assert.equal(ex.error, undefined);
    assert.equal(ex.text, "[ 2, 4, 6 ]");
    const logged = await sb.runCode("console.log('hi from node'); 7", { language: "javascript" });
    assert.equal(logged.logs.stdout.join(""), "hi from node\n");
    assert.equal(logged.text, "7");
  });

  it("contexts are isolated and can be listed, restarted and removed", async () => {
    const a = await sb.createCodeContext({ language: "python" });
    const b = await sb.createCodeContext({ language: "python", cwd: "/tmp" });
    assert.notEqual(a.id, b.id);
    assert.equal(b.cwd, "/tmp");
    assert.equal(a.language, "python");
    await sb.runCode("secret = 'a'", { context: a });
    const inB = await sb.runCode("secret", { context: b });
    assert.equal(inB.error?.name, "NameError");
    assert.equal((await sb.runCode("secret", { context: a.id })).text, "'a'");
    assert.equal((await sb.runCode("import os; os.getcwd()", { context: b })).text, "'/tmp'");
    const ids = (await sb.listCodeContexts()).map((c) => c.id);
    assert.ok(ids.includes(a.id) && ids.includes(b.id));

    await sb.restartCodeContext(a);
    assert.equal((await sb.runCode("secret", { context: a })).error?.name, "NameError");
    await sb.removeCodeContext(b);
    assert.ok(!(await sb.listCodeContexts()).some((c) => c.id === b.id));
    await assert.rejects(sb.runCode("1", { context: b }), { name: "NotFoundError" });
    await sb.removeCodeContext(a);
  });

  it("passes env into the context", async () => {
    const ex = await sb.runCode("import os; os.environ['GB_TEST']", { env: { GB_TEST: "set" } });
    assert.equal(ex.text, "'set'");
  });
});

const templates = process.env["GLOVEBOX_TEMPLATES_DIR"];
const haveCi = templates !== undefined && existsSync(join(templates, "templates", "code-interpreter.json"));

describe("code-interpreter template", () => {
  it(
    "a matplotlib figure comes back as a PNG result",
    {
      skip: haveCi
        ? false
        : "set GLOVEBOX_TEMPLATES_DIR to the store scripts/build-code-interpreter builds into to run",
    },
    async () => {
      await Sandbox.with({ template: "code-interpreter", timeoutMs: 120_000 }, async (sb) => {
        const ex = await sb.runCode(
          "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
          { timeoutMs: 60_000 },
        );
        assert.equal(ex.error, undefined, ex.error?.traceback);
        const png = ex.results.find((r) => r.png !== undefined);
        assert.ok(png, `no PNG among ${JSON.stringify(ex.results.map((r) => r.formats()))}`);
        const bytes = Buffer.from(png.png ?? "", "base64");
        assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
      });
    },
  );
});
