"""Exposed ports: servers listening inside a sandbox, reached through `cella serve`'s gateway
with the E2B headers (HTTP with streamed bodies, WebSocket), and the traffic access token of
sandboxes created with allowPublicTraffic=false."""

import base64
import hashlib
import os
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import pytest
from e2b import Sandbox

GATEWAY = os.environ.get("E2B_SANDBOX_URL", "")

# A WebSocket echo server on the standard library only (RFC 6455: handshake, unmasking,
# text frames up to 64 KiB), started inside the sandbox.
WS_ECHO = r'''
import base64, hashlib, socket, threading
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        chunk = c.recv(n - len(b))
        if not chunk:
            raise EOFError
        b += chunk
    return b
def serve(c):
    req = b""
    while b"\r\n\r\n" not in req:
        req += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID.encode()).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            h = recv_exact(c, 2)
            op, n = h[0] & 0x0F, h[1] & 0x7F
            if n == 126:
                n = int.from_bytes(recv_exact(c, 2), "big")
            mask = recv_exact(c, 4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(recv_exact(c, n)))
            if op == 8:
                break
            reply = b"echo:" + data
            c.sendall(bytes([0x81, 126]) + len(reply).to_bytes(2, "big") + reply if len(reply) > 125 else bytes([0x81, len(reply)]) + reply)
    except EOFError:
        pass
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765))
s.listen()
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
'''


def wait_listening(sb, port):
    for _ in range(100):
        if sb.commands.run(f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo up || true").stdout.strip() == "up":
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} in the sandbox")


def request(sb, port, path="/", data=None, headers=None, method=None):
    h = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": str(port)}
    h.update(headers or {})
    req = urllib.request.Request(GATEWAY + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def test_http_server_in_the_sandbox_is_reachable_through_the_gateway(sandbox):
    sandbox.files.write("/home/user/site/hello.txt", "hello from the sandbox\n")
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    wait_listening(sandbox, 8000)
    status, body, _ = request(sandbox, 8000, "/hello.txt")
    assert (status, body) == (200, b"hello from the sandbox\n")
    status, body, _ = request(sandbox, 8000, "/missing")
    assert status == 404
    # A large answer streams through unchanged.
    sandbox.commands.run("head -c 5000000 /dev/urandom > /home/user/site/big.bin")
    status, body, _ = request(sandbox, 8000, "/big.bin")
    assert status == 200 and len(body) == 5000000
    assert hashlib.sha256(body).hexdigest() == sandbox.commands.run("sha256sum /home/user/site/big.bin").stdout.split()[0]


def test_request_bodies_and_the_host_label_route(sandbox):
    # An echo server: answers with the method, path, Host and the body it received.
    server = (
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "class H(BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        body = self.rfile.read(int(self.headers['Content-Length']))\n"
        "        out = b'POST ' + self.path.encode() + b' ' + self.headers['Host'].encode() + b' ' + body\n"
        "        self.send_response(201); self.send_header('Content-Length', str(len(out))); self.end_headers(); self.wfile.write(out)\n"
        "HTTPServer(('0.0.0.0', 8001), H).serve_forever()\n"
    )
    sandbox.files.write("/home/user/echo.py", server)
    sandbox.commands.run("python3 /home/user/echo.py", background=True)
    wait_listening(sandbox, 8001)
    status, body, _ = request(sandbox, 8001, "/submit?x=1", data=b"x" * 100000)
    assert status == 201
    assert body.startswith(b"POST /submit?x=1 ")
    assert body.endswith(b" " + b"x" * 100000)
    # The client's Host reaches the server unchanged (dev servers check it).
    status, body, _ = request(sandbox, 8001, "/h", data=b"y", headers={"Host": "app.example"})
    assert status == 201 and b" app.example " in body


def test_an_unreachable_port_is_a_502_that_says_why(sandbox):
    status, body, _ = request(sandbox, 8999, "/")
    assert status == 502
    assert b"port 8999" in body and b"not reachable" in body


def test_envd_internal_routes_stay_private(sandbox):
    status, body, _ = request(sandbox, 49983, "/__cella/forward/8000", headers={"X-Access-Token": sandbox._envd_access_token or ""})
    assert status == 403, body


def websocket_roundtrip(sb, messages, extra_headers=None):
    u = urlparse(GATEWAY)
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: {u.hostname}:{u.port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        f"E2b-Sandbox-Id: {sb.sandbox_id}",
        "E2b-Sandbox-Port: 8765",
    ] + [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    status = int(head.split(b" ", 2)[1])
    if status != 101:
        s.close()
        return status, []
    expect = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    assert expect in head
    replies = []
    for m in messages:
        data = m.encode()
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        s.sendall(bytes([0x81, 0x80 | len(data)]) + mask + masked)
        h = s.recv(2)
        n = h[1] & 0x7F
        payload = b""
        while len(payload) < n:
            payload += s.recv(n - len(payload))
        replies.append(payload.decode())
    s.close()
    return status, replies


def test_websocket_echo_through_the_gateway(sandbox):
    sandbox.files.write("/home/user/ws.py", WS_ECHO)
    sandbox.commands.run("python3 /home/user/ws.py", background=True)
    wait_listening(sandbox, 8765)
    status, replies = websocket_roundtrip(sandbox, ["one", "two", "three"])
    assert status == 101
    assert replies == ["echo:one", "echo:two", "echo:three"]


def test_private_ports_need_the_traffic_access_token():
    sb = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        token = sb.traffic_access_token
        assert token, "a sandbox with allowPublicTraffic=false gets a trafficAccessToken"
        sb.files.write("/home/user/site/index.html", "private page")
        sb.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
        wait_listening(sb, 8000)
        status, body, _ = request(sb, 8000, "/index.html")
        assert status == 403 and b"e2b-traffic-access-token" in body
        status, body, _ = request(sb, 8000, "/index.html", headers={"e2b-traffic-access-token": "wrong"})
        assert status == 403
        status, body, _ = request(sb, 8000, "/index.html", headers={"e2b-traffic-access-token": token})
        assert (status, body) == (200, b"private page")
        # envd itself is exempt (it checks X-Access-Token on its own), as on E2B.
        assert sb.commands.run("echo ok").stdout == "ok\n"
        sb.files.write("/home/user/ws.py", WS_ECHO)
        sb.commands.run("python3 /home/user/ws.py", background=True)
        wait_listening(sb, 8765)
        assert websocket_roundtrip(sb, ["x"])[0] == 403
        assert websocket_roundtrip(sb, ["x"], {"e2b-traffic-access-token": token}) == (101, ["echo:x"])
    finally:
        sb.kill()


def test_public_sandboxes_have_no_traffic_token(sandbox):
    assert sandbox.traffic_access_token is None
