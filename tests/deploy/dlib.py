"""Helpers for the deployment tests (tests/deploy/*): start `mlaserve serve` on the tiny fixture,
talk HTTP to it on loopback, look at its worker processes. Every wait is bounded."""
import http.client
import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mlatest  # noqa: E402
from mlatest import FAILS, check, finish, wait_for  # noqa: E402,F401

mlatest.set_verbose(True)  # "ok: <what>" for every passed check


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


class Server(mlatest.ServeProcess):
    """`mlaserve serve` with its log in a temp folder; stop() never leaves it running."""

    def __init__(self, exe, model, args, env_extra=None, worker=None, host="127.0.0.1", timeout=90, wait=True):
        super().__init__([exe, "serve", "-m", model, "--port", "0"],
                         ["--max-context", "256", "--max-seqs", "4", "--kv-memory", "8M"] + list(args),
                         worker=worker, env=env_extra, host=host, timeout=timeout, start=wait,
                         prefix="mla_deploy_", fail_tail=None)

    def conn(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def post(self, path, body, timeout=120, raw=None):
        return super().post(path, raw if raw is not None else body, timeout=timeout)

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
        return super().stop(sig, timeout=timeout)


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
