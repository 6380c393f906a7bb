"""Multi-host control plane on one machine: the coordinator in one network namespace, two CPU
workers in another, joined by a veth pair with addresses in a private test range that exist on
those veths only; CURVE on. A generation works; then the veth is cut (ip link set down) in the
middle of a generation: the coordinator detects it (heartbeat timeout), /health answers 503 with
the reason, the log says so, the in-flight request fails with a clear error, the group is
stopped (--on-worker-failure stop) and the cut-off workers exit by themselves.
Needs root and `ip netns` (exit 77 otherwise). Usage: test_netns.py MLASERVE WORKER FIXTURES"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from dlib import Server, alive, check, finish, model_path, read_rest, read_sse_events, wait_for  # noqa: E402

exe, worker, fixtures = sys.argv[1:4]
inner = len(sys.argv) > 4 and sys.argv[4] == "--inner"
model = model_path(fixtures)
tag = os.environ.get("MLASERVE_NETNS_TAG") or "%d" % (os.getpid() % 100000)
os.environ["MLASERVE_NETNS_TAG"] = tag  # the inner run (another pid) uses the same names
NSC, NSW = "mlac" + tag, "mlaw" + tag
VC, VW = "mvc" + tag, "mvw" + tag
ADDR_C, ADDR_W = "10.251.7.1", "10.251.7.2"  # on the two veths only, inside our namespaces
PORT = 29555


def sh(*cmd, ok=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if ok and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


def outer():
    if os.geteuid() != 0:
        print("not root: skipped")
        sys.exit(77)
    import shutil
    if not shutil.which("ip") or subprocess.run(["ip", "netns", "add", NSC], capture_output=True,
                                                timeout=30).returncode != 0:
        print("ip netns not permitted: skipped")
        sys.exit(77)
    try:
        sh("ip", "netns", "add", NSW)
        sh("ip", "link", "add", VC, "type", "veth", "peer", "name", VW)
        sh("ip", "link", "set", VC, "netns", NSC)
        sh("ip", "link", "set", VW, "netns", NSW)
        for ns, dev, addr in ((NSC, VC, ADDR_C), (NSW, VW, ADDR_W)):
            sh("ip", "-n", ns, "addr", "add", addr + "/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        r = subprocess.run(["ip", "netns", "exec", NSC, sys.executable, __file__, exe, worker, fixtures, "--inner",
                            NSW], timeout=240)
        sys.exit(r.returncode)
    finally:
        for ns in (NSC, NSW):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except OSError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_inner():
    import tempfile
    keys = os.path.join(tempfile.mkdtemp(prefix="mla_netns_"), "keys")
    check(subprocess.run([exe, "keygen", keys], capture_output=True, timeout=30).returncode == 0, "keygen")
    ep = "tcp://%s:%d" % (ADDR_C, PORT)
    env = {"MLA_WORKER_STEP_DELAY_MS": "60"}
    # the bind on the veth address is non-loopback: without keys it must be refused
    r = subprocess.run([exe, "serve", "-m", model, "--coord", "tcp://%s:%d" % (ADDR_C, PORT + 1), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "refusing to bind" in r.stderr, "veth bind without keys refused", r.stderr[-200:])
    srv = Server(exe, model, ["--tp", "2", "--workers-external", "--coord", "tcp://%s:%d" % (ADDR_C, PORT),
                              "--curve-dir", keys, "--heartbeat-timeout-ms", "1500", "--on-worker-failure", "stop"],
                 env, wait=False)
    wenv = dict(os.environ)
    wenv.update(env)
    workers = [subprocess.Popen(["ip", "netns", "exec", sys.argv[5], worker, "--coord", ep, "--rank", str(r),
                                 "--world", "2", "-m", model, "--curve-dir", keys],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=wenv)
               for r in range(2)]
    try:
        srv.wait_ready(90)
        st, body = srv.post("/v1/completions", {"prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 4,
              "generation with workers in another namespace over CURVE", body[:200])
        check("host" in srv.text() and "registered" in srv.text(), "workers registered over the veth")
        c, r = srv.stream_start({"prompt": "Hello", "max_tokens": 200, "ignore_eos": True})
        check(len(read_sse_events(r, 2, 30)) == 2, "partition: streaming started")
        sh("ip", "link", "set", VC, "down")
        t0 = time.time()
        rest = b" ".join(read_rest(r, 30))
        c.close()
        check(b"error" in rest and b"stopped answering" in rest, "partition: in-flight request failed clearly",
              rest[-300:])
        print("partition detected after %.1f s" % (time.time() - t0))
        st, body = srv.get("/health")
        check(st == 503 and b"stopped answering" in body, "partition: /health 503 with the reason", body)
        check("worker group failed" in srv.text(), "partition: logged")
        st, body = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check(st == 503, "partition: new generation refused (group stopped)")
        gone = wait_for(lambda: all(w.poll() is not None for w in workers), 20, 0.1)
        check(gone, "partition: the cut-off workers exited by themselves")
        outs = [w.communicate(timeout=5)[0] if w.poll() is not None else "" for w in workers]
        check(any("stopped answering" in o for o in outs), "partition: a worker said why", outs[0][-200:])
        check(srv.stop() == 0, "coordinator: clean exit")
    finally:
        srv.stop(signal.SIGKILL)
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    finish()


if inner:
    run_inner()
else:
    outer()
