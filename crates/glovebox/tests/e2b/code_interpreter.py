"""The `e2b-code-interpreter` SDK's tutorial flow, unchanged: statistics and a histogram,
a CSV read with pandas, errors, and a second context."""

import base64

from e2b_code_interpreter import Sandbox

from checks import check, done

sbx = Sandbox.create(timeout=300)

code = """
import numpy as np
import matplotlib.pyplot as plt

data = np.random.randint(0, 100, size=100)
print(f"Mean: {np.mean(data):.2f}")
print(f"Median: {np.median(data):.2f}")
print(f"Standard deviation: {np.std(data):.2f}")

plt.hist(data, bins=10, edgecolor="black")
plt.title("Histogram of 100 random numbers")
plt.show()
"""
execution = sbx.run_code(code)
out = "".join(execution.logs.stdout)
check("no error", execution.error is None, execution.error)
check("stdout has the statistics", all(k in out for k in ("Mean: ", "Median: ", "Standard deviation: ")), out)
check("one result (the figure)", len(execution.results) == 1, execution.results)
png = base64.b64decode(execution.results[0].png)
check("results[0].png is a PNG", png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, len(png))

sbx.files.write("/home/user/data.csv", "name,score\nada,91\nbob,78\ncy,85\n")
execution = sbx.run_code(
    "import pandas as pd\n"
    "df = pd.read_csv('/home/user/data.csv')\n"
    "print(df['score'].mean())\n"
    "df.describe()"
)
check("pandas reads the written file", "".join(execution.logs.stdout).strip() == "84.66666666666667", execution.logs)
check("the last expression is the main result", execution.results and execution.results[0].is_main_result)
check("a DataFrame comes as text and html", "score" in (execution.text or "") and "<table" in (execution.results[0].html or ""))

execution = sbx.run_code("x = 1\nraise ValueError('bad value')")
check("error.name", execution.error is not None and execution.error.name == "ValueError", execution.error)
check("error.value", execution.error.value == "bad value", execution.error.value)
check("error.traceback", "ValueError" in execution.error.traceback and "bad value" in execution.error.traceback)

state = sbx.run_code("counter = 40")
check("state persists in the default context", sbx.run_code("counter + 2").text == "42")

ctx = sbx.create_code_context()
check("create_code_context", ctx.id and ctx.language == "python" and ctx.cwd == "/home/user", ctx)
sbx.run_code("counter = 1", context=ctx)
check("a new context has its own state", sbx.run_code("counter", context=ctx).text == "1")
check("...and the default context keeps its own", sbx.run_code("counter").text == "40")
check("list_code_contexts", ctx.id in [c.id for c in sbx.list_code_contexts()])

streamed = []
sbx.run_code("import sys\nprint('to out')\nprint('to err', file=sys.stderr)",
             on_stdout=lambda m: streamed.append(("out", m.line)), on_stderr=lambda m: streamed.append(("err", m.line)))
check("on_stdout/on_stderr callbacks", ("out", "to out\n") in streamed and ("err", "to err\n") in streamed, streamed)

sbx.kill()
done("code interpreter")
