#!/usr/bin/env bash
# Glovebox bash kernel. The daemon starts it as `bash bash_kernel.sh`; bash only hands the
# Python driver below (protocol and decisions in its docstring) to python3.
src=$(<"${BASH_SOURCE[0]}") || exit 1
src=${src#*$'\n'": <<'PYTHON'"$'\n'}
exec python3 -c "${src%$'\n'PYTHON*}" "$@"
: <<'PYTHON'
"""Glovebox bash kernel: a small Python driver around one persistent bash.

Protocol (the same for the Python, Node and bash kernels; python_kernel.py has the full
text): JSON-line requests ``{"id", "code", "env"?, "scoped_env"?}`` on fd 0; JSON-line events on fd 1:
``ready`` (``"language": "bash"``), then per request ``stdout``/``stderr`` ``{text}``,
``error {name, value, traceback}`` and always, last, ``end {execution_count}``.  Bash cells
have no results.  SIGINT interrupts the running cell (error named KeyboardInterrupt, state
kept); SIGINT while idle is ignored; EOF on fd 0 ends the shell and exits 0.

How it works: bash runs as an interactive shell (``-i --noediting``, no rc files, no
history, no job control) in its own process group, reading commands from a pipe.  Each cell
is written to a file and run with ``source FILE </dev/null``, so variables, functions,
aliases, options and the working directory persist, and the cell cannot read the command
pipe.  After each cell bash prints "<cell number> <exit status>" on a private control fd;
stdout and stderr are separate pipes, drained in a thread into events.  An interrupt sends
SIGINT to the shell's process group: the foreground command dies and the interactive shell
abandons the rest of the cell, as at a terminal; background jobs (``cmd &``) ignore it.

Decisions:

* A cell whose last command exits non-zero gets an error event named ``ExitCode`` with
  value ``"exit status N"`` (then ``end``), as a terminal would show ``$?``.  Output is kept.
* A cell bash cannot parse (checked with ``bash -n`` first) gets ``SyntaxError`` with
  bash's message and is not run.
* A cell that ends the shell (``exit``, ``exec``, ``set -e`` and a failure) gets
  ``ShellExited``; a fresh shell is started, and its state is lost.
* ``env`` is exported before the cell and kept afterwards; ``scoped_env`` is exported for
  the cell only (afterwards each name gets back its value, or is unset).  Names must be
  shell identifiers.
* Output written while no cell runs carries the id of the most recent cell; output from
  before ``ready`` (bash's start-up notices) is dropped.  At an interrupt bash prints a
  newline, and it reports background jobs (``[1] 1234``) on stderr, as at a terminal.
"""

import codecs
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

_BATCH_SECONDS = 0.02
_CHUNK = 32 * 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class _Stream:
    def __init__(self, name, fd):
        self.name = name
        self.fd = fd
        self.pending = bytearray()
        self.since = 0.0
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # False until the shell is ready: what bash prints while starting is dropped.
        self.forward = False


class _Shell:
    """One bash process with its command pipe, control pipe and output pipes."""

    def __init__(self, bash, tmp):
        cmd_r, self.cmd_w = os.pipe()
        self.ctl_r, ctl_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.ctl = ctl_w
        self.proc = subprocess.Popen(
            [bash, "--norc", "--noprofile", "--noediting", "-i"],
            stdin=cmd_r,
            stdout=out_w,
            stderr=err_w,
            pass_fds=(ctl_w,),
            start_new_session=True,
            cwd=os.getcwd(),
        )
        for fd in (cmd_r, ctl_w, out_w, err_w):
            os.close(fd)
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self.streams = [_Stream("stdout", out_r), _Stream("stderr", err_r)]
        self.tmp = tmp
        self.ctl_buf = b""

    def write(self, text):
        data = memoryview(text.encode("utf-8", "surrogateescape"))
        try:
            while data:
                data = data[os.write(self.cmd_w, data):]
        except BrokenPipeError:
            pass

    def read_marker(self):
        """Next "<n> <status>" line from the control fd, or None once bash is gone."""
        while b"\n" not in self.ctl_buf:
            chunk = os.read(self.ctl_r, 4096)
            if not chunk:
                return None
            self.ctl_buf += chunk
        line, self.ctl_buf = self.ctl_buf.split(b"\n", 1)
        parts = line.split()
        if len(parts) != 2 or not all(p.lstrip(b"-").isdigit() for p in parts):
            return (-1, 0)
        return int(parts[0]), int(parts[1])

    def interrupt(self):
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def close(self):
        for fd in (self.cmd_w, self.ctl_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGHUP)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


class Kernel:
    def __init__(self):
        self.lock = threading.RLock()
        self.count = 0
        self.output_id = None
        self.forward = False
        self.running = False
        self.interrupted = False
        signal.signal(signal.SIGINT, self._on_sigint)
        self.requests = os.fdopen(os.dup(0), "rb")
        self.events = os.dup(1)
        # Nothing but events may reach the protocol fd; stray writes go to stderr.
        os.dup2(2, 1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        self.bash = shutil.which("bash") or "/bin/bash"
        self.tmp = tempfile.mkdtemp(prefix="glovebox-bash-")
        self.shell = None

    # ---- protocol channel -------------------------------------------------------------

    def _send(self, event):
        line = json.dumps(event, ensure_ascii=False) + "\n"
        data = memoryview(line.encode("utf-8", "replace"))
        with self.lock:
            while data:
                data = data[os.write(self.events, data):]

    def _on_sigint(self, signum, frame):
        if self.running and self.shell is not None:
            self.interrupted = True
            self.shell.interrupt()
            # Should SIGINT land while bash runs the status line itself, this second status
            # line still ends the cell; a duplicate is ignored.
            self.shell.write(f"builtin printf '%s 130\\n' {self.count} >&{self.shell.ctl}\n")

    # ---- captured output --------------------------------------------------------------

    def _pump(self, streams):
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
        while True:
            open_fds = [s.fd for s in streams if s.fd is not None]
            if not open_fds:
                return
            waiting = [s.since for s in streams if s.pending]
            timeout = None
            if waiting:
                timeout = max(0.0, min(waiting) + _BATCH_SECONDS - time.monotonic())
            try:
                select.select(open_fds, [], [], timeout)
            except (OSError, ValueError):
                time.sleep(_BATCH_SECONDS)
            with self.lock:
                self._read_all(streams)
                now = time.monotonic()
                for stream in streams:
                    p = stream.pending
                    if p and (len(p) >= _CHUNK or now - stream.since >= _BATCH_SECONDS):
                        self._flush_stream(stream)

    def _read_all(self, streams):
        for stream in streams:
            while stream.fd is not None:
                try:
                    chunk = os.read(stream.fd, 65536)
                except BlockingIOError:
                    break
                except InterruptedError:
                    continue
                if not chunk:
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
        if text and self.forward and stream.forward:
            self._send({"type": stream.name, "id": self.output_id, "text": text})

    def _sync_output(self):
        if self.shell is None:
            return
        with self.lock:
            self._read_all(self.shell.streams)
            for stream in self.shell.streams:
                if stream.pending:
                    self._flush_stream(stream)

    # ---- shell ------------------------------------------------------------------------

    def _start_shell(self):
        os.makedirs(self.tmp, exist_ok=True)
        shell = _Shell(self.bash, self.tmp)
        threading.Thread(target=self._pump, args=(shell.streams,), name="glovebox-output", daemon=True).start()
        shell.write(
            "PS1=''; PS2=''; PS0=''; unset PROMPT_COMMAND HISTFILE; set +o history +H +m\n"
            f"builtin printf '0 0\\n' >&{shell.ctl}\n"
        )
        while True:
            marker = shell.read_marker()
            if marker is None or marker[0] == 0:
                break
        self.shell = shell
        self._sync_output()
        for stream in shell.streams:
            stream.forward = True

    # ---- cells ------------------------------------------------------------------------

    def serve(self):
        self._start_shell()
        self.forward = True
        self._send({"type": "ready", "language": "bash"})
        while True:
            line = self.requests.readline()
            if not line:
                break
            if line.strip():
                self._handle(line)
        self._sync_output()
        self.forward = False
        self.shell.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

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
            self._protocol_error(rid, "\"env\" and \"scoped_env\" must map shell variable names to strings")
        else:
            self._run_cell(rid, code, {k: str(v) for k, v in env.items()}, {k: str(v) for k, v in scoped.items()})
            return
        self._send({"type": "end", "id": rid, "execution_count": self.count})

    def _protocol_error(self, rid, message):
        self._send({"type": "error", "id": rid, "name": "ProtocolError", "value": message, "traceback": message})

    def _error(self, name, value, traceback=None):
        self._send({"type": "error", "id": self.output_id, "name": name, "value": value,
                    "traceback": value if traceback is None else traceback})

    def _run_cell(self, rid, code, env, scoped):
        self._sync_output()
        with self.lock:
            self.output_id = rid
        self.count += 1
        n = self.count
        os.makedirs(self.tmp, exist_ok=True)
        path = os.path.join(self.tmp, f"cell-{n}")
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(code if code.endswith("\n") else code + "\n")
        try:
            check = subprocess.run(
                [self.bash, "-n", "-O", "extglob", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=10,
            )
            if check.returncode != 0:
                message = check.stderr.decode("utf-8", "replace").strip().replace(path, f"cell-{n}")
                first = message.splitlines()[0] if message else "syntax error"
                self._error("SyntaxError", first, message)
                self._end(rid, path)
                return
        except (OSError, subprocess.TimeoutExpired):
            pass  # Cannot check; let the shell report it.
        status = self._run_in_shell(n, path, env, scoped)
        self._sync_output()
        if status is None:
            code_ = self.shell.proc.wait()
            self.shell.close()
            self._start_shell()
            value = f"bash exited with status {code_}; a new shell was started and its state is reset"
            self._error("ShellExited", value)
        elif self.interrupted:
            self._error("KeyboardInterrupt", "interrupted", "KeyboardInterrupt: the cell was interrupted by SIGINT")
        elif status != 0:
            self._error("ExitCode", f"exit status {status}")
        self._end(rid, path)

    def _run_in_shell(self, n, path, env, scoped):
        ctl = self.shell.ctl
        lines = []
        if env:
            lines.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + "\n")
        # Scoped variables: remember whether each was set and its value, export the cell's.
        for i, k in enumerate(scoped):
            lines.append(f"__glovebox_had_{i}=${{{k}+1}}; __glovebox_was_{i}=${{{k}-}}\n")
        if scoped:
            lines.append("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in scoped.items()) + "\n")
        lines.append(f"source {shlex.quote(path)} </dev/null {ctl}>&-\n")
        lines.append("__glovebox_status=$?\n")
        for i, k in enumerate(scoped):
            lines.append(f"if [ -n \"$__glovebox_had_{i}\" ]; then export {k}=\"$__glovebox_was_{i}\"; "
                         f"else unset {k}; fi; unset __glovebox_had_{i} __glovebox_was_{i}\n")
        # Report the status, then leave it in $? for the next cell.
        lines.append(f"builtin printf '%s %s\\n' {n} \"$__glovebox_status\" >&{ctl}; "
                     "(exit $__glovebox_status)\n")
        self.interrupted = False
        self.shell.write("".join(lines))
        # Only now may SIGINT write to the command pipe: never into the middle of the lines.
        self.running = True
        try:
            while True:
                marker = self.shell.read_marker()
                if marker is None or marker[0] == n:
                    return None if marker is None else marker[1]
        finally:
            self.running = False

    def _end(self, rid, path):
        try:
            os.unlink(path)
        except OSError:
            pass
        self._sync_output()
        self._send({"type": "end", "id": rid, "execution_count": self.count})


def _valid_env_map(env):
    return isinstance(env, dict) and all(_valid_env(k, v) for k, v in env.items())


def _valid_env(key, value):
    return (
        isinstance(key, str)
        and _NAME.match(key) is not None
        and isinstance(value, (str, int, float, bool))
        and "\0" not in str(value)
    )


def main():
    kernel = Kernel()
    try:
        kernel.serve()
    except BaseException:
        import traceback

        os.write(2, traceback.format_exc().encode("utf-8", "replace"))
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
PYTHON
