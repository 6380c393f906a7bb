"""Control-plane security (CURVE): `mlaserve keygen`, a coordinator with --curve-dir on loopback
tcp:// and external workers: a worker with a key not in authorized_keys is refused (exit 3, the
reason on both sides), a worker without CURVE is refused, the right keys work (one worker with the
shared client key, one with a key added by `keygen --client`); a non-loopback bind without keys
is refused with the reason. Usage: test_keys.py MLASERVE WORKER FIXTURES"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Server, check, finish, free_port, model_path, wait_for  # noqa: E402

exe, worker, fixtures = sys.argv[1:4]
model = model_path(fixtures)
d = tempfile.mkdtemp(prefix="mla_keys_")
A, B = os.path.join(d, "a"), os.path.join(d, "b")
for k in (A, B):
    r = subprocess.run([exe, "keygen", k], capture_output=True, text=True, timeout=30)
    check(r.returncode == 0, "keygen %s" % os.path.basename(k), r.stderr)
check(oct(os.stat(os.path.join(A, "server.key")).st_mode & 0o777) == "0o600", "server.key is 0600")
check(len(open(os.path.join(A, "server.pub")).read().strip()) == 40, "server.pub is a Z85 key")
r = subprocess.run([exe, "keygen", A], capture_output=True, text=True, timeout=30)
check(r.returncode != 0 and "exists" in r.stderr, "keygen refuses to overwrite", r.stderr)
r = subprocess.run([exe, "keygen", A, "--client", "node2"], capture_output=True, text=True, timeout=30)
check(r.returncode == 0 and open(os.path.join(A, "node2.pub")).read().strip() in open(os.path.join(A, "authorized_keys")).read(),
      "keygen --client adds an authorized key", r.stderr)
# --force replaces a client's key: the old one is no longer admitted, the other lines stay
auth = lambda: open(os.path.join(A, "authorized_keys")).read()  # noqa: E731
first, before = open(os.path.join(A, "node2.pub")).read().strip(), auth()
r = subprocess.run([exe, "keygen", A, "--client", "node2", "--force"], capture_output=True, text=True, timeout=30)
second = open(os.path.join(A, "node2.pub")).read().strip()
check(r.returncode == 0 and second != first and first not in auth() and second + " node2" in auth() and
      auth().count(" node2\n") == 1 and auth().replace(second, first) == before,
      "keygen --client --force replaces the client's key in authorized_keys", (r.stderr, auth()))
# a hand-edited file (a tab, blanks ahead, no newline at its end) is read as the coordinator reads it
edited = auth().replace(second + " node2\n", "  " + second + "\tnode2")
with open(os.path.join(A, "authorized_keys"), "w") as f:
    f.write(edited)
r = subprocess.run([exe, "keygen", A, "--client", "node2", "--force"], capture_output=True, text=True, timeout=30)
third = open(os.path.join(A, "node2.pub")).read().strip()
check(r.returncode == 0 and second not in auth() and auth().endswith(third + " node2\n") and
      auth().count("node2") == 1 and " client\n" in auth() and
      all(len(l.split()) == 2 for l in auth().splitlines() if not l.startswith("#")),
      "keygen --client --force: a tabbed last line without its newline replaced", auth())

# keys others could read or change are refused, as ssh does (and keygen makes its folder private)
for f, mode, why in (("server.key", 0o644, "server.key is readable by others"),
                     ("authorized_keys", 0o666, "authorized_keys is writable by others"), ("", 0o777, "writable")):
    p = os.path.join(A, f) if f else A
    old = os.stat(p).st_mode & 0o777
    os.chmod(p, mode)
    try:
        r = subprocess.run([exe, "generate", "-m", model, "-p", "Hi", "-n", "1", "--curve-dir", A], capture_output=True,
                           text=True, timeout=60)
        check(r.returncode != 0 and why in r.stderr and "chmod" in r.stderr, "--curve-dir: %s %o refused" % (f or "the folder", mode),
              r.stderr[-300:])
    finally:
        os.chmod(p, old)
for args, why in ((["keygen", A, "--client", "bad/name"], "--client 'bad/name'"), (["keygen"], "DIR) is missing")):
    r = subprocess.run([exe] + args, capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and why in r.stderr, "%s refused naming why" % " ".join(args[:1] + args[2:]), r.stderr)
C = os.path.join(d, "c")
os.mkdir(C)
os.chmod(C, 0o777)
r = subprocess.run([exe, "keygen", C], capture_output=True, text=True, timeout=30)
check(r.returncode == 0 and oct(os.stat(C).st_mode & 0o777) == "0o700" and "now 0700" in r.stderr,
      "keygen makes an existing open folder 0700", r.stderr)

# non-loopback bind without keys: refused before anything starts
for cmd in ([exe, "serve", "-m", model, "--coord", "tcp://0.0.0.0:%d" % free_port(), "--port", "0"],
            [exe, "generate", "-m", model, "-p", "Hi", "-n", "1", "--coord", "tcp://0.0.0.0:%d" % free_port()]):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "refusing to bind the control plane" in r.stderr and "--insecure-control-plane" in r.stderr,
          "%s: non-loopback bind without keys refused with the reason" % cmd[1], r.stderr[-300:])

# control endpoints ZeroMQ could not bind as written, or would bind elsewhere: refused naming them
for bad, why in (("tcp://127.0.0.1:99999", "port '99999'"), ("tcp://127.0.0.1:123x", "port '123x'"),
                 ("bogus://x", "not tcp://HOST:PORT")):
    r = subprocess.run([exe, "generate", "-m", model, "-p", "Hi", "-n", "1", "--coord", bad], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode != 0 and why in r.stderr, "--coord %s refused naming %s" % (bad, why), r.stderr[-300:])
# the loopback names the docs allow: localhost binds 127.0.0.1, [::1] binds IPv6 (where the host has it)
for ep_ok in ("tcp://localhost:%d" % free_port(), "tcp://[::1]:%d" % free_port()):
    r = subprocess.run([exe, "generate", "-m", model, "-p", "Hi", "-n", "1", "--coord", ep_ok], capture_output=True,
                       text=True, timeout=120)
    no_v6 = "[::1]" in ep_ok and "Address not available" in r.stderr
    check(r.returncode == 0 or no_v6, "--coord %s binds and serves" % ep_ok, r.stderr[-300:])

port = free_port()
ep = "tcp://127.0.0.1:%d" % port
srv = Server(exe, model, ["--tp", "2", "--workers-external", "--coord", ep, "--curve-dir", A], wait=False)
procs = []
try:
    def wk(rank, *extra):
        return subprocess.Popen([worker, "--coord", ep, "--rank", str(rank), "--world", "2", "-m", model] + list(extra),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bad = wk(0, "--curve-dir", A, "--curve-client-key", os.path.join(B, "client.key"))
    # 90 s, as below: > the worker's 60 s registration timeout, so that a server slow to start on
    # a loaded machine (the ASan build, tests in parallel) fails a check with the worker's own
    # words rather than this wait (a CI run timed out here at 30 s)
    out = bad.communicate(timeout=90)[0]
    check(bad.returncode == 3 and "refused this worker's CURVE key" in out, "wrong client key refused (exit 3)", out[-300:])
    check(wait_for(lambda: "refusing a control-plane connection" in srv.text(), 10), "coordinator logged the refusal")
    plain = wk(0)
    out = plain.communicate(timeout=90)[0]  # > the worker's 60 s registration timeout
    check(plain.returncode == 3 and "handshake" in out, "worker without CURVE refused (exit 3)", out[-300:])
    wrong_server = wk(0, "--curve-dir", B)  # B's server.pub: the handshake cannot succeed
    out = wrong_server.communicate(timeout=90)[0]
    check(wrong_server.returncode in (1, 3), "worker with the wrong server key does not join", out[-300:])
    procs = [wk(0, "--curve-dir", A), wk(1, "--curve-dir", A, "--curve-client-key", os.path.join(A, "node2.key"))]
    srv.wait_ready(60)
    st, body = srv.get("/health")
    check(st == 200, "group ready with the right keys")
    st, body = srv.post("/v1/completions", {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
    check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, "generation over CURVE", body[:200])
    check("CURVE on" in srv.text(), "coordinator logged CURVE on")
    check(srv.stop() == 0, "clean exit")
    for p in procs:
        p.communicate(timeout=20)
    check(all(p.returncode == 0 for p in procs), "workers exited cleanly", [p.returncode for p in procs])
finally:
    srv.stop(9)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
finish()
