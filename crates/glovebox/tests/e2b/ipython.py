"""The code-interpreter template's python kernel behaves as E2B's (IPython): shell and line
magics, display(), E2B's result fields (unquoted str text, `data` of DataFrames, `chart` of
matplotlib figures, `json`, PIL images), per-execution env vars, contexts in creation order,
an interrupt when the client gives up, a kernel restarted after it is killed, and the SDK's
error when the sandbox is killed mid-cell. Needs IPython in the template: fails without it."""

import threading
import time

from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

from checks import check, done, raises

sbx = Sandbox.create(timeout=300, envs={"SANDBOX_VAR": "global"})


def run(code, **kw):
    ex = sbx.run_code(code, **kw)
    check(f"no error in {code[:40]!r}", ex.error is None, ex.error)
    return ex


ex = run("!pwd")
check("a shell magic runs in /home/user", "".join(ex.logs.stdout).strip() == "/home/user", ex.logs)
ex = run("here = %pwd\nhere")
check("a line magic's value", ex.text == "/home/user", ex.text)
ex = run("import IPython\nget_ipython().__class__.__mro__[1].__name__")
check("cells run in an IPython InteractiveShell", ex.text == "InteractiveShell", ex.text)

ex = run("'supertest'")
check("a str result's text is unquoted", ex.text == "supertest", ex.text)
ex = run("[1, 2, {'a': 3}]")
check("a list has text and json", ex.results[0].json == [1, 2, {"a": 3}] and ex.text == "[1, 2, {'a': 3}]",
      ex.results[0])

ex = run("from IPython.display import display\ndisplay({'text/latex': r'\\text{x}'}, raw=True)")
check("display(raw=True) gives that bundle", list(ex.results[0].formats()) == ["latex"], ex.results)
ex = run("class R:\n    def _repr_html_(self):\n        return '<b>r</b>'\nR()")
check("_repr_html_ is honoured", ex.results[0].html == "<b>r</b>", ex.results)

ex = run("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})")
check("a DataFrame's data", ex.results[0].data == {"a": [1, 2, 3], "b": ["x", "y", "z"]}, ex.results[0].data)
check("a DataFrame's html", "<table" in (ex.results[0].html or ""))

seen = []
ex = sbx.run_code(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6])\nplt.title('t')\nplt.show()\n7",
    on_result=seen.append,
)
check("a figure, then the main result", len(ex.results) == 2 and ex.results[1].text == "7", ex.results)
fig = ex.results[0]
check("the figure has png and text, nothing extra", fig.png and fig.text and not fig.extra, fig.formats())
check("the figure's chart is extracted", fig.chart is not None and fig.chart.type.value == "line"
      and fig.chart.title == "t", fig.chart)
check("results stream in order", [r.is_main_result for r in seen] == [False, True], seen)

ex = run("import numpy\nfrom PIL import Image\n"
         "im = Image.fromarray((numpy.random.rand(8, 8, 3) * 255).astype('uint8'))\nim.show()\nprint('shown')")
check("PIL's show() displays the image", len(ex.results) == 1 and ex.results[0].png, ex.results)

first = run("1").execution_count
ex = run("2")
check("execution_count counts cells", ex.execution_count == first + 1, (first, ex.execution_count))
ex = sbx.run_code("1 / 0")
check("an error's name and value", ex.error.name == "ZeroDivisionError" and ex.error.value == "division by zero")
check("the traceback is IPython's", "Cell In[" in ex.error.traceback and "1 / 0" in ex.error.traceback,
      ex.error.traceback)
ex = run("import asyncio\nawait asyncio.sleep(0.01)\n'awaited'")
check("top-level await", ex.text == "awaited", ex.text)

ex = run("import os\nos.getenv('FOO'), os.getenv('SANDBOX_VAR')", envs={"FOO": "bar", "SANDBOX_VAR": "cell"})
check("per-execution env vars", ex.text == "('bar', 'cell')", ex.text)
ex = run("os.getenv('FOO', 'unset'), os.getenv('SANDBOX_VAR')")
check("per-execution env vars are restored after the cell", ex.text == "('unset', 'global')", ex.text)
ex = run("echo ${FOO:-unset} $SANDBOX_VAR", language="bash", envs={"FOO": "bash"})
check("bash: per-execution env", ex.logs.stdout == ["bash global\n"], ex.logs)
ex = run("echo ${FOO:-unset}", language="bash")
check("bash: restored", ex.logs.stdout == ["unset\n"], ex.logs)

ctx = sbx.create_code_context(cwd="/tmp")
listed = sbx.list_code_contexts()
check("default python and javascript contexts are listed", {"python", "javascript"} <= {c.language for c in listed})
check("the newest context is listed last", listed[-1].id == ctx.id and listed[-1].cwd == "/tmp", listed)
check("a context's cwd", run("!pwd", context=ctx).logs.stdout == ["/tmp\n"])

raises("a client timeout raises", TimeoutException, sbx.run_code, "import time; time.sleep(300)", timeout=3)
start = time.time()
ex = run("1 + 1", timeout=10)
check("the timed-out cell was interrupted", ex.text == "2" and time.time() - start < 8, time.time() - start)

stubborn = "import time\nwhile True:\n    try:\n        time.sleep(100)\n    except KeyboardInterrupt:\n        pass"
raises("a client timeout on a cell that ignores interrupts", TimeoutException, sbx.run_code, stubborn, timeout=3)
ex = run("1 + 1", timeout=30)
check("its kernel was killed and the next cell runs", ex.text == "2", ex)

run("state = 5")
sbx.commands.run("pkill -9 -f python_kernel.py", user="root")
ex = sbx.run_code("state")
check("a killed kernel is reported", ex.error is not None, ex)
ex = run("x = 1; x")
check("and restarted for the next cell", ex.text == "1", ex.text)

timer = threading.Timer(2.0, sbx.kill)
timer.start()
e = raises("a sandbox killed mid-cell raises", TimeoutException, sbx.run_code, "import time; time.sleep(300)",
           timeout=120)
check("the error says the sandbox was killed", "killed" in str(e), e)
timer.join()
done("ipython")
