"""Commands through the official `e2b` SDK: run, exit codes, timeouts (the process really
gone), background + wait/kill, envs, cwd, streaming callbacks, stdin, list, connect."""

import time

from e2b import CommandExitException, Sandbox, TimeoutException

from checks import check, done, raises

sb = Sandbox.create(timeout=180, envs={"FROM_CREATE": "c"})

r = sb.commands.run("echo hi")
check("run echo hi", (r.stdout, r.stderr, r.exit_code) == ("hi\n", "", 0), repr(r))

e = raises("non-zero exit -> CommandExitException", CommandExitException,
           sb.commands.run, "echo partial; echo boom >&2; exit 3")
check("exception carries the exit code", e.exit_code == 3, e.exit_code)
check("exception carries stderr", e.stderr == "boom\n", repr(e.stderr))
check("exception carries stdout", e.stdout == "partial\n", repr(e.stdout))

# timeout=: the SDK's TimeoutException, and the process is gone afterwards.
t0 = time.time()
raises("timeout= -> TimeoutException", TimeoutException, sb.commands.run, "sleep 300 & sleep 301; echo never", timeout=2)
took = time.time() - t0
check("the timeout is honoured", 1.0 < took < 10, f"{took:.2f}s")
check("commands.list() no longer shows it", not any("sleep" in " ".join([p.cmd] + p.args) for p in sb.commands.list()))
ps = sb.commands.run("ps -eo args").stdout
check("ps shows no sleep (children included)", "sleep 30" not in ps, ps)

# Background: wait() and kill().
h = sb.commands.run("sleep 0.5; echo done-bg", background=True)
check("background returns at once with a pid", h.pid > 0)
check("wait() gives the result", h.wait().stdout == "done-bg\n")
h = sb.commands.run("sleep 120", background=True)
check("a background process is listed", h.pid in [p.pid for p in sb.commands.list()])
listed = [p for p in sb.commands.list() if p.pid == h.pid][0]
check("listed with its command line", listed.cmd == "/bin/bash" and "sleep 120" in listed.args[-1], listed)
check("kill() is True", h.kill() is True)
e = raises("wait() after kill -> CommandExitException", CommandExitException, h.wait)
check("a killed process reports exit -1 (as envd)", e.exit_code == -1, e.exit_code)
check("killed process is not listed", h.pid not in [p.pid for p in sb.commands.list()])
check("kill(unknown pid) is False", sb.commands.kill(99999) is False)

# envs, cwd.
r = sb.commands.run("echo $FOO-$FROM_CREATE", envs={"FOO": "bar"})
check("envs= and create envs", r.stdout == "bar-c\n", repr(r.stdout))
sb.files.make_dir("/tmp/work dir")
check("cwd=", sb.commands.run("pwd", cwd="/tmp/work dir").stdout == "/tmp/work dir\n")
check("default cwd is the home", sb.commands.run("pwd").stdout == "/home/user\n")

# on_stdout / on_stderr stream as the command runs.
seen = []
r = sb.commands.run(
    "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done",
    on_stdout=lambda s: seen.append(("out", s, time.time())),
    on_stderr=lambda s: seen.append(("err", s, time.time())),
)
outs = "".join(s for k, s, _ in seen if k == "out")
errs = "".join(s for k, s, _ in seen if k == "err")
check("on_stdout got stdout", outs == "out1\nout2\nout3\n", repr(outs))
check("on_stderr got stderr", errs == "err1\nerr2\nerr3\n", repr(errs))
check("callbacks arrived while it ran", seen[-1][2] - seen[0][2] > 0.25, seen)
check("result has both streams", r.stdout == outs and r.stderr == errs)

# stdin.
h = sb.commands.run("read a; read b; echo got:$a:$b", background=True, stdin=True)
h.send_stdin("one\n")
sb.commands.send_stdin(h.pid, b"two\n")
check("send_stdin reaches the process", h.wait().stdout == "got:one:two\n")
h = sb.commands.run("wc -c", background=True, stdin=True)
h.send_stdin("12345")
h.close_stdin()
check("close_stdin ends input", h.wait().stdout.strip() == "5")
check("without stdin=True a process reads EOF", sb.commands.run("cat; echo eof").stdout == "eof\n")

# connect to a running process.
h = sb.commands.run("for i in 1 2 3 4; do echo tick$i; sleep 0.3; done", background=True)
c = sb.commands.connect(h.pid)
check("connect(pid) follows the process", "tick4" in c.wait().stdout)

# Binary-safe-ish output and a larger volume.
r = sb.commands.run("head -c 300000 /dev/zero | tr '\\0' x")
check("300 kB of output arrives whole", len(r.stdout) == 300000)

sb.kill()
done("commands")
