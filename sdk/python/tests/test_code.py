"""sb.run_code and code contexts."""

import base64
import time

import pytest

from conftest import templates_dir_with
from glovebox import NotFoundError, Sandbox


def test_state_persists(sb):
    ex = sb.run_code("x = 41")
    assert ex.error is None and ex.results == []
    ex = sb.run_code("x + 1")
    assert ex.text == "42"
    assert len(ex.results) == 1 and ex.results[0].is_main_result and ex.results[0].text == "42"
    assert ex.execution_count >= 2


def test_error_is_structured(sb):
    ex = sb.run_code("print('before')\n1/0")
    assert ex.error is not None and ex.error.name == "ZeroDivisionError"
    assert "division by zero" in ex.error.value and "1/0" in ex.error.traceback
    assert "".join(ex.logs.stdout) == "before\n"
    assert sb.run_code("def f(:\n  pass").error.name == "SyntaxError"


def test_timeout_interrupts_and_keeps_context(sb):
    sb.run_code("kept = 'yes'")
    t = time.monotonic()
    ex = sb.run_code("import time\ntime.sleep(30)", timeout=1)
    assert time.monotonic() - t < 6
    assert ex.error is not None and ex.error.name == "TimeoutError"
    assert not ex.context_restarted
    assert sb.run_code("kept").text == "'yes'"


def test_contexts_are_isolated(sb):
    ctx = sb.create_code_context(cwd="/tmp")
    assert ctx.language == "python" and ctx.cwd == "/tmp"
    sb.run_code("y = 'in ctx'", context=ctx)
    assert sb.run_code("y").error.name == "NameError", "the default context does not see it"
    assert sb.run_code("y", context=ctx).text == "'in ctx'"
    assert sb.run_code("import os; os.getcwd()", context=ctx.id).text == "'/tmp'"
    assert ctx.id in {c.id for c in sb.list_code_contexts()}

    sb.restart_code_context(ctx)
    assert sb.run_code("y", context=ctx).error.name == "NameError", "restart clears state"

    sb.remove_code_context(ctx)
    assert ctx.id not in {c.id for c in sb.list_code_contexts()}
    with pytest.raises(NotFoundError):
        sb.run_code("1", context=ctx)


def test_javascript(sb):
    assert sb.run_code("[1,2,3].map(x => x*2)", language="javascript").text == "[ 2, 4, 6 ]"
    ctx = sb.create_code_context(language="javascript")
    sb.run_code("let n = 20", context=ctx)
    assert sb.run_code("n + 22", context=ctx).text == "42"


def test_rich_results(sb):
    code = (
        "class Rich:\n"
        "    def _repr_html_(self): return '<b>hi</b>'\n"
        "    def _repr_markdown_(self): return '**hi**'\n"
        "    def __repr__(self): return 'Rich()'\n"
        "display(Rich())\n"
        "{'a': 1}"
    )
    ex = sb.run_code(code)
    assert len(ex.results) == 2
    shown, main = ex.results
    assert not shown.is_main_result and shown.html == "<b>hi</b>" and shown.markdown == "**hi**"
    assert "html" in shown.formats() and shown.text == "Rich()"
    assert main.is_main_result and main.text == "{'a': 1}"


def test_streaming_callbacks(sb):
    events = []
    t0 = time.monotonic()
    ex = sb.run_code(
        "import sys, time\nprint('a', flush=True)\ntime.sleep(1)\nprint('b', file=sys.stderr)\n"
        "display(1)\n2/0",
        on_stdout=lambda s: events.append(("out", s, time.monotonic() - t0)),
        on_stderr=lambda s: events.append(("err", s, time.monotonic() - t0)),
        on_result=lambda r: events.append(("result", r.text, time.monotonic() - t0)),
        on_error=lambda e: events.append(("error", e.name, time.monotonic() - t0)),
    )
    end = time.monotonic() - t0
    kinds = [(k, v) for k, v, _ in events]
    assert kinds == [("out", "a\n"), ("err", "b\n"), ("result", "1"), ("error", "ZeroDivisionError")], kinds
    assert events[0][2] < end - 0.8, f"stdout arrived only at the end: {events}"
    assert ex.error.name == "ZeroDivisionError" and ex.logs.stdout == ["a\n"] and ex.results[0].text == "1"
    assert ex.execution_count >= 1


def test_env_of_a_cell(sb):
    ex = sb.run_code("import os; os.environ['CELL_VAR']", env={"CELL_VAR": "set"})
    assert ex.text == "'set'"


@pytest.mark.skipif(not templates_dir_with("code-interpreter"),
                    reason="no code-interpreter template ($GLOVEBOX_TEMPLATES_DIR/templates/code-interpreter.json)")
def test_matplotlib_png(daemon):
    with Sandbox.create(template="code-interpreter") as sb:
        ex = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
                         timeout=60)
        assert ex.error is None, ex.error
        pngs = [r for r in ex.results if r.png]
        assert len(pngs) == 1
        assert base64.b64decode(pngs[0].png).startswith(b"\x89PNG\r\n\x1a\n")
        assert pngs[0].png_bytes[:4] == b"\x89PNG"
        assert sb.run_code("import numpy as np; int(np.arange(10).sum())").text == "45"
