#!/usr/bin/env python3
"""Escape probes: run inside a Glovebox sandbox by `tests/adversarial.rs`.

Usage: python3 escape.py CONFIG.json   (the config file is deleted once read, so none of its
secrets is left anywhere a probe looks: not in argv, not in /tmp)

Prints one line per probe, tab separated:

    PROBE <name> <verdict> <detail>

verdict is BLOCKED (the attempt failed the way the jail should make it fail), ESCAPED (it
got through: a bug), or INFO (an observation the Rust side judges). A probe never does harm
when it gets through: it opens but does not write, sets the clock to the current time, never
mounts or signals anything on the host.

With "control": true in the config only the probes that are safe to run unsandboxed as root
on the host run; there they must report ESCAPED (proof that each probe can see an escape).

Syscall probes call the syscall directly (a tool could hide a success) with arguments the
kernel rejects; a result other than the seccomp filter's EPERM (or ENOSYS: not built in)
means the call reached the kernel's implementation, which counts as ESCAPED.
"""

import ctypes
import errno
import json
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time

def _load_config():
    if len(sys.argv) < 2:
        return {}
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    os.unlink(sys.argv[1])
    return cfg


CFG = _load_config()
CONTROL = bool(CFG.get("control"))
# The gVisor tier: the guest kernel is gVisor's sentry, not the host's. Where a probe's
# jail-specific check cannot apply there (no securebits, no ia32 ABI, gVisor's own sysfs and
# netstack, an identity uid map inside), it checks what stands in for it, and says so.
GVISOR = CFG.get("isolation") == "gvisor"
# Run as a code cell in a python kernel's own process (`"seat": "kernel"`), not as a command:
# the kernel keeps its protocol pipes (and IPython its event loop) as fds of its own, and its
# environment is a kernel's (`allowed_env`, the names a kernel the agent started has).
KERNEL = CFG.get("seat") == "kernel"

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

RESULTS = []


def out(name, verdict, detail=""):
    detail = str(detail).replace("\t", " ").replace("\n", " | ")[:400]
    RESULTS.append((name, verdict))
    print(f"PROBE\t{name}\t{verdict}\t{detail}", flush=True)


def sc(nr, *args):
    """A raw syscall; returns (result, errno)."""
    ctypes.set_errno(0)
    conv = [a if isinstance(a, (ctypes.c_void_p, ctypes.c_char_p)) else ctypes.c_long(a) for a in args]
    r = libc.syscall(ctypes.c_long(nr), *conv)
    return r, ctypes.get_errno()


def ename(e):
    return errno.errorcode.get(e, str(e))


def refused(r, e):
    """The seccomp filter's answer (EPERM), or a syscall this kernel does not have."""
    return r == -1 and e in (errno.EPERM, errno.ENOSYS)


def in_child(fn, timeout=10.0):
    """Runs fn() in a forked child (so a call that succeeds changes nothing here); returns
    its JSON-able result, or ("signal", N) if the child was killed."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        try:
            res = fn()
        except BaseException as ex:  # noqa: BLE001 - report anything
            res = ("exception", repr(ex))
        try:
            os.write(wr, json.dumps(res).encode())
        finally:
            os._exit(0)
    os.close(wr)
    data = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([rd], [], [], max(0.0, deadline - time.time()))
        if not r:
            break
        chunk = os.read(rd, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rd)
    for _ in range(200):
        p, st = os.waitpid(pid, os.WNOHANG)
        if p:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        p, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        return ["signal", os.WTERMSIG(st)]
    try:
        return json.loads(data.decode())
    except ValueError:
        return ["nothing", data.decode(errors="replace")]


def syscall_probe(name, nr, *args, child=False, fd_result=True):
    def call():
        r, e = sc(nr, *args)
        if r >= 0 and fd_result and r > 2:
            try:
                os.close(r)
            except OSError:
                pass
        return [r, e]

    r, e = in_child(call) if child else call()
    if refused(r, e):
        out(name, "BLOCKED", f"-1 {ename(e)}")
    else:
        out(name, "ESCAPED", f"reached the kernel: returned {r} {ename(e) if r == -1 else ''}")


def read_status():
    with open("/proc/self/status") as f:
        return dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)


# ---------------------------------------------------------------------------------------
# Privileges
# ---------------------------------------------------------------------------------------


def probe_caps():
    st = read_status()
    bad = []
    for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"):
        if k not in st and GVISOR:
            continue  # gVisor shows no CapAmb
        if int(st[k].strip(), 16) != 0:
            bad.append(f"{k}={st[k].strip()}")
    if "NoNewPrivs" in st:
        if st["NoNewPrivs"].strip() != "1":
            bad.append(f"NoNewPrivs={st['NoNewPrivs'].strip()}")
    elif not GVISOR:
        bad.append("NoNewPrivs missing")
    # gVisor shows no NoNewPrivs line: a seccomp
    # filter installed (Seccomp 2) with no capability at all is only possible with it set.
    if st.get("Seccomp", "0").strip() != "2":
        bad.append(f"Seccomp={st.get('Seccomp', '?').strip()}")
    out("capabilities+no_new_privs+seccomp", "ESCAPED" if bad else "BLOCKED", " ".join(bad) or "all capability sets 0, NoNewPrivs 1, Seccomp 2")


def probe_securebits():
    r, e = sc(157, 27)  # prctl(PR_GET_SECUREBITS)
    need = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
    if r >= 0 and r & need == need:
        out("securebits locked (NOROOT)", "BLOCKED", hex(r))
    elif GVISOR and r < 0:
        # No securebits in gVisor: an empty bounding set is what keeps uid 0 from gaining
        # capabilities at exec (exec grants at most the bounding set).
        bnd = read_status().get("CapBnd", "?").strip()
        out("securebits locked (NOROOT); gVisor: none, empty bounding set instead",
            "BLOCKED" if bnd.strip("0") == "" else "ESCAPED", f"securebits {ename(e)}; CapBnd {bnd}")
    else:
        out("securebits locked (NOROOT)", "ESCAPED", f"securebits {r} {ename(e)}")


def probe_uid_map():
    with open("/proc/self/uid_map") as f:
        cols = f.read().split()
    host = int(cols[1]) if len(cols) >= 3 else 0
    if len(cols) == 3 and host >= 1 << 30:
        out("uid 0 is an unprivileged host uid", "BLOCKED", " ".join(cols))
    elif GVISOR:
        # The map is gVisor's own; the host side (the sentry runs as an unprivileged host uid)
        # is checked by the test from the host.
        out("uid map inside gVisor (host side checked from the host)", "INFO", " ".join(cols[:6]))
    else:
        out("uid 0 is an unprivileged host uid", "ESCAPED", " ".join(cols[:6]))


def probe_setuid():
    # A setuid-root copy of python: exec must not give it any capability.
    src = os.path.realpath(sys.executable)
    dst = "/tmp/gbprobe-suid-python"
    try:
        with open(src, "rb") as s, open(dst, "wb") as d:
            d.write(s.read())
        os.chmod(dst, 0o4755)
        r = subprocess.run(
            [dst, "-c", "print(open('/proc/self/status').read())"],
            capture_output=True, timeout=20, text=True,
        )
        caps = {l.split(":")[0]: l.split(":")[1].strip() for l in r.stdout.splitlines() if l.startswith("Cap")}
        gained = {k: v for k, v in caps.items() if int(v, 16) != 0}
        out("setuid copy gains nothing", "ESCAPED" if gained or not caps else "BLOCKED",
            f"caps after exec: {gained or 'all 0'}")
    except OSError as ex:
        out("setuid copy gains nothing", "BLOCKED", f"could not even try: {ex}")
    finally:
        try:
            os.unlink(dst)
        except OSError:
            pass
    # The host's setuid binaries (su) are on a nosuid mount.
    try:
        r = subprocess.run(["su", "-c", "grep ^CapEff /proc/self/status", "root"], capture_output=True,
                           timeout=10, text=True, stdin=subprocess.DEVNULL)
        line = [l for l in r.stdout.splitlines() if l.startswith("CapEff")]
        gained = line and int(line[0].split()[1], 16) != 0
        out("su gains nothing", "ESCAPED" if gained else "BLOCKED",
            f"rc={r.returncode} {(line[0] if line else r.stderr.strip())[:120]}")
    except (OSError, subprocess.TimeoutExpired) as ex:
        out("su gains nothing", "BLOCKED", str(ex))


# ---------------------------------------------------------------------------------------
# Files: host, other sandboxes, /proc/*/exe
# ---------------------------------------------------------------------------------------


def pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def try_read(path, secret):
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
        return secret.encode() in data
    except OSError:
        return False


def probe_host_canary():
    path, secret = CFG["canary_path"], CFG["canary_secret"]
    ups = "/.." * 24
    tries = [path, "/proc/1/root" + path, "/proc/self/root" + path]
    for p in pids():
        tries += [f"/proc/{p}/root{path}", f"/proc/{p}/cwd{ups}{path}"]
        for fd in range(0, 16):
            tries.append(f"/proc/{p}/fd/{fd}{ups}{path}")
    hits = [t for t in tries if try_read(t, secret)]
    out("read a host file (canary)", "ESCAPED" if hits else "BLOCKED",
        f"via {hits[:3]}" if hits else f"{len(tries)} paths tried, none has the secret")


def probe_other_sandbox():
    # `other_secrets`: {which sandbox: its secret}, when there are several to look for.
    secrets = CFG.get("other_secrets") or ({"": CFG["other_secret"]} if CFG.get("other_secret") else {})
    roots = ["/tmp", "/home", "/dev/shm", "/var/tmp", "/run", "/root"]
    roots += [f"/proc/{p}/root/tmp" for p in pids()]
    for which, secret in sorted(secrets.items()):
        found = []
        for r in roots:
            for dirpath, _, files in os.walk(r):
                for n in files:
                    if try_read(os.path.join(dirpath, n), secret):
                        found.append(os.path.join(dirpath, n))
        name = f"read another sandbox's files ({which})" if which else "read another sandbox's files"
        out(name, "ESCAPED" if found else "BLOCKED", found[:3] or "secret not found")


def probe_write_outside():
    # Creates nothing on the host unless the jail is broken; the Rust side checks the host dir.
    d = CFG["host_dir"]
    made = []
    for p in [d + "/written-direct", "/proc/1/root" + d + "/written-proc1root"] + [
            f"/proc/self/fd/{fd}" + "/.." * 24 + d + f"/written-fd{fd}" for fd in range(0, 12)]:
        try:
            with open(p, "w") as f:
                f.write("escaped")
            made.append(p)
        except OSError:
            pass
    out("write outside (host dir)", "INFO", f"created inside the sandbox: {made[:2]}")


def probe_exe_overwrite():
    """CVE-2019-5736: reopen a runtime's binary through /proc/<pid>/exe for writing."""
    opened = []
    info = []
    for p in ["self", "1"] + [str(x) for x in pids()]:
        exe = f"/proc/{p}/exe"
        for flags in (os.O_WRONLY, os.O_RDWR):
            try:
                fd = os.open(exe, flags)
                os.close(fd)  # never write: opening is the escape
                opened.append(f"{exe}:{flags}")
            except OSError as ex:
                info.append(f"{exe}:{ename(ex.errno)}")
        try:
            fd = os.open(exe, os.O_PATH)
            try:
                fd2 = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)
                os.close(fd2)
                opened.append(f"{exe} via O_PATH reopen")
            except OSError:
                pass
            os.close(fd)
        except OSError:
            pass
    name = "overwrite /proc/self/exe, /proc/1/exe, /proc/*/exe"
    if GVISOR:
        # gVisor has no ETXTBSY: a command may open its own binary for writing, which copies it
        # up into its own writable layer. The agent's binary is a read-only bind of the host's.
        def is_agent(o):
            try:
                return os.readlink(o.split(":")[0].split(" ")[0]) == "/run/glovebox/glovebox-agent"
            except OSError:
                return False
        own = [o for o in opened if not is_agent(o)]
        agent = [o for o in opened if is_agent(o)]
        out("overwrite the agent's binary through /proc/*/exe (gVisor)", "ESCAPED" if agent else "BLOCKED",
            agent[:3] if agent else " ".join(sorted(set(info))[:6]))
        if own:
            out("open a command's own binary for writing (gVisor: copy-on-write in its own layer)", "INFO", own[:3])
    else:
        out(name, "ESCAPED" if opened else "BLOCKED", opened[:3] if opened else " ".join(sorted(set(info))[:6]))
    try:
        out("host path of the agent binary", "INFO", os.readlink("/proc/1/exe"))
    except OSError as ex:
        out("/proc/1/exe unreadable (agent not dumpable)", "BLOCKED", ename(ex.errno))


def probe_fds():
    """CVE-2024-21626: no fd of the host may be inherited."""
    extra = {}
    for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        if fd in (0, 1, 2):
            continue
        try:
            extra[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own fd, closed by now
    targets = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}
    if KERNEL:
        # The kernel's own: its protocol pipes and IPython's event loop, or a file that is the
        # very file its path names in here. Anything else (a socket: the zygote's control
        # channel; a file or directory of the host's or the zygote's) was inherited.
        def own(fd, t):
            if t.startswith(("pipe:", "anon_inode:")) or t == "/dev/null":
                return True
            try:
                a, b = os.fstat(fd), os.stat(t)
                return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
            except OSError:
                return False
        kept = sorted({t.split("[")[0] for fd, t in extra.items() if own(fd, t)})
        extra = {fd: t for fd, t in extra.items() if not own(fd, t)}
    bad = extra or any(not (t.startswith("pipe:") or t == "/dev/null") for t in targets.values())
    own_note = f" the kernel's own: {kept}" if KERNEL else ""
    out("inherited fds", "ESCAPED" if bad else "BLOCKED", f"extra={extra} std={targets}{own_note}")


def probe_env():
    allowed = set(CFG["allowed_env"]) if KERNEL else {"PATH", "HOME", "LANG", "USER"}
    extra = sorted(k for k in os.environ if k not in allowed)
    canary = CFG.get("daemon_canary", "\0")
    leaked = [p for p in pids() if try_read(f"/proc/{p}/environ", canary) or try_read(f"/proc/{p}/cmdline", canary)]
    bad = extra or leaked or any(canary in v for v in os.environ.values())
    out("environment leaks", "ESCAPED" if bad else "BLOCKED", f"extra vars {extra}, canary in pids {leaked}"
        if bad else f"only {sorted(os.environ)}")


# ---------------------------------------------------------------------------------------
# Denied syscalls
# ---------------------------------------------------------------------------------------

CLONE = {
    "CLONE_NEWUSER": 0x10000000, "CLONE_NEWNS": 0x00020000, "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWPID": 0x20000000, "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWTIME": 0x00000080,
}


def probe_namespaces():
    for flag, v in CLONE.items():
        syscall_probe(f"unshare({flag})", 272, v, child=True)

    def clone_newuser():
        r, e = sc(56, CLONE["CLONE_NEWUSER"] | signal.SIGCHLD, 0, 0, 0, 0)
        if r == 0:
            os._exit(0)  # the clone's child: leave at once
        if r > 0:
            os.waitpid(r, 0)
        return [r, e]

    r, e = in_child(clone_newuser)
    out("clone(CLONE_NEWUSER)", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")
    r, e = sc(435, 0, 0)  # clone3(NULL, 0): ENOSYS by design (glibc falls back to clone)
    out("clone3", "BLOCKED" if r == -1 and e == errno.ENOSYS else "ESCAPED", f"{r} {ename(e)}")

    def setns():
        fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        return list(sc(308, fd, 0))

    r = in_child(setns)
    out("setns", "BLOCKED" if r[0] == -1 and r[1] == errno.EPERM else "ESCAPED", r)
    for ns in ("mnt", "net", "pid", "user"):
        try:
            os.close(os.open(f"/proc/1/ns/{ns}", os.O_RDONLY))
            if GVISOR:
                # gVisor 2022 does not check access to /proc/1/ns (nor dumpability); setns is
                # refused above, so the fd leads nowhere.
                out(f"open /proc/1/ns/{ns} (the agent's; gVisor: opens, setns refused)", "INFO", "opened")
                continue
            out(f"open /proc/1/ns/{ns} (the agent's)", "ESCAPED", "opened")
        except OSError as ex:
            out(f"open /proc/1/ns/{ns} (the agent's)", "BLOCKED", ename(ex.errno))


def probe_mounts():
    syscall_probe("mount tmpfs", 165, ctypes.c_char_p(b"none"), ctypes.c_char_p(b"/tmp"),
                  ctypes.c_char_p(b"tmpfs"), 0, 0, child=True)
    syscall_probe("mount cgroup (v1 release_agent, CVE-2022-0492)", 165, ctypes.c_char_p(b"cgroup"),
                  ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"cgroup"), 0, ctypes.c_char_p(b"rdma"), child=True)
    syscall_probe("mount cgroup2", 165, ctypes.c_char_p(b"cgroup2"), ctypes.c_char_p(b"/tmp"),
                  ctypes.c_char_p(b"cgroup2"), 0, 0, child=True)
    syscall_probe("mount proc", 165, ctypes.c_char_p(b"proc"), ctypes.c_char_p(b"/tmp"),
                  ctypes.c_char_p(b"proc"), 0, 0, child=True)
    syscall_probe("umount2(/proc)", 166, ctypes.c_char_p(b"/proc"), 2, child=True)
    syscall_probe("umount2(/usr)", 166, ctypes.c_char_p(b"/usr"), 2, child=True)
    syscall_probe("chroot", 161, ctypes.c_char_p(b"/tmp"), child=True)
    syscall_probe("pivot_root", 155, 0, 0)
    syscall_probe("fsopen(tmpfs)", 430, ctypes.c_char_p(b"tmpfs"), 0)
    syscall_probe("open_tree(/)", 428, -100, ctypes.c_char_p(b"/"), 1)
    syscall_probe("move_mount", 429, -1, 0, -1, 0, 0)
    syscall_probe("mount_setattr", 442, -1, 0, 0, 0, 0)
    syscall_probe("fsmount", 432, -1, 0, 0)
    syscall_probe("fspick", 433, -1, 0, 0)
    syscall_probe("fsconfig", 431, -1, 0, 0, 0, 0)


def probe_kernel_surface():
    syscall_probe("keyctl", 250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID, session keyring
    syscall_probe("add_key", 248, 0, 0, 0, 0, 0)
    syscall_probe("request_key", 249, 0, 0, 0, 0)
    syscall_probe("bpf", 321, 0, 0, 0)
    syscall_probe("perf_event_open", 298, 0, 0, -1, -1, 0)
    syscall_probe("userfaultfd", 323, 0xFFFF)
    syscall_probe("io_uring_setup", 425, 1, 0)
    syscall_probe("io_uring_enter", 426, -1, 0, 0, 0, 0, 0)
    syscall_probe("io_uring_register", 427, -1, 0, 0, 0)
    syscall_probe("open_by_handle_at", 304, -1, 0, 0)
    syscall_probe("name_to_handle_at", 303, -100, 0, 0, 0, 0)
    syscall_probe("process_vm_readv(pid 1)", 310, 1, 0, 0, 0, 0, 0)
    syscall_probe("pidfd_getfd", 438, -1, 0, 0)
    syscall_probe("kcmp", 312, os.getpid(), 1, 0, 0, 0)
    syscall_probe("process_madvise", 440, -1, 0, 0, 0, 0)
    syscall_probe("reboot (bad magic)", 169, 0, 0, 0, 0)
    syscall_probe("syslog (size)", 103, 10, 0, 0)
    syscall_probe("fanotify_init", 300, 0, 0)
    syscall_probe("clock_adjtime (read)", 305, 0, 0)
    syscall_probe("adjtimex (NULL)", 159, 0)
    syscall_probe("modify_ldt (read)", 154, 0, 0, 0)
    syscall_probe("personality(READ_IMPLIES_EXEC)", 135, 0x0400000, child=True)
    syscall_probe("memfd_secret", 447, 0)
    syscall_probe("move_pages", 279, 0, 0, 0, 0, 0, 0)
    syscall_probe("get_robust_list", 274, 0, 0, 0)
    if CONTROL:
        return
    # Not safe to reach on the host: only run sandboxed.
    syscall_probe("kexec_load (bad flags)", 246, 0, 0, 0, 0x100)
    syscall_probe("kexec_file_load (bad fds)", 320, -1, -1, 0, 0, 0)
    syscall_probe("init_module", 175, 0, 0, 0)
    syscall_probe("finit_module", 313, -1, 0, 0)
    syscall_probe("delete_module", 176, 0, 0)
    syscall_probe("swapon", 167, 0, 0)
    syscall_probe("swapoff", 168, 0)
    syscall_probe("acct (bad pointer)", 163, 1)
    syscall_probe("quotactl", 179, 0, 0, 0, 0)
    syscall_probe("iopl(3)", 172, 3, child=True)
    syscall_probe("ioperm", 173, 0x80, 1, 1, child=True)
    syscall_probe("vhangup", 153, child=True)
    syscall_probe("migrate_pages", 256, 0, 0, 0, 0)
    syscall_probe("x32 getpid", 0x40000000 | 39)


def probe_i386_abi():
    """`int 0x80`: the i386 table names other syscalls; the filter kills the process."""
    code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"  # mov eax, 20 (i386 getpid); int 0x80; ret

    def run():
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        return ["returned", ctypes.CFUNCTYPE(ctypes.c_int)(addr)(), os.getpid()]

    r = in_child(run)
    if GVISOR and r[0] == "returned" and r[1] != r[2]:
        # gVisor has no ia32 ABI: the call ran as the x86_64 call of that number (writev),
        # under the same filter, so no number means another call than the filter checked.
        out("i386 int 0x80 (gVisor: no ia32 ABI)", "BLOCKED", f"returned {r[1]}, not i386 getpid {r[2]}")
        return
    if r[0] == "signal" and r[1] == signal.SIGSYS:
        out("i386 int 0x80", "BLOCKED", "killed by SIGSYS")
    elif r[0] == "signal":
        out("i386 int 0x80", "BLOCKED", f"killed by signal {r[1]} (no ia32 emulation)")
    else:
        out("i386 int 0x80", "ESCAPED", r)


def probe_ptrace():
    def traceme():
        return list(sc(101, 0, 0, 0, 0))

    r = in_child(traceme)
    out("ptrace(PTRACE_TRACEME)", "BLOCKED" if refused(*r) else "ESCAPED", r)
    pid = os.fork()
    if pid == 0:
        time.sleep(10)
        os._exit(0)
    try:
        r, e = sc(101, 0x4206, pid, 0, 0)  # PTRACE_SEIZE own child
        out("ptrace(PTRACE_SEIZE, own child)", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not CONTROL:
        r, e = sc(101, 16, 1, 0, 0)  # PTRACE_ATTACH to the agent
        out("ptrace(PTRACE_ATTACH, 1)", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")
        for what in ("mem", "environ", "fd", "maps"):
            p = f"/proc/1/{what}"
            try:
                if what == "fd":
                    fds = os.listdir(p)
                else:
                    with open(p, "rb") as f:
                        got = f.read(16)
                if GVISOR and what != "mem":
                    # gVisor 2022 ignores dumpability for these: the agent keeps nothing in
                    # them worth having (no environment, no host fd, its cgroup cap not
                    # writable by commands; maps are guest addresses only).
                    if what == "fd":
                        host = [n for n in fds if os.readlink(f"{p}/{n}").startswith("host:")]
                        out("read /proc/1/fd (agent; gVisor: listable, no host file)", "ESCAPED" if host else "BLOCKED",
                            f"host fds {host}" if host else f"fds {sorted(fds, key=int)}")
                    elif what == "environ":
                        with open(p, "rb") as f:
                            env = [e.split(b"=", 1)[0].decode(errors="replace") for e in f.read().split(b"\0") if e]
                        extra = [k for k in env if k not in ("HOME", "PATH")]
                        out("read /proc/1/environ (agent; gVisor: readable, runsc's HOME only)",
                            "ESCAPED" if extra else "BLOCKED", f"variables {env}")
                    else:
                        out("read /proc/1/maps (agent; gVisor: guest addresses)", "INFO", "readable")
                    continue
                out(f"read /proc/1/{what} (agent)", "ESCAPED", "readable")
            except OSError as ex:
                out(f"read /proc/1/{what} (agent)", "BLOCKED", ename(ex.errno))


def probe_mknod():
    for name, mode, dev in (("char device (null)", 0o020666, os.makedev(1, 3)),
                            ("char device (mem)", 0o020600, os.makedev(1, 1)),
                            ("block device (sda)", 0o060600, os.makedev(8, 0))):
        path = f"/tmp/gbprobe-node-{os.getpid()}"
        r, e = sc(133, ctypes.c_char_p(path.encode()), mode, dev)
        if r == 0:
            os.unlink(path)
        r2, e2 = sc(259, -100, ctypes.c_char_p(path.encode()), mode, dev)
        if r2 == 0:
            os.unlink(path)
        ok = refused(r, e) and refused(r2, e2)
        out(f"mknod {name}", "BLOCKED" if ok else "ESCAPED", f"mknod {r} {ename(e)}, mknodat {r2} {ename(e2)}")


def probe_tiocsti():
    """Typing into a terminal: TIOCSTI (and its 64-bit alias) and TIOCLINUX are refused."""
    try:
        mfd = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
    except OSError as ex:
        out("TIOCSTI", "BLOCKED", f"no pty: {ename(ex.errno)}")
        return
    try:
        libc.grantpt(mfd)
        libc.unlockpt(mfd)
        libc.ptsname.restype = ctypes.c_char_p
        sfd = os.open(libc.ptsname(mfd).decode(), os.O_RDWR | os.O_NOCTTY)
        ch = ctypes.c_char(b"x")
        for name, req in (("TIOCSTI", 0x5412), ("TIOCSTI (high bits set)", 0x100005412), ("TIOCLINUX", 0x541C)):
            ctypes.set_errno(0)
            r = libc.ioctl(sfd, ctypes.c_ulong(req), ctypes.byref(ch))
            e = ctypes.get_errno()
            out(f"ioctl {name} on a pty", "BLOCKED" if r == -1 and e == errno.EPERM else "ESCAPED", f"{r} {ename(e)}")
        os.close(sfd)
    finally:
        os.close(mfd)
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
        out("open /dev/tty (a controlling terminal)", "ESCAPED", "opened")
    except OSError as ex:
        out("open /dev/tty (a controlling terminal)", "BLOCKED", ename(ex.errno))


# ---------------------------------------------------------------------------------------
# Kernel knobs, cgroups, clocks, hostname, signals
# ---------------------------------------------------------------------------------------


def probe_proc_sys():
    # Opened for writing, never written.
    paths = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/kernel/hostname",
             "/proc/sys/net/ipv4/ip_forward", "/proc/sys/vm/drop_caches", "/proc/sys/fs/binfmt_misc/register",
             "/proc/sysrq-trigger", "/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled",
             "/sys/fs/cgroup/cgroup.procs", "/proc/self/oom_score_adj"]
    for p in paths:
        try:
            fd = os.open(p, os.O_WRONLY)
            os.close(fd)
            verdict = "INFO" if p == "/proc/self/oom_score_adj" else "ESCAPED"
            out(f"open {p} for writing", verdict, "opened (nothing written)")
        except OSError as ex:
            out(f"open {p} for writing", "BLOCKED", ename(ex.errno))
    if CONTROL:
        return
    sys_entries = os.listdir("/sys") if os.path.isdir("/sys") else []
    if GVISOR and sys_entries:
        # gVisor's own sysfs (synthetic, nothing of the host's kernel): nothing in it opens for writing.
        writable, seen = [], 0
        for root, _dirs, files in os.walk("/sys"):
            if root.startswith("/sys/class/net/"):
                continue  # the netstack's own knobs of the sandbox's own interfaces (GRO timeout)
            for n in files:
                seen += 1
                try:
                    os.close(os.open(os.path.join(root, n), os.O_WRONLY | os.O_NONBLOCK))
                    writable.append(os.path.join(root, n))
                except OSError:
                    pass
            if seen > 5000:
                break
        out("/sys is gVisor's own and read-only", "ESCAPED" if writable else "BLOCKED",
            writable[:3] or f"{seen} files, none writable")
        return
    out("/sys is empty", "ESCAPED" if sys_entries else "BLOCKED", sys_entries[:5] or "nothing mounted")


def probe_cgroups():
    with open("/proc/self/cgroup") as f:
        lines = f.read().split()
    # Paths are relative to the cgroup namespace's root (the sandbox's cgroup): a command's
    # own child (`/cmd-N`) is fine, anything above the root (`/..`) or host names are not.
    outside = [l for l in lines if l.split(":", 2)[-1].startswith("/..") or "glovebox" in l]
    out("/proc/self/cgroup shows nothing above the sandbox", "ESCAPED" if outside else "BLOCKED",
        outside[:3] or " ".join(lines)[:200])
    found, writable = [], []
    for top in ("/sys", "/dev", "/run", "/tmp", "/proc/1/root/sys"):
        try:
            for dirpath, dirs, files in os.walk(top):
                if dirpath.count("/") > 8:
                    dirs[:] = []
                for n in files:
                    if n in ("release_agent", "cgroup.procs", "notify_on_release", "tasks", "cgroup.subtree_control"):
                        p = os.path.join(dirpath, n)
                        found.append(p)
                        try:
                            os.close(os.open(p, os.O_WRONLY))
                            writable.append(p)
                        except OSError:
                            pass
        except OSError:
            pass
    out("cgroup files reachable (release_agent, cgroup.procs)", "ESCAPED" if writable else "BLOCKED",
        f"found {found[:3]}, writable {writable[:3]}")


def probe_clock_and_hostname():
    class Timeval(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    now = time.time()
    tv = Timeval(int(now), 0)  # the current time: harmless even if it got through
    r, e = sc(164, ctypes.c_void_p(ctypes.addressof(tv)), 0)
    out("settimeofday", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")
    ts = Timespec(int(time.time()), 0)
    r, e = sc(227, 0, ctypes.c_void_p(ctypes.addressof(ts)))
    out("clock_settime(CLOCK_REALTIME)", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")
    name = b"gbprobe-pwned"
    r, e = sc(170, ctypes.c_char_p(name), len(name))
    out("sethostname", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")
    r, e = sc(171, ctypes.c_char_p(name), len(name))
    out("setdomainname", "BLOCKED" if refused(r, e) else "ESCAPED", f"{r} {ename(e)}")


def probe_kill():
    dpid = CFG.get("daemon_pid")
    if dpid:
        visible = os.path.exists(f"/proc/{dpid}")
        what = ""
        if visible:
            try:
                with open(f"/proc/{dpid}/cmdline", "rb") as f:
                    what = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
        try:
            os.kill(dpid, signal.SIGKILL)
            sent = "sent"
        except OSError as ex:
            sent = ename(ex.errno)
        esc = "serve" in what
        out("kill -9 the daemon's host pid", "ESCAPED" if esc else "BLOCKED",
            f"pid {dpid}: {sent}; it is {'the daemon' if esc else 'not the daemon here'} {what[:60]}")
    before = os.path.exists("/proc/1")
    try:
        os.kill(1, signal.SIGKILL)
        sent = "sent (ignored by the kernel)"
    except OSError as ex:
        sent = ename(ex.errno)
    time.sleep(0.2)
    alive = os.path.exists("/proc/1")
    out("kill -9 pid 1 (the agent)", "BLOCKED" if before and alive else "ESCAPED", f"{sent}; pid 1 alive: {alive}")
    # A signal sent on a file's behalf: pid 1 as a socket's owner, SIGKILL as its I/O signal.
    import fcntl
    steps = []
    a, b = socket.socketpair()
    for what, fn in (("F_SETOWN 1", lambda: fcntl.fcntl(a, fcntl.F_SETOWN, 1)),
                     ("F_SETSIG SIGKILL", lambda: fcntl.fcntl(a, 10, signal.SIGKILL)),
                     ("O_ASYNC", lambda: fcntl.fcntl(a, fcntl.F_SETFL, fcntl.fcntl(a, fcntl.F_GETFL) | os.O_ASYNC))):
        try:
            fn()
            steps.append(f"{what} ok")
        except OSError as ex:
            steps.append(f"{what} {ename(ex.errno)}")
    try:
        b.send(b"x")
    except OSError:
        pass
    time.sleep(0.2)
    alive = os.path.exists("/proc/1")
    out("SIGIO/F_SETSIG SIGKILL to pid 1 through a socket's owner", "BLOCKED" if alive else "ESCAPED",
        f"{'; '.join(steps)}; pid 1 alive: {alive}")


def probe_zygote():
    """A python kernel zygote (`zygote_pids`: its processes' host pids, and another tenant's
    zygote's) is in no sandbox's PID namespace: from here its pids name nothing, or a process
    of this sandbox (then it is left alone). The host checks that every zygote process
    survived."""
    zpids = CFG.get("zygote_pids")
    if not zpids:
        return
    mine = set(pids())
    reached, notes = [], []
    for zp in zpids:
        if zp in mine and not CONTROL:
            notes.append(f"{zp}: a process of this sandbox, left alone")
            continue
        for what, fn in (
            ("kill -9", lambda: os.kill(zp, signal.SIGKILL)),
            ("pidfd_open", lambda: os.close(os.pidfd_open(zp))),
            ("open /proc/PID/ns/user", lambda: os.close(os.open(f"/proc/{zp}/ns/user", os.O_RDONLY))),
            ("list /proc/PID/root", lambda: os.listdir(f"/proc/{zp}/root")),
            ("read /proc/PID/environ", lambda: open(f"/proc/{zp}/environ", "rb").close()),
        ):
            try:
                fn()
                reached.append(f"{what} {zp}")
            except OSError as ex:
                notes.append(f"{what} {zp}: {ename(ex.errno)}")
        r, e = sc(101, 16, zp, 0, 0)  # PTRACE_ATTACH
        if refused(r, e) or (r == -1 and e == errno.ESRCH):
            notes.append(f"ptrace {zp}: {ename(e)}")
        else:
            reached.append(f"ptrace {zp}: {r}")
    out("reach the zygote's host pids (kill, pidfd, ptrace, /proc)", "ESCAPED" if reached else "BLOCKED",
        reached[:3] or " ".join(notes[:8]))


# ---------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------


def connect_probe(name, family, typ, addr, proto=0, payload=b"gbprobe-canary"):
    try:
        s = socket.socket(family, typ, proto)
    except OSError as ex:
        out(name, "BLOCKED", f"socket: {ename(ex.errno)}")
        return
    s.settimeout(2)
    try:
        if typ == socket.SOCK_DGRAM:
            s.sendto(payload, addr)
            out(name, "INFO", "datagram sent (the host canary decides)")
        else:
            s.connect(addr)
            out(name, "ESCAPED", "connected")
    except OSError as ex:
        out(name, "BLOCKED", ename(ex.errno) if ex.errno else type(ex).__name__)
    finally:
        s.close()


def probe_sockets():
    fams = [
        ("AF_PACKET raw", socket.AF_PACKET, socket.SOCK_RAW, 0),
        ("AF_PACKET dgram", socket.AF_PACKET, socket.SOCK_DGRAM, 0),
        ("AF_INET raw (ICMP)", socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        ("AF_INET6 raw", socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
        ("ICMP ping socket", socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        ("ICMPv6 ping socket", socket.AF_INET6, socket.SOCK_DGRAM, socket.IPPROTO_ICMPV6),
        ("netlink audit", socket.AF_NETLINK, socket.SOCK_RAW, 9),
        ("netlink uevent", socket.AF_NETLINK, socket.SOCK_DGRAM, 15),
        ("netlink netfilter", socket.AF_NETLINK, socket.SOCK_RAW, 12),
        ("netlink generic", socket.AF_NETLINK, socket.SOCK_RAW, 16),
        ("netlink xfrm", socket.AF_NETLINK, socket.SOCK_RAW, 6),
        ("netlink sock_diag", socket.AF_NETLINK, socket.SOCK_RAW, 4),
        ("AF_VSOCK", 40, socket.SOCK_STREAM, 0),
        ("AF_ALG", 38, socket.SOCK_SEQPACKET, 0),
        ("AF_KEY", 15, socket.SOCK_RAW, 2),
        ("AF_BLUETOOTH", 31, socket.SOCK_RAW, 0),
        ("AF_CAN", 29, socket.SOCK_RAW, 1),
        ("AF_XDP", 44, socket.SOCK_RAW, 0),
    ]
    for name, fam, typ, proto in fams:
        r, e = sc(41, fam, typ, proto)
        if r >= 0:
            os.close(r)
            if GVISOR and "ping socket" in name:
                # gVisor's netstack has its own ping sockets; whether an echo leaves is probed
                # in probe_egress.
                out(f"socket {name} (gVisor's netstack)", "INFO", "opened")
                continue
            out(f"socket {name}", "ESCAPED", "opened")
        else:
            out(f"socket {name}", "BLOCKED", ename(e))
    # Route netlink is allowed (getaddrinfo, ip): a sanity check that the filter is not a wall.
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
        out("socket netlink route (allowed on purpose)", "INFO", "opened")
    except OSError as ex:
        out("socket netlink route (allowed on purpose)", "INFO", ename(ex.errno))


def probe_egress():
    ifs = [n for _, n in socket.if_nameindex()]
    with open("/proc/net/route") as f:
        routes = f.read().splitlines()[1:]
    if GVISOR:
        # A gVisor sandbox always has its link (runsc's netstack takes it over at start); under
        # deny-all the host-side rules refuse everything it sends: the canary rows below, and
        # an echo to the gateway, show it.
        out("network interfaces (gVisor: eth0 behind deny-all host rules)", "INFO", ifs)
        out("IPv4 routes (gVisor)", "INFO", routes[:2] or "none")
    else:
        out("network interfaces", "ESCAPED" if ifs != ["lo"] else "BLOCKED", ifs)
        out("IPv4 routes", "ESCAPED" if routes else "BLOCKED", routes[:2] or "none")
    for label, port_key in (("host", "tcp4"), ("netns", "ns_tcp")):
        if CFG.get(port_key):
            connect_probe(f"TCP 127.0.0.1:{CFG[port_key]} ({label} canary)", socket.AF_INET, socket.SOCK_STREAM,
                          ("127.0.0.1", CFG[port_key]))
    for label, port_key in (("host", "udp4"), ("netns", "ns_udp"), ("host DNS", "dns_port")):
        if CFG.get(port_key):
            connect_probe(f"UDP 127.0.0.1:{CFG[port_key]} ({label} canary)", socket.AF_INET, socket.SOCK_DGRAM,
                          ("127.0.0.1", CFG[port_key]))
    if CFG.get("tcp6"):
        connect_probe(f"TCP [::1]:{CFG['tcp6']} (host canary)", socket.AF_INET6, socket.SOCK_STREAM, ("::1", CFG["tcp6"]))
    if CFG.get("udp6"):
        connect_probe(f"UDP [::1]:{CFG['udp6']} (host canary)", socket.AF_INET6, socket.SOCK_DGRAM, ("::1", CFG["udp6"]))
    # DNS: no resolver configured, and a query sent by hand to the host's DNS canary port.
    names = []
    for n in ("example.test", "metadata.google.internal", "localhost.gbprobe.test"):
        try:
            socket.getaddrinfo(n, 80)
            names.append(n)
        except OSError:
            pass
    out("DNS resolution", "ESCAPED" if names else "BLOCKED", names or "no name resolves")
    if CFG.get("dns_port"):
        q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"\x07gbprobe\x04test\x00\x00\x01\x00\x01"
        connect_probe("DNS query to the host canary", socket.AF_INET, socket.SOCK_DGRAM,
                      ("127.0.0.1", CFG["dns_port"]), payload=q)
    # ICMP echo to the host: needs a raw socket (CAP_NET_RAW) or a ping socket (ping_group_range).
    sent = False
    for fam, proto, addr in ((socket.AF_INET, socket.IPPROTO_ICMP, "127.0.0.1"),
                             (socket.AF_INET6, socket.IPPROTO_ICMPV6, "::1")):
        for typ in (socket.SOCK_DGRAM, socket.SOCK_RAW):
            try:
                s = socket.socket(fam, typ, proto)
                s.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01", (addr, 0))
                s.close()
                sent = True
            except OSError:
                pass
    if GVISOR:
        # gVisor's netstack has ping sockets, and 127.0.0.1 is its own loopback: what matters is
        # whether an echo leaves. The gateway (the host end of the link) must not answer.
        gw = next((socket.inet_ntoa(struct.pack("<I", int(r.split()[2], 16))) for r in routes
                   if r.split()[1] == "00000000"), None)
        reply = "no default route"
        if gw:
            try:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
                s.settimeout(1.0)
                s.sendto(b"\x08\x00\x00\x00\x00\x01\x00\x01", (gw, 0))
                reply = f"reply from {s.recvfrom(64)[1][0]}"
            except OSError as ex:
                reply = f"no reply ({type(ex).__name__})"
        out("ICMP echo to the host end of the link (gVisor)", "ESCAPED" if reply.startswith("reply") else "BLOCKED",
            f"{gw}: {reply}")
    else:
        out("ICMP echo", "ESCAPED" if sent else "BLOCKED", "an ICMP socket sent" if sent else "no ICMP socket can be opened")
    if CFG.get("abstract_name"):
        connect_probe("connect to the host's abstract unix socket", socket.AF_UNIX, socket.SOCK_STREAM,
                      "\0" + CFG["abstract_name"])
    if CFG.get("unix_path"):
        connect_probe("connect to a host unix socket path", socket.AF_UNIX, socket.SOCK_STREAM, CFG["unix_path"])
    with open("/proc/net/unix") as f:
        names = [l.split()[-1] for l in f.read().splitlines()[1:] if len(l.split()) > 7]
    host_like = [n for n in names if CFG.get("abstract_name", "\0") in n]
    out("host abstract sockets listed in /proc/net/unix", "ESCAPED" if host_like else "BLOCKED",
        host_like or f"{len(names)} own sockets only")


PROBES = [
    (probe_caps, True), (probe_securebits, True), (probe_uid_map, True), (probe_host_canary, True),
    (probe_namespaces, True), (probe_kernel_surface, True), (probe_ptrace, True), (probe_tiocsti, True),
    (probe_proc_sys, True), (probe_i386_abi, True),
    (probe_setuid, False), (probe_other_sandbox, False), (probe_write_outside, False),
    (probe_exe_overwrite, False), (probe_fds, False), (probe_env, False), (probe_mounts, False),
    (probe_mknod, False), (probe_cgroups, False), (probe_clock_and_hostname, False), (probe_kill, False),
    (probe_sockets, False), (probe_egress, False), (probe_zygote, True),
]

if __name__ == "__main__":
    only = CFG.get("only")
    for fn, safe_on_host in PROBES:
        if CONTROL and not safe_on_host:
            continue
        if only and fn.__name__ not in only:
            continue
        try:
            fn()
        except Exception as ex:  # noqa: BLE001 - a probe that crashes is reported, not fatal
            out(fn.__name__, "ERROR", repr(ex))
    print(f"DONE\t{len(RESULTS)}", flush=True)
