#!/usr/bin/env python3
"""A whole agent task through the session daemon's API, the way a harness
drives it: Python's standard library only.

  tests/harness/agent_task.py AGENTBOX_BIN

1. A local git repository (a small Node project) is cloned on the host; the
   clone is the session's workspace.
2. Its dependency comes from an npm-style registry served here on loopback,
   through `filesystem.caches: {npm: ~/.npm}`: a second session's `npm ci`
   downloads nothing again.
3. Its dev server runs as a service; its port is exposed on the host's
   loopback and fetched from here; the service is restarted and its logs read.
4. The code is edited and tested through a terminal (WebSocket).
5. The session's diff (`?format=patch`, a binary file among the changes) is
   `git apply`ed in a fresh clone, which then matches the session's files.

Prints what it did; exits 0 when every step held, 1 otherwise.
"""
import base64
import hashlib
import http.client
import http.server
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request

AGENTBOX = os.path.abspath(sys.argv[1])
FAILURES = []


def check(cond, what, detail=""):
    print(("ok    " if cond else "FAIL  ") + what + ("" if cond or not detail else "\n      " + str(detail)[:2000]))
    if not cond:
        FAILURES.append(what)
    return cond


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Api:
    def __init__(self, sock):
        self.sock = sock

    def call(self, method, target, body=None, raw=False):
        conn = UnixHTTPConnection(self.sock)
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, target, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        if raw:
            return resp.status, text
        try:
            return resp.status, json.loads(text) if text else None
        except ValueError:
            return resp.status, text.decode(errors="replace")


class WebSocket:
    """A minimal RFC 6455 client on a unix socket: masked frames out, text and binary in."""

    def __init__(self, sock_path, target):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(30)
        self.s.connect(sock_path)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (target, key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.s.recv(4096)
            if not chunk:
                raise IOError("closed during the handshake")
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n")[0]
        if b" 101 " not in status:
            raise IOError("handshake refused: " + status.decode(errors="replace"))
        accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        if accept not in head:
            raise IOError("bad Sec-WebSocket-Accept")
        self.output = b""
        self.texts = []
        self.closed = False

    def send(self, data, opcode=2):
        if isinstance(data, str):
            data = data.encode()
        mask = os.urandom(4)
        n = len(data)
        header = bytes([0x80 | opcode])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        self.s.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _need(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_message(self):
        b0, b1 = self._need(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._need(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._need(8))[0]
        payload = self._need(n)
        opcode = b0 & 0x0F
        if opcode == 8:
            self.closed = True
            raise EOFError
        if opcode == 9:
            self.send(payload, 10)
            return
        if opcode == 2 or opcode == 0:
            self.output += payload
        elif opcode == 1:
            self.texts.append(json.loads(payload))

    def read_until(self, needle, timeout=120):
        needle = needle.encode() if isinstance(needle, str) else needle
        deadline = time.time() + timeout
        while needle not in self.output:
            if time.time() > deadline or self.closed:
                return False
            try:
                self.read_message()
            except (EOFError, socket.timeout):
                return needle in self.output
        return True

    def close(self):
        try:
            self.send(struct.pack("!H", 1000), 8)
        finally:
            self.s.close()


def package_tarball(name, version):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for path, content in {
            "package/package.json": json.dumps({"name": name, "version": version, "main": "index.js"}),
            "package/index.js": "module.exports = (s, n, c) => String(s).padStart(n, c || ' ');\n",
        }.items():
            info = tarfile.TarInfo(path)
            info.size = len(content.encode())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content.encode()))
    return data.getvalue()


class Registry:
    """An npm-style registry for one package, on 127.0.0.1: counts tarball downloads."""

    NAME, VERSION = "agentbox-leftpad", "1.0.0"

    def __init__(self):
        self.tarball = package_tarball(self.NAME, self.VERSION)
        self.downloads = 0
        self.requests = []
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                registry.requests.append(self.path)
                path = self.path.split("?")[0]
                if "://" in path:  # through the proxy: an absolute URL
                    path = "/" + path.split("/", 3)[3]
                if path == "/" + registry.NAME:
                    body, ctype = json.dumps(registry.packument()).encode(), "application/json"
                elif path == registry.tarball_path():
                    registry.downloads += 1
                    body, ctype = registry.tarball, "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self):
        return "http://127.0.0.1:%d/" % self.port

    def tarball_path(self):
        return "/%s/-/%s-%s.tgz" % (self.NAME, self.NAME, self.VERSION)

    def integrity(self):
        return "sha512-" + base64.b64encode(hashlib.sha512(self.tarball).digest()).decode()

    def packument(self):
        return {"name": self.NAME, "dist-tags": {"latest": self.VERSION},
                "versions": {self.VERSION: {"name": self.NAME, "version": self.VERSION, "main": "index.js",
                                            "dist": {"tarball": self.url().rstrip("/") + self.tarball_path(),
                                                     "shasum": hashlib.sha1(self.tarball).hexdigest(),
                                                     "integrity": self.integrity()}}}}

    def stop(self):
        self.server.shutdown()


def git(*args, cwd=None):
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.test", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.test")
    return subprocess.run(["git"] + list(args), cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout


def make_origin(root, registry):
    src = os.path.join(root, "src")
    os.makedirs(src)
    files = {
        ".gitignore": "node_modules/\n",
        ".npmrc": "registry=%s\n" % registry.url(),
        "package.json": json.dumps({"name": "app", "version": "1.0.0", "private": True,
                                    "scripts": {"test": "node test.js"},
                                    "dependencies": {registry.NAME: registry.VERSION}}, indent=2) + "\n",
        "package-lock.json": json.dumps({
            "name": "app", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
            "packages": {"": {"name": "app", "version": "1.0.0", "dependencies": {registry.NAME: registry.VERSION}},
                         "node_modules/" + registry.NAME: {
                             "version": registry.VERSION,
                             "resolved": registry.url().rstrip("/") + registry.tarball_path(),
                             "integrity": registry.integrity()}}}, indent=2) + "\n",
        "greeting.js": "module.exports = () => 'Hello';\n",
        "server.js": ("const http = require('http');\nconst pad = require('%s');\nconst greeting = require('./greeting');\n"
                      "http.createServer((req, res) => res.end(pad(greeting(), 8, '*') + '\\n'))"
                      ".listen(8080, '127.0.0.1', () => console.log('listening on 8080'));\n") % registry.NAME,
        "test.js": ("const assert = require('assert');\nassert.strictEqual(require('./greeting')(), 'Howdy');\n"
                    "console.log('tests passed');\n"),
    }
    for name, content in files.items():
        with open(os.path.join(src, name), "w") as f:
            f.write(content)
    git("init", "-q", "-b", "main", cwd=src)
    git("add", "-A", cwd=src)
    git("commit", "-q", "-m", "app", cwd=src)
    origin = os.path.join(root, "origin.git")
    git("clone", "-q", "--bare", src, origin)
    return origin


def policy(registry):
    return ("version: 1\n"
            "network:\n  allow: [\"127.0.0.1:%d\"]\n"
            "filesystem:\n  caches: { npm: ~/.npm }\n"
            "resources: { wall_clock_min: 20 }\n") % registry.port


# The registry is on the host's loopback; inside, 127.0.0.0/8 is the
# sandbox's own (NO_PROXY names it), so npm is sent through the egress proxy,
# which reaches the host's address the policy allows.
NPM_CI = (
    "env -u NO_PROXY -u no_proxy npm ci --no-audit --no-fund --proxy \"$HTTP_PROXY\" 2>&1; echo npm-exit=$?")


def bash(api, sid, command, timeout="300s"):
    status, r = api.call("POST", "/v1/sessions/%s/execute" % sid,
                         {"name": "bash", "input": {"command": command, "timeout": timeout}})
    if status != 200:
        return {"output": "HTTP %d: %s" % (status, r), "exit_code": -1}
    return r


def main():
    if shutil.which("npm") is None or shutil.which("node") is None or shutil.which("git") is None:
        print("not applicable here: npm, node and git are needed on this host")
        return 77
    root = tempfile.mkdtemp(prefix="agentbox-harness-")
    registry = Registry()
    daemon = None
    try:
        origin = make_origin(root, registry)
        state = os.path.join(root, "state")
        sock = os.path.join(state, "agentbox.sock")
        log = open(os.path.join(root, "daemon.log"), "w")
        daemon = subprocess.Popen([AGENTBOX, "serve", "--state-dir", state], stdout=log, stderr=log,
                                  start_new_session=True)
        api = Api(sock)
        for _ in range(200):
            try:
                if api.call("GET", "/v1/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        check(api.call("GET", "/v1/health")[0] == 200, "the daemon answers")

        # 1. The workspace: a clone of the repository.
        ws = os.path.join(root, "ws")
        git("clone", "-q", origin, ws)
        status, created = api.call("POST", "/v1/sessions", {"workspace": ws, "policy": policy(registry)})
        if not check(status == 201, "session created", created):
            return 1
        sid = created["id"]

        # 2. Dependencies through the cache.
        r = bash(api, sid, NPM_CI)
        check("npm-exit=0" in r.get("output", ""), "npm ci installs from the loopback registry", r.get("output"))
        check(registry.downloads == 1, "the tarball was downloaded once", registry.requests)

        # 3. The dev server as a service, its port exposed on the host.
        status, svc = api.call("POST", "/v1/sessions/%s/services" % sid, {"name": "dev", "command": "node server.js"})
        check(status in (200, 201), "service started", svc)
        status, port = api.call("POST", "/v1/sessions/%s/ports" % sid, {"port": 8080})
        check(status in (200, 201) and port.get("host") == "127.0.0.1", "port 8080 exposed on the host's loopback", port)
        body = ""
        for _ in range(100):
            try:
                body = urllib.request.urlopen("http://%s:%d/" % (port["host"], port["port"]), timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        check(body == "***Hello\n", "the dev server answers through the exposed port", repr(body))

        # 4. Edit and test through a terminal.
        status, pty = api.call("POST", "/v1/sessions/%s/ptys" % sid, {"cols": 120, "rows": 40})
        check(status == 201, "terminal opened", pty)
        term = WebSocket(sock, "/v1/sessions/%s/ptys/%s" % (sid, pty["id"]))
        term.send("sed -i s/Hello/Howdy/ greeting.js && npm test; echo test-exit=$((40+$?))\r")
        check(term.read_until("test-exit=40"), "the tests pass in the terminal after the edit",
              term.output.decode(errors="replace"))
        check(b"tests passed" in term.output, "npm test ran in the terminal")
        term.close()

        status, _ = api.call("POST", "/v1/sessions/%s/services/dev/restart" % sid, {})
        check(status in (200, 201, 202, 204), "service restarted", status)
        body = ""
        for _ in range(100):
            try:
                body = urllib.request.urlopen("http://%s:%d/" % (port["host"], port["port"]), timeout=5).read().decode()
                if body == "***Howdy\n":
                    break
            except OSError:
                pass
            time.sleep(0.1)
        check(body == "***Howdy\n", "the restarted server serves the edit on the same port", repr(body))
        status, logs = api.call("GET", "/v1/sessions/%s/services/dev/logs" % sid, raw=True)
        check(status == 200 and b"listening on 8080" in logs, "the service's logs hold its output", logs[:500])

        # A binary file among the changes.
        r = bash(api, sid, "printf '\\x89PNG\\r\\n\\x1a\\n\\x00\\x01\\x02\\xff' > logo.png; echo done")
        check(r.get("output", "").strip() == "done", "binary file written")

        # 5. The diff applies in a fresh clone.
        status, patch = api.call("GET", "/v1/sessions/%s/diff?format=patch" % sid, raw=True)
        check(status == 200, "diff taken", patch[:300])
        check(b"node_modules" not in patch, "the diff leaves out what .gitignore ignores")
        fresh = os.path.join(root, "fresh")
        git("clone", "-q", origin, fresh)
        applied = subprocess.run(["git", "apply", "-"], cwd=fresh, input=patch, capture_output=True)
        check(applied.returncode == 0, "git apply takes the patch", applied.stderr.decode(errors="replace"))
        for name in ("greeting.js", "logo.png"):
            status, got = api.call("POST", "/v1/sessions/%s/execute" % sid,
                                   {"name": "bash", "input": {"command": "base64 -w0 " + name}})
            inside = base64.b64decode(got.get("output", "")) if status == 200 else b"?"
            with open(os.path.join(fresh, name), "rb") as f:
                check(f.read() == inside, "the fresh clone's %s matches the session's" % name)

        # A second session of the same project: npm ci from the cache.
        ws2 = os.path.join(root, "ws2")
        git("clone", "-q", origin, ws2)
        status, created2 = api.call("POST", "/v1/sessions", {"workspace": ws2, "policy": policy(registry)})
        r = bash(api, created2["id"], NPM_CI)
        check("npm-exit=0" in r.get("output", ""), "the second npm ci succeeds", r.get("output"))
        check(registry.downloads == 1, "the second npm ci downloaded nothing again", registry.requests)
        api.call("DELETE", "/v1/sessions/" + created2["id"])
        api.call("DELETE", "/v1/sessions/" + sid)
    finally:
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        registry.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("%d step(s) failed" % len(FAILURES) if FAILURES else "every step held")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
