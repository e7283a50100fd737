#!/usr/bin/env python3
"""Glovebox Python kernel: one long-lived interpreter per code-interpreter context.

Protocol (the same for the Python, Node and bash kernels):

* Requests arrive on fd 0 as JSON lines: ``{"id": "<string>", "code": "<source>",
  "env": {"K": "V"}, "scoped_env": {"K": "V"}}`` (both maps optional).  Events leave on fd 1 as JSON lines, one
  object per line, UTF-8, flushed after each line.
* After setup (including importing the comma-separated modules in ``GLOVEBOX_PRELOAD``,
  failures ignored) the kernel emits ``{"type": "ready", "language": "python"}``.  Unless a
  request arrives within 50 ms of it, the kernel then runs a throwaway warm-up (a figure, a
  DataFrame) before it reads the first request.
* Each request produces, in order, events carrying its ``id``:
  ``{"type": "stdout"|"stderr", "text": ...}``,
  ``{"type": "result", "data": {mime: value}, "is_main_result": bool}``,
  ``{"type": "error", "name": ..., "value": ..., "traceback": ...}`` and always, last,
  ``{"type": "end", "execution_count": N}``.  N counts cells from 1 and also counts cells
  that failed.
* SIGINT while a cell runs raises KeyboardInterrupt in it (error event, then end; state
  kept).  SIGINT while idle is ignored.  EOF on fd 0 exits with status 0.

Decisions:

* ``env`` is set in ``os.environ`` before the cell runs and kept afterwards (the daemon
  sends the sandbox's environment with the first cell this way).  ``scoped_env`` is set
  for the cell only: when it ends, each name gets back the value it had (or is removed),
  as E2B's per-execution envs.
* When IPython is importable, cells run through an in-process ``InteractiveShell`` (no
  Jupyter server): magics (``%``, ``!`` via the shell, output captured as below),
  ``display()``, the formatter machinery and ``_repr_*_`` methods, IPython tracebacks
  (no colours) and execution counts behave as in Jupyter.  Its display publisher and
  display hook turn into result events; ``_showtraceback`` into the error event.  Extra
  formatters give what E2B's template gives: ``e2b/data`` (a DataFrame's columns),
  ``e2b/chart`` (a matplotlib figure's chart, by the ``e2b_charts`` package when
  installed) and ``application/json`` for plain lists and dicts.  matplotlib uses the
  inline backend in the kernel (children keep ``MPLBACKEND=Agg``); PIL's ``Image.show()``
  and ``Image.save(path)`` display the image.  Without IPython, the stdlib engine below
  applies (the same protocol).
* A request line that is not valid JSON or lacks a string ``code`` gets an error event
  named ``ProtocolError``.  If the line carried a string ``id`` the error has that id and
  is followed by ``end`` (execution count unchanged), so a caller waiting on the id is
  released; otherwise the id is null and nothing else follows.
* Output is captured at the fd level: fds 1 and 2 are pipes the kernel drains in a thread,
  so child processes and C code are captured too, and fd 0 is /dev/null (``input()``
  raises EOFError).  ``sys.stdout`` is line buffered: a partial line shows up at the next
  newline, flush, result or the end of the cell.  Output written while no cell runs (a
  background thread or process) carries the id of the most recent cell; output produced
  before ``ready`` (while preloading) is dropped.
* Stdlib engine: the last statement of a cell, if it is an expression whose value is not
  None, is the main result, unless the cell ends with ``;``.  ``display()`` is a builtin giving
  non-main results; open matplotlib figures are emitted as image/png results by
  ``plt.show()`` and at the end of the cell, then closed.  Top-level ``await`` works.
* MIME bundles follow IPython's display protocol (``_repr_mimebundle_``, ``_repr_html_``,
  ``_repr_png_`` ...); binary types (png, jpeg, pdf) are base64 strings.
"""

import ast
import base64
import builtins
import codecs
import functools
import importlib
import importlib.abc
import io
import json
import linecache
import os
import pprint
import select
import signal
import sys
import threading
import time
import tokenize
import traceback
import types

_SELF = __file__
# Keep the kernel's own module alive once ``__main__`` is replaced by the user namespace.
_SELF_MODULE = sys.modules[__name__]

# How long a kernel that reported ready waits for a first request before it warms up (a cell
# waiting for the kernel to start is sent the moment it is ready).
_WARM_UP_AFTER = 0.05
# How long output may wait for more before it is sent (results and ends send it at once).
_BATCH_SECONDS = 0.02
# Largest text of one stdout/stderr event, in bytes read.
_CHUNK = 32 * 1024
_CO_COROUTINE = 0x80

_REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/pdf", "_repr_pdf_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
)
_BINARY_MIMES = ("image/png", "image/jpeg", "application/pdf")
_PRETTY_REPRS = (dict.__repr__, list.__repr__, tuple.__repr__, set.__repr__, frozenset.__repr__)


class _Stream:
    """One captured fd: the read end of its pipe and the bytes not yet sent."""

    def __init__(self, name, fd):
        self.name = name
        self.fd = fd
        self.pending = bytearray()
        self.since = 0.0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Runs a patch function right after selected modules finish importing."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner, patch):
        self._inner = inner
        self._patch = patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class Kernel:
    def __init__(self, zygote=False):
        """``zygote``: everything but the channel and the captured output (which a kernel
        forked from the zygote opens with ``_open_io``): no fd of the zygote's is touched and
        no thread started, so the process can still fork safely."""
        self.lock = threading.RLock()
        self.count = 0
        self.output_id = None
        self.forward = False
        self.executing = False
        self.critical = 0
        self.interrupt_pending = False
        self.loop = None
        self.warmed = False
        self.streams = []
        signal.signal(signal.SIGINT, self._on_sigint)
        if not zygote:
            self._open_io()
        self._make_engine()

    def _open_io(self):
        # The protocol channel moves to private fds; fds 0, 1 and 2 become what user code
        # and its children see. os.dup makes non-inheritable fds, so children never get them.
        self.requests = os.fdopen(os.dup(0), "rb")
        self.events = os.dup(1)
        self.diag = os.dup(2)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.close(null)
        self.streams = []
        for fd, name in ((1, "stdout"), (2, "stderr")):
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            os.set_blocking(read_end, False)
            self.streams.append(_Stream(name, read_end))
        sys.stdin = sys.__stdin__ = open(os.devnull)
        sys.stdout = sys.__stdout__ = open(
            1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )
        sys.stderr = sys.__stderr__ = open(
            2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False
        )
        threading.Thread(target=self._pump, name="glovebox-output", daemon=True).start()

    def _make_engine(self):
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.ns = main.__dict__
        sys.argv = [""]
        sys.path[0] = ""

        os.environ["MPLBACKEND"] = "Agg"
        self.shell = None
        if _have_ipython():
            try:
                self.shell = _make_shell(self, main)
            except Exception as exc:
                # An IPython that cannot start (a broken install): the stdlib engine runs.
                sys.modules["__main__"] = main
                os.write(self.diag, f"glovebox: IPython unusable, stdlib kernel: {exc!r}\n".encode())
        if self.shell is None:
            builtins.display = self.display
            patches = {
                "matplotlib.pyplot": self._patch_pyplot,
                "IPython.display": self._patch_ipython,
                "IPython.core.display": self._patch_ipython,
                "IPython.core.display_functions": self._patch_ipython,
            }
        else:
            self.ns = self.shell.user_ns
            patches = {"matplotlib": _inline_backend, "PIL.Image": _patch_pil}
        sys.meta_path.insert(0, _PostImportHook(patches))
        for name, patch in patches.items():
            if name in sys.modules:
                patch(sys.modules[name])

    # ---- protocol channel -------------------------------------------------------------

    def _send(self, event):
        line = json.dumps(event, ensure_ascii=False) + "\n"
        data = memoryview(line.encode("utf-8", "replace"))
        with self.lock:
            while data:
                data = data[os.write(self.events, data):]

    def _critical(self, fn, *args):
        """Runs fn with SIGINT deferred, so an interrupt never cuts an event line in two."""
        self.critical += 1
        try:
            return fn(*args)
        finally:
            self.critical -= 1
            if not self.critical and self.interrupt_pending and self.executing:
                self.interrupt_pending = False
                raise KeyboardInterrupt

    def _on_sigint(self, signum, frame):
        if not self.executing:
            return
        if self.critical:
            self.interrupt_pending = True
            return
        raise KeyboardInterrupt

    # ---- captured output --------------------------------------------------------------

    def _pump(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        while True:
            open_fds = [s.fd for s in self.streams if s.fd is not None]
            if not open_fds:
                return
            waiting = [s.since for s in self.streams if s.pending]
            timeout = None
            if waiting:
                timeout = max(0.0, min(waiting) + _BATCH_SECONDS - time.monotonic())
            try:
                select.select(open_fds, [], [], timeout)
            except (OSError, ValueError):
                time.sleep(_BATCH_SECONDS)
            with self.lock:
                self._read_all()
                now = time.monotonic()
                for stream in self.streams:
                    p = stream.pending
                    if p and (len(p) >= _CHUNK or now - stream.since >= _BATCH_SECONDS):
                        self._flush_stream(stream)

    def _read_all(self):
        for stream in self.streams:
            while stream.fd is not None:
                try:
                    chunk = os.read(stream.fd, 65536)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                if not chunk:
                    # Every writer is gone (user code closed fd 1 or 2): stop watching it.
                    os.close(stream.fd)
                    stream.fd = None
                    break
                if not stream.pending:
                    stream.since = time.monotonic()
                stream.pending += chunk
                if len(stream.pending) >= _CHUNK:
                    self._flush_stream(stream)

    def _flush_stream(self, stream):
        data = bytes(stream.pending)
        stream.pending.clear()
        text = stream.decoder.decode(data)
        if text and self.forward:
            self._send({"type": stream.name, "id": self.output_id, "text": text})

    def _sync_output(self):
        """Sends everything written to fds 1 and 2 so far, before the next event."""
        for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                f.flush()
            except Exception:
                pass
        with self.lock:
            self._read_all()
            for stream in self.streams:
                if stream.pending:
                    self._flush_stream(stream)

    def _emit(self, event):
        def go():
            self._sync_output()
            self._send({"type": event.pop("type"), "id": self.output_id, **event})

        self._critical(go)

    # ---- display ----------------------------------------------------------------------

    def display(self, *objs, raw=False, **_ignored):
        """IPython-style display(): each object becomes a non-main result."""
        for obj in objs:
            data = dict(obj) if raw else self._bundle(obj)
            if data:
                self._emit({"type": "result", "data": data, "is_main_result": False})

    def _bundle(self, obj):
        data = {}
        figure = sys.modules.get("matplotlib.figure")
        if figure is not None and isinstance(obj, figure.Figure):
            return self._figure_bundle(obj)
        if not isinstance(obj, type) and not _has_every_attribute(obj):
            self._mimebundle(obj, data)
            for mime, name in _REPR_METHODS:
                if mime in data:
                    continue
                method = _safe_getattr(obj, name)
                if not callable(method):
                    continue
                try:
                    value = method()
                except Exception as exc:
                    print(f"{type(obj).__name__}.{name}() failed: {exc!r}", file=sys.stderr)
                    continue
                if isinstance(value, tuple) and len(value) == 2:
                    value = value[0]
                value = _mime_value(mime, value)
                if value is not None:
                    data[mime] = value
        if "text/plain" not in data:
            if type(obj).__repr__ in _PRETTY_REPRS:
                data["text/plain"] = pprint.pformat(obj, sort_dicts=False)
            else:
                data["text/plain"] = repr(obj)
        return data

    def _mimebundle(self, obj, data):
        method = _safe_getattr(obj, "_repr_mimebundle_")
        if not callable(method):
            return
        try:
            bundle = method(include=None, exclude=None)
        except Exception as exc:
            print(f"{type(obj).__name__}._repr_mimebundle_() failed: {exc!r}", file=sys.stderr)
            return
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        if isinstance(bundle, dict):
            for mime, value in bundle.items():
                value = _mime_value(mime, value)
                if value is not None:
                    data[mime] = value

    def _figure_bundle(self, fig):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", bbox_inches="tight")
        return {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": repr(fig)}

    def _flush_figures(self):
        helpers = sys.modules.get("matplotlib._pylab_helpers")
        plt = sys.modules.get("matplotlib.pyplot")
        if helpers is None or plt is None:
            return
        for manager in list(helpers.Gcf.get_all_fig_managers()):
            fig = manager.canvas.figure
            try:
                data = self._figure_bundle(fig)
            finally:
                plt.close(fig)
            self._emit({"type": "result", "data": data, "is_main_result": False})

    def _patch_pyplot(self, plt):
        def show(*args, **kwargs):
            self._flush_figures()

        show.__doc__ = "Sends every open figure to the notebook as a PNG and closes it."
        plt.show = show

    def _patch_ipython(self, module):
        if hasattr(module, "display"):
            module.display = self.display

    # ---- cells ------------------------------------------------------------------------

    def serve(self):
        _preload()
        self._freeze()
        self._sync_output()
        self.forward = True
        self._send({"type": "ready", "language": "python"})
        # The warm-up is for a kernel kept waiting (a warm pool's): a cell that is already
        # waiting (a sandbox created for it) runs at once and pays those one-time costs itself,
        # rather than after a throwaway figure. Never after a cell: it would reset `_`.
        try:
            waiting = self.warmed or select.select([self.requests], [], [], _WARM_UP_AFTER)[0]
        except (OSError, ValueError):
            waiting = True
        if not waiting:
            self.forward = False
            self._warm_up()
            self._freeze()
            self._sync_output()
            self.forward = True
        while True:
            line = self.requests.readline()
            if not line:
                break
            if line.strip():
                self._handle(line)
        self._sync_output()

    @staticmethod
    def _freeze():
        """Moves everything loaded so far out of the collector's view: otherwise the first
        cell pays a full collection of the preloaded modules (~30 ms with pandas)."""
        try:
            import gc

            gc.collect()
            gc.freeze()
        except BaseException:
            pass

    def _warm_up(self):
        """Runs, output dropped, what a first analysis cell takes, so none of its one-time
        costs land on the user's first cell."""
        if self.shell is not None:
            self._warm_up_shell()
        elif "matplotlib.pyplot" in sys.modules:
            # Render one throwaway figure: the first savefig loads fonts and the Agg
            # renderer, which would otherwise cost the user's first plot ~100 ms.
            # Exercise the same paths a first analysis cell takes (numpy statistics, a
            # histogram with a title, PNG output, a DataFrame's HTML).
            try:
                import io
                plt = sys.modules["matplotlib.pyplot"]
                data = [1.0, 2.0, 2.0, 3.0]
                np = sys.modules.get("numpy")
                if np is not None:
                    data = np.random.default_rng(0).normal(size=100)
                    float(data.mean()), float(np.median(data)), float(data.std())
                fig = plt.figure()
                plt.hist(data, bins=10)
                plt.title("warm-up")
                plt.xlabel("x")
                fig.savefig(io.BytesIO(), format="png")
                plt.close(fig)
                pd = sys.modules.get("pandas")
                if pd is not None:
                    pd.DataFrame({"a": [1, 2]})._repr_html_()
            except BaseException:
                pass

    def _warm_up_shell(self):
        """Runs throwaway cells (not counted, output dropped) through the paths a first cell
        takes: IPython's compiler and display hook, and with the preloaded modules a figure
        shown inline (PNG, chart extraction) and a DataFrame's bundle."""
        cells = ["1+1"]
        if "matplotlib.pyplot" in sys.modules:
            cells.append(
                "import matplotlib.pyplot as __plt\n"
                "__d = [1.0, 2.0, 2.0, 3.0]\n"
                "import sys as __sys\n"
                "if 'numpy' in __sys.modules:\n"
                "    __np = __sys.modules['numpy']\n"
                "    __d = __np.random.default_rng(0).normal(size=100)\n"
                "    float(__d.mean()), float(__np.median(__d)), float(__d.std())\n"
                "__plt.hist(__d, bins=10)\n__plt.title('warm-up')\n__plt.xlabel('x')\n__plt.show()\n"
                "del __plt, __d, __sys\n"
            )
        if "pandas" in sys.modules:
            cells.append("__import__('pandas').DataFrame({'a': [1, 2]})")
        for cell in cells:
            try:
                self.shell.run_cell(cell, store_history=False)
            except BaseException:
                pass
        for name in ("_", "__", "___", "__np"):
            self.shell.user_ns.pop(name, None)

    def _handle(self, line):
        try:
            request = json.loads(line)
        except ValueError as exc:
            self._protocol_error(None, f"request is not JSON: {exc}")
            return
        rid = request.get("id") if isinstance(request, dict) else None
        if not isinstance(rid, str):
            self._protocol_error(None, "request needs a string \"id\"")
            return
        code = request.get("code")
        env = request.get("env") or {}
        scoped = request.get("scoped_env") or {}
        if not isinstance(code, str):
            self._protocol_error(rid, "request needs a string \"code\"")
        elif not _valid_env_map(env) or not _valid_env_map(scoped):
            self._protocol_error(rid, "\"env\" and \"scoped_env\" must map names to strings")
        else:
            os.environ.update({k: str(v) for k, v in env.items()})
            # Scoped variables hold for this cell only: afterwards each name gets back the
            # value it had before (or is removed), whatever the cell did with it.
            saved = {k: os.environ.get(k) for k in scoped}
            os.environ.update({k: str(v) for k, v in scoped.items()})
            try:
                self._run_cell(rid, code)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                self._send({"type": "end", "id": rid, "execution_count": self.count})
            return
        self._send({"type": "end", "id": rid, "execution_count": self.count})

    def _protocol_error(self, rid, message):
        self._send({"type": "error", "id": rid, "name": "ProtocolError", "value": message, "traceback": message})

    def _run_cell(self, rid, code):
        self._sync_output()
        with self.lock:
            self.output_id = rid
        self.interrupt_pending = False
        if self.shell is not None:
            self._run_ipython(code)
            return
        self.count += 1
        filename = f"<cell-{self.count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            self.executing = True
            try:
                value, show = self._execute(code, filename)
                if show:
                    self.ns["_"] = value
                    data = self._bundle(value)
                    self._emit({"type": "result", "data": data, "is_main_result": True})
                    figure = sys.modules.get("matplotlib.figure")
                    if figure is not None and isinstance(value, figure.Figure):
                        sys.modules["matplotlib.pyplot"].close(value)
                self._flush_figures()
            finally:
                self.executing = False
        except BaseException as exc:
            self.executing = False
            try:
                self._flush_figures()
            except BaseException:
                pass
            self._emit({"type": "error", **_describe(exc)})
        finally:
            self.executing = False
        self._sync_output()

    def _run_ipython(self, code):
        self.count = self.shell.execution_count
        try:
            self.executing = True
            self.shell.run_cell(code, store_history=True)
        except BaseException as exc:
            # An interrupt that landed outside the cell's own try (IPython's bookkeeping).
            self.executing = False
            self._emit({"type": "error", **_describe(exc)})
        finally:
            self.executing = False
        self._sync_output()

    def _execute(self, code, filename):
        flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        self._run(compile(tree, filename, "exec", flags, dont_inherit=True))
        if last is None:
            return None, False
        value = self._run(compile(last, filename, "eval", flags, dont_inherit=True))
        return value, value is not None and not _ends_with_semicolon(code)

    def _run(self, code):
        if not code.co_flags & _CO_COROUTINE:
            return eval(code, self.ns)
        import asyncio

        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        task = self.loop.create_task(eval(code, self.ns))
        try:
            return self.loop.run_until_complete(task)
        except BaseException:
            task.cancel()
            raise


# ---- the IPython engine -------------------------------------------------------------------


def _preload():
    """Imports the modules GLOVEBOX_PRELOAD names (comma-separated); one that fails is skipped."""
    for name in os.environ.get("GLOVEBOX_PRELOAD", "").split(","):
        name = name.strip()
        if name:
            try:
                importlib.import_module(name)
            except BaseException:
                pass


def _have_ipython():
    import importlib.util

    try:
        return importlib.util.find_spec("IPython") is not None
    except (ImportError, ValueError):
        return False


def _defer_ipython_terminal():
    """``import IPython`` imports its terminal front-end (``IPython.terminal.embed``: the
    prompt_toolkit shell, its debugger and app, about half of IPython's import time), which an
    in-process shell never uses. A stand-in takes its place in ``sys.modules`` and loads the
    real module the first time anything reads a name of it (``IPython.embed()``, or a user's
    ``from IPython.terminal.embed import InteractiveShellEmbed``), so only what runs pays."""
    name = "IPython.terminal.embed"
    if name in sys.modules:
        return
    stand_in = types.ModuleType(name, "Loaded on first use (see the Glovebox python kernel).")

    def real():
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        module = importlib.import_module(name)
        # Names read later come from the real module without another lookup.
        stand_in.__dict__.update({k: v for k, v in module.__dict__.items() if not k.startswith("__")})
        return module

    def embed(**kwargs):
        return real().embed(**kwargs)

    def getattr_(attr):
        # The import system asks a module for `__path__` and the like: a plain module has none.
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(real(), attr)

    stand_in.embed = embed
    stand_in.__getattr__ = getattr_
    sys.modules[name] = stand_in


def _make_shell(kernel, main):
    """An IPython InteractiveShell whose displays, results and errors become events."""
    _defer_ipython_terminal()
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets import ObjectName, Unicode
    from traitlets.config import Config

    def result(data, main_result):
        if kernel.forward:
            kernel._emit({"type": "result", "data": _json_safe(data), "is_main_result": main_result})

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            result(data, False)

        def clear_output(self, wait=False):
            pass

    class Hook(DisplayHook):
        def compute_format_data(self, result):
            # Fast path for plain scalars, which no default formatter but text/plain renders:
            # asking all of them costs more than the rest of a `1+1` cell.
            kind = type(result)
            if kind in _SCALARS and not _custom_printer(self.shell.display_formatter, kind):
                return {"text/plain": self.shell.display_formatter.formatters["text/plain"](result)}, {}
            return super().compute_format_data(result)

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            result(format_dict, True)

        def finish_displayhook(self):
            self._is_active = False

    class Shell(InteractiveShell):
        def _showtraceback(self, etype, evalue, stb):
            try:
                value = str(evalue)
            except Exception:
                value = f"<unprintable {etype.__name__}>"
            name = etype.__name__ if isinstance(etype, type) else str(etype)
            if kernel.forward:
                kernel._emit({"type": "error", "name": name, "value": value, "traceback": "\n".join(stb)})

    class DataFormatter(BaseFormatter):
        """``e2b/data``: a pandas DataFrame as its columns (lists of values)."""

        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            pd = sys.modules.get("pandas")
            if pd is None or not isinstance(obj, pd.DataFrame):
                return super().__call__(obj)
            columns = obj.to_dict(orient="list")
            return {
                str(name): [v.isoformat() if isinstance(v, pd.Timestamp) else v for v in values]
                for name, values in columns.items()
            }

    class ChartFormatter(BaseFormatter):
        """``e2b/chart``: the chart a matplotlib figure draws, as data (``e2b_charts``)."""

        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")
            if figure is None or not isinstance(obj, figure.Figure):
                return super().__call__(obj)
            try:
                from e2b_charts import chart_figure_to_dict

                return chart_figure_to_dict(obj)
            except Exception:
                # A chart the extractor does not understand (or no extractor installed):
                # the figure still comes as an image.
                return None

    class ContainerJSONFormatter(JSONFormatter):
        """``application/json`` also for plain lists and dicts (numpy values included)."""

        def __call__(self, obj):
            if type(obj) in (list, dict):
                try:
                    return json.loads(json.dumps(obj, default=_plain, allow_nan=False)), {"expanded": True}
                except (TypeError, ValueError):
                    pass
            return super().__call__(obj)

    config = Config()
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Context"
    config.PlainTextFormatter.max_seq_length = 0
    # No history database: each kernel is fresh, and nothing is written to $HOME.
    config.HistoryManager.enabled = False
    Shell.displayhook_class = Hook
    Shell.display_pub_class = Publisher
    shell = Shell.instance(config=config, user_module=main)
    shell.system = functools.partial(_system, shell)
    formatter = shell.display_formatter
    formatter.formatters["e2b/data"] = DataFormatter(parent=formatter)
    formatter.formatters["e2b/chart"] = ChartFormatter(parent=formatter)
    formatter.formatters["application/json"] = ContainerJSONFormatter(parent=formatter)
    return shell


def _system(shell, cmd):
    """``!cmd``: run by the shell with the kernel's fds, so its stdout and stderr stream as
    the cell's own (IPython's hint to prefer ``%pip`` over ``!pip`` is left out: both work)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You executed the system command")
        shell.system_raw(cmd)


_SCALARS = frozenset((int, float, bool, complex, str, bytes))


def _custom_printer(display_formatter, kind):
    """Whether some formatter other than text/plain has a printer registered for `kind`."""
    plain = display_formatter.formatters["text/plain"]
    others = [f for f in display_formatter.formatters.values() if f is not plain]
    others += [display_formatter.ipython_display_formatter, display_formatter.mimebundle_formatter]
    key = (kind.__module__, kind.__name__)
    return any(kind in f.type_printers or key in f.deferred_printers for f in others)


def _plain(value):
    """JSON for the numpy scalars and arrays inside a displayed list or dict."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _json_safe(data):
    """A MIME bundle with binary values as base64 and values JSON cannot carry dropped."""
    out = {}
    for mime, value in data.items():
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = base64.b64encode(bytes(value)).decode("ascii")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        out[mime] = value
    return out


def _inline_backend(matplotlib):
    """Figures go to the notebook, as in Jupyter (children keep ``MPLBACKEND=Agg``)."""
    matplotlib.rcParams["backend"] = "module://matplotlib_inline.backend_inline"


def _patch_pil(image_module):
    """``Image.show()`` and ``Image.save(path)`` display the image in the notebook."""
    image_class = image_module.Image
    save = image_class.save

    def show(self, title=None):
        from IPython.display import display

        display(self)

    def save_and_display(self, fp, format=None, **params):
        if isinstance(fp, (str, os.PathLike)):
            from IPython.display import display

            display(self)
        return save(self, fp, format, **params)

    show.__doc__ = "Displays the image in the notebook (there is no screen)."
    save_and_display.__doc__ = save.__doc__
    image_class.show = show
    image_class.save = save_and_display


def _safe_getattr(obj, name):
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _has_every_attribute(obj):
    # Objects that answer every attribute (mocks, proxies) would be mistaken for
    # rich-display objects; IPython probes with the same name.
    return _safe_getattr(obj, "_ipython_canary_method_should_not_exist_") is not None


def _mime_value(mime, value):
    if value is None:
        return None
    if mime in _BINARY_MIMES:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(value)).decode("ascii")
        return value if isinstance(value, str) else None
    if mime == "application/json" or mime.endswith("+json"):
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            return None
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else str(value)


def _valid_env_map(env):
    return isinstance(env, dict) and all(_valid_env(k, v) for k, v in env.items())


def _valid_env(key, value):
    return (
        isinstance(key, str)
        and key
        and "=" not in key
        and "\0" not in key
        and isinstance(value, (str, int, float, bool))
        and "\0" not in str(value)
    )


def _ends_with_semicolon(code):
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in skip]
    except (tokenize.TokenError, SyntaxError):
        return False
    return bool(tokens) and tokens[-1].string == ";"


def _user_frames(tb):
    frames = traceback.extract_tb(tb)
    for i, frame in enumerate(frames):
        if frame.filename.startswith("<cell-"):
            frames = frames[i:]
            break
    else:
        # Interrupted outside the cell's own code (e.g. asyncio waiting on a top-level
        # await): the event loop's frames say nothing to the user either.
        frames = [f for f in frames if f"{os.sep}asyncio{os.sep}" not in f.filename]
    return [f for f in frames if f.filename != _SELF]


def _format_exception(exc, seen):
    seen.add(id(exc))
    parts = []
    cause, context = exc.__cause__, exc.__context__
    if cause is not None and id(cause) not in seen:
        parts.append(_format_exception(cause, seen))
        parts.append("\nThe above exception was the direct cause of the following exception:\n\n")
    elif context is not None and not exc.__suppress_context__ and id(context) not in seen:
        parts.append(_format_exception(context, seen))
        parts.append("\nDuring handling of the above exception, another exception occurred:\n\n")
    frames = _user_frames(exc.__traceback__)
    if frames:
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_list(frames))
    parts.extend(traceback.format_exception_only(type(exc), exc))
    return "".join(parts)


def _describe(exc):
    try:
        value = str(exc)
    except Exception:
        value = f"<unprintable {type(exc).__name__}>"
    try:
        tb = _format_exception(exc, set())
    except Exception:
        tb = "".join(traceback.format_exception_only(type(exc), exc))
    return {"name": type(exc).__name__, "value": value, "traceback": tb}


# ---- the zygote ---------------------------------------------------------------------------
#
# ``GLOVEBOX_KERNEL_ZYGOTE=1 python_kernel.py``: one process per tenant and template (started by the daemon
# through ``glovebox-agent kernel-zygote``: a host uid of its own, its own namespaces, the
# template's root read-only, no network, no capability) that imports what the kernel
# preloads once, then forks one child per new sandbox. The children share the imported
# libraries' pages with it (copy-on-write), so a sandbox pays only for what its kernel
# changes. A child ends up exactly as confined as a kernel the agent starts:
#
#   zygote ──fork──▶ C: reports its pid (SCM_CREDENTIALS), unshare(CLONE_NEWUSER), says "u";
#                       host root writes the new namespace's maps (the sandbox's uid slot)
#                       and builds the sandbox inside it; C is moved into the sandbox's
#                       cgroups, gets its namespaces' fds and the kernel's stdio, joins
#                       them (mount last), forks into its PID namespace a process that
#                       forks K and exits (so K's new parent is the sandbox's PID 1),
#                       reaps it, exits
#                    K: new session, stdio, reports its pid, closes every other fd, the
#                       sandbox's uid/gid, securebits locked, every capability dropped,
#                       no_new_privs, the seccomp filters it was given; then the kernel
#
# K is reparented to the sandbox's PID 1 (the agent), which reaps it. Control protocol, one
# datagram each, on a SOCK_SEQPACKET pair per child (its end sent with "F" on fd 3).

_CLONE_NEWUSER = 0x10000000
_NS_FLAGS = {
    "cgroup": 0x02000000, "ipc": 0x08000000, "uts": 0x04000000, "net": 0x40000000,
    "pid": 0x20000000, "time": 0x00000080, "mnt": 0x00020000,
}
_PR_SET_SECUREBITS = 28
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE, each with its lock.
_SECUREBITS = 0x1 | 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def _creds():
    import socket
    import struct

    return [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", os.getpid(), os.getuid(), os.getgid()))]


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret, what):
        if ret < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return ret

    return ctypes, libc, check


def _drop_privileges(spec):
    """What the agent does in a command's child before exec (glovebox_jail::child)."""
    ctypes, libc, check = _libc()
    libc.syscall.restype = ctypes.c_long
    check(libc.syscall(116, 0, None), "setgroups")  # SYS_setgroups
    gid, uid = spec.get("gid", 0), spec.get("uid", 0)
    check(libc.syscall(119, gid, gid, gid), "setresgid")  # SYS_setresgid
    check(libc.prctl(_PR_SET_SECUREBITS, ctypes.c_ulong(_SECUREBITS), 0, 0, 0), "securebits")
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) < 0:
            break
    libc.prctl(_PR_CAP_AMBIENT, ctypes.c_ulong(_PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0)
    check(libc.syscall(117, uid, uid, uid), "setresuid")  # SYS_setresuid
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    check(libc.syscall(126, header, data), "capset")  # SYS_capset
    check(libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0), "no_new_privs")
    # A command's limits are PID 1's (lowered only); so are these.
    import resource

    def low(a, b):
        return b if a == resource.RLIM_INFINITY else min(a, b)

    for res, value in spec.get("rlimits", []):
        soft, hard = resource.getrlimit(res)
        hard = low(hard, value)
        resource.setrlimit(res, (low(low(soft, value), hard), hard))
    # The uid change made the process non-dumpable (a command's exec makes it dumpable
    # again): as a command, its own /proc files are its own.
    check(libc.prctl(_PR_SET_DUMPABLE, ctypes.c_ulong(1), 0, 0, 0), "dumpable")
    ruleset = spec.get("landlock_fd")
    if ruleset is not None:
        # The agent's ruleset, made by the daemon beneath the sandbox's root (a kernel the
        # agent starts inherits the agent's domain; this one gets a domain of the same rules).
        check(libc.syscall(446, ruleset, 0), "landlock_restrict_self")  # SYS_landlock_restrict_self
        os.close(ruleset)
    for prog in spec.get("seccomp", []):
        import struct

        raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
        buf = ctypes.create_string_buffer(raw, len(raw))

        class Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = Fprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
        check(libc.prctl(_PR_SET_SECCOMP, ctypes.c_ulong(_SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0), "seccomp")


def _zygote_kernel(chan, stdio, spec, kernel):
    """K: inside every namespace of the sandbox; becomes its kernel."""
    os.setsid()
    for i, fd in enumerate(stdio):
        os.dup2(fd, i)
    chan.sendmsg([b"k"], _creds())
    chan.close()
    ruleset = spec.get("landlock_fd")
    if ruleset is None:
        os.closerange(3, 1 << 16)
    else:
        os.closerange(3, ruleset)
        os.closerange(ruleset + 1, 1 << 16)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    _drop_privileges(spec)
    os.environ.clear()
    os.environ.update(spec.get("env", {}))
    os.chdir(spec.get("cwd", "/"))
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.environ["MPLBACKEND"] = "Agg"
    kernel._open_io()
    _serve(kernel)


def _zygote_child(chan, kernel):
    """C: makes the sandbox's user namespace, joins the sandbox, forks K into it."""
    import json
    import socket

    _, libc, check = _libc()
    chan.sendmsg([b"c"], _creds())
    check(libc.unshare(_CLONE_NEWUSER), "unshare user namespace")
    chan.send(b"u")
    msg, fds, _flags, _addr = socket.recv_fds(chan, 1 << 20, 16)
    if not msg:
        os._exit(1)
    spec = json.loads(msg)
    kinds = spec["ns"]
    extra = 1 if spec.get("landlock") else 0
    if len(fds) != len(kinds) + 3 + extra:
        os._exit(1)
    for fd, kind in zip(fds, kinds):
        check(libc.setns(fd, _NS_FLAGS[kind]), f"setns {kind}")
        os.close(fd)
    os.chdir("/")
    stdio = fds[len(kinds):]
    spec["landlock_fd"] = stdio.pop() if extra else None
    # Twice: an orphan goes to the init of its late parent's PID namespace (or to a child
    # subreaper there: the daemon is one), so K's parent must die inside the sandbox's for
    # the agent to become K's parent and reap it.
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            try:
                _zygote_kernel(chan, stdio, spec, kernel)
            except BaseException:
                os.write(2, traceback.format_exc().encode("utf-8", "replace"))
            os._exit(1)
        os._exit(0)
    os.waitpid(middle, 0)
    os._exit(0)


def zygote():
    import gc
    import socket

    if _have_ipython():
        # As in a kernel: pyplot, once imported, keeps the backend it found.
        sys.meta_path.insert(0, _PostImportHook({"matplotlib": _inline_backend}))
    _preload()
    # The kernel itself, its shell and the warm-up cells included (their output dropped):
    # every kernel forked from here starts where a warm pool's waiting kernel is.
    kernel = Kernel(zygote=True)
    kernel._warm_up()
    kernel.warmed = True
    if threading.active_count() != 1:
        # A thread's locks could be held at the fork: refuse rather than fork unsafely.
        os.write(2, b"glovebox: zygote: a thread was started while warming up; exiting\n")
        os._exit(1)
    gc.collect()
    # The collector's own writes would unshare the pages of every tracked object.
    gc.freeze()

    def reap(signum, frame):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    signal.signal(signal.SIGCHLD, reap)
    # A child that dies before it reaps its own (killed mid-way) leaves them to us, not to the
    # daemon (a subreaper too, that waits only for its own): we reap whatever ends.
    _, libc, check = _libc()
    check(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "child subreaper")
    ctl = socket.socket(fileno=3)
    ctl.send(b"R")
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 16, 1)
        except InterruptedError:
            continue
        if not msg:
            os._exit(0)
        if msg != b"F" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        chan = socket.socket(fileno=fds[0])
        if os.fork() == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                ctl.close()
                _zygote_child(chan, kernel)
            except BaseException:
                os.write(2, traceback.format_exc().encode("utf-8", "replace"))
            os._exit(1)
        chan.close()


def main():
    _serve(Kernel())


def _serve(kernel):
    try:
        kernel.serve()
    except BaseException:
        os.write(kernel.diag, traceback.format_exc().encode("utf-8", "replace"))
        os._exit(1)
    # Skip interpreter shutdown: user atexit hooks or non-daemon threads must not keep a
    # kernel whose caller has gone away alive.
    os._exit(0)


if __name__ == "__main__":
    # Not an argument: the kernels forked from the zygote keep its command line, which is
    # then a kernel's.
    if os.environ.pop("GLOVEBOX_KERNEL_ZYGOTE", None) == "1":
        zygote()
    else:
        main()
