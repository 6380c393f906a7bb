"""Helpers for the deployment tests (tests/deploy/*): start `mlaserve serve` on the tiny fixture,
talk HTTP to it on loopback, look at its worker processes. Every wait is bounded."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

FAILS, PASSES = [], [0]


def check(cond, what, extra=""):
    if cond:
        PASSES[0] += 1
        print("ok:", what, flush=True)
    else:
        FAILS.append(what)
        print("FAIL:", what, extra, flush=True)
    return cond


def finish():
    print("%d passed, %d failed" % (PASSES[0], len(FAILS)))
    sys.exit(1 if FAILS else 0)


def model_path(fixtures):
    m = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
    if not os.path.exists(m):
        print("fixture missing: skipped")
        sys.exit(77)
    return m


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_for(cond, timeout, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    return cond()


class Server:
    """`mlaserve serve` with its log in a temp folder; stop() never leaves it running."""

    def __init__(self, exe, model, args, env_extra=None, worker=None, host="127.0.0.1", timeout=90, wait=True):
        self.dir = tempfile.mkdtemp(prefix="mla_deploy_")
        self.pf = os.path.join(self.dir, "port")
        self.logpath = os.path.join(self.dir, "log")
        self.log = open(self.logpath, "w+")
        self.host = host
        env = dict(os.environ)
        env.pop("MLASERVE_API_KEY", None)
        env.update(env_extra or {})
        cmd = [exe, "serve", "-m", model, "--port", "0", "--port-file", self.pf, "--max-context", "256",
               "--max-seqs", "4", "--kv-blocks", "128"]
        if worker:
            cmd += ["--worker-exe", worker]
        self.proc = subprocess.Popen(cmd + args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.port = None
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout=90):
        ok = wait_for(lambda: os.path.exists(self.pf) or self.proc.poll() is not None, timeout)
        if not ok or not os.path.exists(self.pf):
            print(self.text())
            self.stop()
            raise SystemExit("the server did not start")
        self.port = int(open(self.pf).read())

    def text(self):
        self.log.flush()
        return open(self.logpath, errors="replace").read()

    def conn(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path, timeout=30):
        c = self.conn(timeout)
        c.request("GET", path)
        r = c.getresponse()
        d = r.read()
        c.close()
        return r.status, d

    def post(self, path, body, timeout=120, raw=None):
        c = self.conn(timeout)
        c.request("POST", path, body=raw if raw is not None else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        d = r.read()
        c.close()
        return r.status, d

    def stream_start(self, body, timeout=120):
        """POST a streaming completion; returns (conn, response) after the headers."""
        c = self.conn(timeout)
        b = dict(body)
        b["stream"] = True
        c.request("POST", "/v1/completions", body=json.dumps(b), headers={"Content-Type": "application/json"})
        return c, c.getresponse()

    def children(self):
        return children_of(self.proc.pid)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def read_sse_events(resp, n_events, timeout):
    """Reads up to n_events 'data:' lines (or until the stream ends); returns them."""
    out = []
    end = time.time() + timeout
    while len(out) < n_events and time.time() < end:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if line.startswith(b"data:"):
            out.append(line[5:].strip())
            if out[-1] == b"[DONE]":
                break
    return out


def read_rest(resp, timeout=60):
    """Reads the stream to its end; returns the list of data payloads."""
    return read_sse_events(resp, 10**9, timeout)


def children_of(pid):
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            st = open("/proc/%s/stat" % d).read()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        if ppid == pid:
            kids.append(int(d))
    return sorted(kids)


def alive(pid):
    try:
        st = open("/proc/%d/stat" % pid).read()
    except OSError:
        return False
    return st[st.rindex(")") + 2] != "Z"


def worker_pids(srv, n):
    """The server's local worker pids by rank (from its log: 'started worker R: pid P')."""
    def find():
        pids = {}
        for line in srv.text().splitlines():
            if "started worker" in line and ": pid " in line:
                r = int(line.split("started worker ")[1].split(":")[0])
                pids[r] = int(line.rsplit("pid ", 1)[1])
        return pids if len(pids) >= n else None
    return wait_for(find, 10)
