"""A tiny "internet" for the network tests, run inside a network namespace the test made.

Serves, on the address given (a TEST-NET address inside the test's own namespace):
  - HTTP on :8080 (GET / -> 200 "hello from the test internet"; any Host accepted),
  - a TCP "hold" service on :8081 that answers each line with "ok" and keeps the connection,
  - UDP on :9999 that records datagrams,
  - DNS on :53 answering A queries for names in the zone below and NXDOMAIN for the rest,
  - HTTPS on :8443 (certificate and key given as the 3rd and 4th arguments), HTTP/1.1 keep-alive,
    each request logged with its Host and Authorization headers.
Every connection, datagram and DNS query is appended, one JSON line each, to the log file.
Exits when its stdin closes (the test owns its lifetime).
"""

import json
import socket
import struct
import sys
import threading

ADDR = sys.argv[1]
LOG = sys.argv[2]
CERT = sys.argv[3] if len(sys.argv) > 4 else None
KEY = sys.argv[4] if len(sys.argv) > 4 else None
ZONE = {"api.good.test.": ADDR, "pypi.good.test.": ADDR}
lock = threading.Lock()


def log(**kv):
    with lock, open(LOG, "a") as f:
        f.write(json.dumps(kv) + "\n")


def http():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ADDR, 8080))
    s.listen(64)
    while True:
        c, peer = s.accept()
        log(kind="tcp", port=8080, peer=peer[0])
        try:
            c.settimeout(5)
            c.recv(65536)
            body = b"hello from the test internet"
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        c.close()


def hold():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ADDR, 8081))
    s.listen(64)

    def serve(c):
        f = c.makefile("rwb")
        try:
            for line in f:
                log(kind="hold", line=line.decode(errors="replace").strip())
                f.write(b"ok\n")
                f.flush()
        except OSError:
            pass

    while True:
        c, peer = s.accept()
        log(kind="tcp", port=8081, peer=peer[0])
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ADDR, 9999))
    while True:
        data, peer = s.recvfrom(65536)
        log(kind="udp", port=9999, data=data.decode(errors="replace"))


def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ADDR, 53))
    while True:
        q, peer = s.recvfrom(4096)
        if len(q) < 12:
            continue
        tid, flags, qd = struct.unpack("!HHH", q[:6])
        i, labels = 12, []
        while i < len(q) and q[i]:
            n = q[i]
            labels.append(q[i + 1 : i + 1 + n].decode(errors="replace"))
            i += 1 + n
        name = ".".join(labels) + "."
        qtype = struct.unpack("!H", q[i + 1 : i + 3])[0] if i + 3 <= len(q) else 0
        question = q[12 : i + 5]
        log(kind="dns", name=name, qtype=qtype)
        ip = ZONE.get(name.lower())
        if ip and qtype == 1:
            ans = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(ip)
            resp = struct.pack("!HHHHHH", tid, 0x8180, 1, 1, 0, 0) + question + ans
        elif ip:
            resp = struct.pack("!HHHHHH", tid, 0x8180, 1, 0, 0, 0) + question
        else:
            resp = struct.pack("!HHHHHH", tid, 0x8183, 1, 0, 0, 0) + question
        s.sendto(resp, peer)


def tls():
    """HTTPS with keep-alive: logs each request's path, Host and Authorization (the test
    asserts what a broker injected); GET /bytes/N answers N bytes."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(CERT, KEY)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ADDR, 8443))
    s.listen(64)
    conns = [0]

    def serve(c, peer, n):
        try:
            c.settimeout(10)
            # Without it a response waits for the client's delayed ACK of the session ticket.
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = ctx.wrap_socket(c, server_side=True)
            log(kind="tls", port=8443, peer=peer[0], conn=n)
            f = t.makefile("rwb")
            while True:
                line = f.readline(65536)
                if not line:
                    break
                method, path, version = (line.decode(errors="replace").split() + ["", "", ""])[:3]
                headers = {}
                while True:
                    h = f.readline(65536)
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode(errors="replace").partition(":")
                    headers[k.strip().lower()] = v.strip()
                if int(headers.get("content-length", "0") or 0):
                    f.read(int(headers["content-length"]))
                log(kind="https", conn=n, method=method, path=path, host=headers.get("host"),
                    authorization=headers.get("authorization"), extra=headers.get("x-glovebox-test"))
                body = b"ok"
                if path.startswith("/bytes/"):
                    body = b"x" * int(path.split("/")[2])
                close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
                f.write(b"%s 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (
                    b"HTTP/1.0" if version == "HTTP/1.0" else b"HTTP/1.1", len(body),
                    b"Connection: close\r\n" if close else b""))
                f.write(body)
                f.flush()
                if close:
                    break
            t.close()
        except (OSError, ssl.SSLError, ValueError):
            c.close()

    while True:
        c, peer = s.accept()
        conns[0] += 1
        threading.Thread(target=serve, args=(c, peer, conns[0]), daemon=True).start()


targets = [http, hold, udp, dns] + ([tls] if CERT else [])
for target in targets:
    threading.Thread(target=target, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
