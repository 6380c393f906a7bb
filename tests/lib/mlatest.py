"""Shared helpers of the Python test scripts: a pass/fail counter (check, summary, finish) and
ServeProcess, a server process (`mlaserve serve`, or the fake server) started on a free port that
it writes to a port file, with its log captured in a temp folder and a bounded stop.
Import it with sys.path.insert(0, <tests>/lib). Every wait is bounded."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

# The lists are never rebound: `from mlatest import FAILS` sees every failure.
FAILS, PASSES = [], [0]
_VERBOSE = [False]


def set_verbose(on):
    """Also print "ok: <what>" for every passed check."""
    _VERBOSE[0] = bool(on)


def check(cond, what, extra=None):
    """Counts one check; prints "FAIL: what [extra]" when cond is false. Returns cond."""
    if cond:
        PASSES[0] += 1
        if _VERBOSE[0]:
            print("ok:", what, flush=True)
    elif extra is None:
        FAILS.append(what)
        print("FAIL:", what, flush=True)
    else:
        FAILS.append(what)
        print("FAIL:", what, extra, flush=True)
    return cond


def summary(prefix=""):
    """Prints "<prefix>N passed, N failed"; returns the exit status (1 when a check failed)."""
    print("%s%d passed, %d failed" % (prefix, PASSES[0], len(FAILS)), flush=True)
    return 1 if FAILS else 0


def finish(prefix=""):
    sys.exit(summary(prefix))


def wait_for(cond, timeout, step=0.05):
    """cond()'s first true value within timeout seconds, else its value at the end."""
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return cond()


def http_request(port, method, path, body=None, headers=None, timeout=30, host="127.0.0.1", json_type=True):
    """(status, headers dict, body bytes). body: bytes/str as is, anything else as JSON.
    json_type: send "Content-Type: application/json" (before headers)."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    h = {"Content-Type": "application/json"} if json_type else {}
    if headers:
        h.update(headers)
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, dict(r.getheaders()), data
    finally:
        c.close()


def http_get(port, path, timeout=30, host="127.0.0.1"):
    """(status, body bytes) of a plain GET path."""
    st, _, data = http_request(port, "GET", path, timeout=timeout, host=host, json_type=False)
    return st, data


def http_metric(port, name, host="127.0.0.1"):
    """The value of the /metrics line whose name (labels included, or followed by them) is name;
    None when there is none."""
    st, _, data = http_request(port, "GET", "/metrics", host=host, json_type=False)
    for line in data.decode().splitlines() if st == 200 else []:
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def http_post(port, path, body, timeout=120, host="127.0.0.1"):
    """(status, body bytes) of POST path with a JSON body (bytes/str sent as is)."""
    st, _, data = http_request(port, "POST", path, body, timeout=timeout, host=host)
    return st, data


def http_status_line(port, payload, timeout=10, host="127.0.0.1"):
    """The status line (bytes, b"" when none came) of the answer to the raw request bytes payload,
    read until the server closes the connection (the request should say Connection: close)."""
    s = socket.create_connection((host, port), timeout=timeout)
    out = b""
    try:
        s.sendall(payload)
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    finally:
        s.close()
    return out.split(b"\r\n", 1)[0]


class ServeStartError(RuntimeError):
    pass


class ServeProcess:
    """Runs cmd (e.g. [mlaserve, "serve", "-m", model, "--port", "0"]) with "--port-file F"
    (and "--proto-port-file G" when proto), "--worker-exe W" when worker is given, then args.
    env: variables set on top of os.environ less MLASERVE_API_KEY; env_default: set only where
    unset. The log (stdout+stderr) goes to <dir>/log. start() waits for the port file(s) at most
    timeout seconds; on failure it stops the process and raises ServeStartError (its message
    ends with the log's last fail_tail characters, all of it when fail_tail is None)."""

    def __init__(self, cmd, args=(), worker=None, env=None, env_default=None, proto=False, timeout=120,
                 poll=0.05, prefix="mla_serve_", host="127.0.0.1", start=True, fail_tail=4000):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.pf = os.path.join(self.dir, "port")
        self.ppf = os.path.join(self.dir, "pport") if proto else None
        self.logpath = os.path.join(self.dir, "log")
        self.log = open(self.logpath, "w+")
        self.host, self.timeout, self.poll, self.fail_tail = host, timeout, poll, fail_tail
        self.port = self.proto_port = None
        e = dict(os.environ)
        e.pop("MLASERVE_API_KEY", None)
        for k, v in (env_default or {}).items():
            e.setdefault(k, v)
        e.update(env or {})
        full = list(cmd) + ["--port-file", self.pf]
        if proto:
            full += ["--proto-port-file", self.ppf]
        if worker:
            full += ["--worker-exe", worker]
        self.proc = subprocess.Popen(full + [str(a) for a in args], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=e)
        if start:
            self.wait_ready()

    def _ready(self):
        return all(f is None or (os.path.exists(f) and open(f).read().strip()) for f in (self.pf, self.ppf))

    def wait_ready(self, timeout=None):
        end = time.time() + (self.timeout if timeout is None else timeout)
        while not self._ready():
            if self.proc.poll() is not None or time.time() > end:
                text = self.text()
                self.stop(timeout=10)
                raise ServeStartError("the server did not start (exit status %r):\n%s" %
                                      (self.proc.returncode, text if self.fail_tail is None else text[-self.fail_tail:]))
            time.sleep(self.poll)
        self.port = int(open(self.pf).read())
        if self.ppf:
            self.proto_port = int(open(self.ppf).read())

    def text(self):
        """The whole log so far."""
        self.log.flush()
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def tail(self, n=4000):
        return self.text()[-n:]

    def get(self, path, timeout=30):
        return http_get(self.port, path, timeout=timeout, host=self.host)

    def post(self, path, body, timeout=120):
        return http_post(self.port, path, body, timeout=timeout, host=self.host)

    def stop(self, sig=signal.SIGTERM, timeout=60, killed_rc=None):
        """Sends sig (SIGTERM: a clean shutdown is expected), waits at most timeout seconds, then
        SIGKILL. Returns the exit status; killed_rc instead when it had to be killed (if given)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                if killed_rc is not None:
                    return killed_rc
        return self.proc.returncode
