"""Fault injection against `mlaserve serve --tp 2` on the tiny fixture (CPU workers):
  death    SIGKILL a worker mid-generation: the request fails with a message naming the worker,
           /health 503 with the reason, new generations 503, /metrics still answers, a request
           waiting in the queue then fails with 503 worker_down (retryable); then
           --on-worker-failure restart brings the group back (the queued request waits for it and
           is served, a new completion succeeds, and a prompt cached before the restart gets the
           same answer after it); --on-worker-failure exit ends the server with status 1, its last
           line naming the worker; with its restarts used up (--max-restarts), the next failure
           gives up at once (/health never says restarting) and the server exits 1; a restart
           whose workers cannot read the model gives their reason, not only their exit status
  hang     SIGSTOP a worker: the heartbeat timeout fails the group; a slow step (no SIGSTOP)
           is caught by --step-timeout-ms
  coord    SIGKILL the coordinator: its workers exit by themselves
  drain    SIGTERM: new requests 503, the in-flight one completes, exit 0; with a short
           --drain-timeout the in-flight one fails with the drain message (503 shutting_down), exit 0, also when
           its step hangs (given up at the drain timeout, not the step timeout); a SIGTERM while
           the shutdown waits for a stopped worker does not cut it short (exit 0, nothing left); a
           second signal during the drain fails the request in flight naming it
  bounds   --max-body, prompt length, max_tokens, --max-conns, --max-queue
Usage: test_faults.py MLASERVE WORKER FIXTURES CASE"""
import json
import os
import signal
import socket
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from dlib import (Server, alive, check, children_of, finish, model_path, read_rest, read_sse_events,  # noqa: E402
                  wait_for, worker_pids)
from mlatest import http_status_line  # noqa: E402

exe, worker, fixtures, case = sys.argv[1:5]
model = model_path(fixtures)
SLOW = {"MLA_WORKER_STEP_DELAY_MS": "60"}
LONG = {"prompt": "Hello", "max_tokens": 200, "ignore_eos": True}
# a count of tokens is checked: no EOS may end the sampled answer early
HI3 = {"prompt": "Hi", "max_tokens": 3, "ignore_eos": True}
CACHED = {"prompt": "count " + " ".join(str(i) for i in range(60)), "max_tokens": 8, "temperature": 0}


def health(srv):
    st, d = srv.get("/health")
    return st, d.decode(errors="replace")


def case_death():
    for policy in ("stop", "restart"):
        # one sequence at a time: a second request waits in the queue while the first streams
        srv = Server(exe, model, ["--tp", "2", "--on-worker-failure", policy, "--max-seqs", "1"], SLOW, worker)
        try:
            pids = worker_pids(srv, 2)
            if policy == "restart":  # an answer whose prompt blocks stay in the prefix cache
                st, d = srv.post("/v1/completions", CACHED)
                check(st == 200, "restart: the cached request before", d[:200])
                before = json.loads(d)["choices"][0]["text"] if st == 200 else None
            c, r = srv.stream_start(LONG)
            first = read_sse_events(r, 2, 30)
            check(r.status == 200 and len(first) == 2, "%s: streaming started" % policy)
            queued = {}
            qt = threading.Thread(target=lambda: queued.update(
                zip(("st", "body"), srv.post("/v1/completions", HI3, timeout=60))))
            qt.start()
            time.sleep(0.5)  # the second request is in the queue behind the stream
            os.kill(pids[1], signal.SIGKILL)
            rest = read_rest(r, 30)
            c.close()
            qt.join(70)
            if policy == "stop":
                check(queued.get("st") == 503 and b"worker_down" in queued.get("body", b""),
                      "stop: the queued request fails with 503 worker_down", queued)
            else:
                check(queued.get("st") == 200 and json.loads(queued["body"])["usage"]["completion_tokens"] == 3,
                      "restart: the queued request waits for the new group and is served", queued)
            joined = b" ".join(rest)
            failed = b"error" in joined and b"worker 1" in joined and b"killed by signal 9" in joined
            if policy == "stop":
                check(failed, "stop: the in-flight request failed naming the worker", joined[-300:])
            else:
                # a death inside the step in flight fails that step's requests; one that falls between
                # two steps (a busy host) leaves them waiting for the new group, which goes on from
                # their tokens (sched_batch.c cache_lost): either, never an answer cut short
                done = [json.loads(x) for x in rest if x.startswith(b"{")]
                whole = bool(done) and b"error" not in joined and done[-1]["choices"][0]["finish_reason"] == "length"
                check(failed or whole, "restart: the in-flight request failed naming the worker, or went on whole "
                      "(%s)" % ("failed" if failed else "went on"), joined[-300:])
            if policy == "stop":
                st, body = health(srv)
                check(st == 503 and "worker 1" in body, "stop: /health 503 with the reason", body)
                st, d = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
                check(st == 503 and b"worker_down" in d, "stop: new generation refused with 503", d[:200])
                st, d = srv.get("/metrics")
                check(st == 200, "stop: /metrics still answers")
                time.sleep(1.0)
                st, body = health(srv)
                check(st == 503, "stop: the group stays down")
                check("worker group failed" in srv.text(), "stop: logged")
            else:
                ok = wait_for(lambda: health(srv)[0] == 200, 30, 0.2)
                check(ok, "restart: /health back to 200")
                st, d = srv.post("/v1/completions", HI3)
                check(st == 200 and json.loads(d)["usage"]["completion_tokens"] == 3,
                      "restart: a new completion succeeds", d[:200])
                check("restarting the worker group" in srv.text(), "restart: logged")
                st, m = srv.get("/metrics")
                check(st == 200 and b"\nmlaserve_worker_group_restarts_total 1\n" in m, "restart: counted in /metrics",
                      m[-400:])
                # the new workers' caches are empty: the scheduler must not reuse the old blocks
                st, d = srv.post("/v1/completions", CACHED)
                after = json.loads(d)["choices"][0]["text"] if st == 200 else None
                check(after is not None and after == before, "restart: the same answer after it (%r, %r)" % (before, after))
            rc = srv.stop()
            check(rc == 0, "%s: clean exit after SIGTERM (rc %s)" % (policy, rc))
            check(not any(alive(p) for p in pids.values()), "%s: no worker left" % policy)
        finally:
            srv.stop(signal.SIGKILL)


def case_death_exit():
    """--on-worker-failure exit: status 1, and the last line says which worker failed and why"""
    srv = Server(exe, model, ["--tp", "2", "--on-worker-failure", "exit"], dict(SLOW, MLASERVE_API_KEY="k-env-7351"),
                 worker)
    try:
        pids = worker_pids(srv, 2)
        # the API key from the environment stays with the server: the workers never need it
        envs = [open("/proc/%d/environ" % p, "rb").read() for p in (srv.proc.pid, pids[0], pids[1])]
        check(b"k-env-7351" in envs[0] and not any(b"MLASERVE_API_KEY" in e for e in envs[1:]),
              "the workers' environment holds no API key")
        os.kill(pids[1], signal.SIGKILL)
        ok = wait_for(lambda: srv.proc.poll() is not None, 30, 0.2)
        check(ok and srv.proc.returncode == 1, "exit: status 1 (%r)" % srv.proc.returncode)
        lines = [ln for ln in srv.text().splitlines() if ln.strip()]
        check(lines and "worker 1" in lines[-1] and "signal 9" in lines[-1], "exit: the last line names the worker",
              lines[-1:])
    finally:
        srv.stop(signal.SIGKILL)
    # --on-worker-failure restart with its restarts used up (--max-restarts 1): the second failure
    # gives up at once, /health never announcing a restart that will not come; exit status 1
    srv = Server(exe, model, ["--tp", "2", "--on-worker-failure", "restart", "--max-restarts", "1"], {}, worker)
    try:
        pids = worker_pids(srv, 2)
        os.kill(pids[1], signal.SIGKILL)
        check(wait_for(lambda: srv.text().count("started worker 1:") >= 2, 30, 0.1) and
              wait_for(lambda: health(srv)[0] == 200, 30, 0.1), "restarts used up: the first restart")
        new = [int(ln.rsplit("pid ", 1)[1]) for ln in srv.text().splitlines() if "started worker 1:" in ln][-1]
        os.kill(new, signal.SIGKILL)
        said = []

        def down():
            st, body = health(srv)
            if st == 503:
                said.append(body)
            return "giving up" in srv.text() or srv.proc.poll() is not None
        check(wait_for(down, 30, 0.02), "restarts used up: given up")
        check(not any("(restarting)" in b for b in said), "restarts used up: /health never says restarting", said[-2:])
        ok = wait_for(lambda: srv.proc.poll() is not None, 30, 0.2)
        check(ok and srv.proc.returncode == 1, "restarts used up: exit status 1 (%r)" % srv.proc.returncode)
    finally:
        srv.stop(signal.SIGKILL)
    # a restart whose workers cannot read the model any more (the file moved away): the reason a
    # worker gives before it registers reaches /health and the last line, not only its exit status
    tmp = tempfile.mkdtemp(prefix="mla_faults_model_")
    moved = os.path.join(tmp, "m.gguf")
    shutil.copy(model, moved)
    srv = Server(exe, moved, ["--tp", "2", "--on-worker-failure", "restart", "--max-restarts", "1"], {}, worker)
    try:
        pids = worker_pids(srv, 2)
        os.rename(moved, moved + ".away")
        os.kill(pids[1], signal.SIGKILL)
        said = []

        def why():
            try:
                st, body = health(srv)
            except OSError:  # it has exited (given up)
                return True
            if st == 503 and body and "No such file" in body:
                said.append(body)
            return said or srv.proc.poll() is not None
        check(wait_for(why, 30, 0.05) and said, "model gone: /health gives the workers' reason", srv.tail(1500))
        ok = wait_for(lambda: srv.proc.poll() is not None, 30, 0.2)
        lines = [ln for ln in srv.text().splitlines() if ln.strip()]
        check(ok and srv.proc.returncode == 1 and lines and "No such file" in lines[-1],
              "model gone: exit 1, the last line says why", lines[-1:])
    finally:
        srv.stop(signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def case_hang():
    srv = Server(exe, model, ["--tp", "2", "--heartbeat-timeout-ms", "1500"], SLOW, worker)
    try:
        pids = worker_pids(srv, 2)
        c, r = srv.stream_start(LONG)
        check(len(read_sse_events(r, 2, 30)) == 2, "hang: streaming started")
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.time()
        rest = b" ".join(read_rest(r, 30))
        c.close()
        check(b"stopped answering" in rest, "hang: heartbeat timeout fails the request", rest[-300:])
        st, body = health(srv)
        check(st == 503 and "stopped answering" in body, "hang: /health 503 with the reason", body)
        print("detected after %.1f s" % (time.time() - t0))
        os.kill(pids[1], signal.SIGCONT)
        check(srv.stop() == 0, "hang: clean exit")
        check(wait_for(lambda: not any(alive(p) for p in pids.values()), 10), "hang: no worker left")
    finally:
        srv.stop(signal.SIGKILL)
    # the step timeout: every step takes 1.5 s, the limit is 0.5 s
    srv = Server(exe, model, ["--tp", "2", "--step-timeout-ms", "500"], {"MLA_WORKER_STEP_DELAY_MS": "1500"}, worker)
    try:
        st, d = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, timeout=60)
        check(st == 503 and b"worker_down" in d and b"did not finish within 500 ms" in d,
              "step timeout: request fails (503 worker_down: the group failed)", d[:300])
        st, body = health(srv)
        check(st == 503 and "did not finish" in body, "step timeout: /health 503", body)
        check(srv.stop() == 0, "step timeout: clean exit")
    finally:
        srv.stop(signal.SIGKILL)


def case_coord():
    srv = Server(exe, model, ["--tp", "2", "--heartbeat-timeout-ms", "1000"], None, worker)
    pids = worker_pids(srv, 2)
    check(all(alive(p) for p in pids.values()), "coord: workers running")
    srv.proc.kill()
    srv.proc.wait()
    gone = wait_for(lambda: not any(alive(p) for p in pids.values()), 20, 0.1)
    check(gone, "coord: the workers exited by themselves after the coordinator died")
    for p in pids.values():  # never leave one behind
        if alive(p):
            os.kill(p, signal.SIGKILL)


def case_drain():
    srv = Server(exe, model, ["--tp", "2", "--drain-timeout", "60"], SLOW, worker)
    try:
        c, r = srv.stream_start({"prompt": "Hello", "max_tokens": 30, "ignore_eos": True})
        check(len(read_sse_events(r, 1, 30)) == 1, "drain: streaming started")
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        st, d = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check(st == 503 and b"shutting_down" in d and b"(signal 15)" in d, "drain: new request 503 naming the signal",
              d[:200])
        st, body = health(srv)
        check(st == 503 and "draining" in body and "(signal 15)" in body, "drain: /health 503 naming the signal", body)
        rest = read_rest(r, 60)
        c.close()
        chunks = [json.loads(x) for x in rest if x not in (b"[DONE]",)]
        fin = [ch["choices"][0].get("finish_reason") for ch in chunks if ch.get("choices")]
        check(rest and rest[-1] == b"[DONE]" and "length" in fin and not any("error" in ch for ch in chunks),
              "drain: the in-flight request completed", rest[-2:])
        srv.proc.wait(60)
        check(srv.proc.returncode == 0, "drain: exit 0")
    finally:
        srv.stop(signal.SIGKILL)
    # SIGTERM to the coordinator and its workers at once (a job-wide scancel, Ctrl-C to the process
    # group): the workers stay until the drain ends, so the request in flight still completes; a
    # second signal ends a worker at once
    srv = Server(exe, model, ["--tp", "2", "--drain-timeout", "60"], SLOW, worker)
    try:
        pids = worker_pids(srv, 2)
        c, r = srv.stream_start({"prompt": "Hello", "max_tokens": 30, "ignore_eos": True})
        check(len(read_sse_events(r, 1, 30)) == 1, "drain, all signalled: streaming started")
        for p in list(pids.values()) + [srv.proc.pid]:
            os.kill(p, signal.SIGTERM)
        rest = read_rest(r, 60)
        c.close()
        chunks = [json.loads(x) for x in rest if x not in (b"[DONE]",)]
        check(rest and rest[-1] == b"[DONE]" and not any("error" in ch for ch in chunks),
              "drain, all signalled: the in-flight request completed", rest[-2:])
        srv.proc.wait(60)
        check(srv.proc.returncode == 0, "drain, all signalled: exit 0")
        check(wait_for(lambda: not any(alive(p) for p in pids.values()), 20, 0.1), "drain, all signalled: workers gone")
        check("staying until the coordinator stops this worker" in srv.text(), "a worker says why it stays",
              srv.tail(1500))
    finally:
        srv.stop(signal.SIGKILL)
    srv = Server(exe, model, ["--tp", "2"], {}, worker)
    try:
        pids = worker_pids(srv, 2)
        os.kill(pids[1], signal.SIGTERM)
        time.sleep(0.3)
        check(alive(pids[1]), "one SIGTERM: the worker stays")
        os.kill(pids[1], signal.SIGTERM)
        check(wait_for(lambda: not alive(pids[1]), 10, 0.05), "a second SIGTERM ends the worker")
    finally:
        srv.stop(signal.SIGKILL)
        for p in pids.values():
            if alive(p):
                os.kill(p, signal.SIGKILL)
    # a second SIGTERM while the shutdown waits for a stopped worker (3 s, then SIGKILL): the
    # shutdown runs to its end: exit 0, the worker killed, the control socket's folder removed
    tmp = tempfile.mkdtemp(prefix="mla_faults_tmp_")
    srv = Server(exe, model, ["--tp", "2"], {"TMPDIR": tmp}, worker)
    try:
        pids = worker_pids(srv, 2)
        check(len(os.listdir(tmp)) > 0, "late signal: the control socket's folder is in TMPDIR", os.listdir(tmp))
        os.kill(pids[1], signal.SIGSTOP)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(1)
        srv.proc.send_signal(signal.SIGTERM)
        rc = srv.proc.wait(30)
        check(rc == 0, "late signal: the shutdown goes on, exit 0 (status %r)" % rc, srv.tail(1500))
        check(wait_for(lambda: not alive(pids[1]), 10, 0.05), "late signal: the stopped worker is killed")
        check(not os.listdir(tmp), "late signal: nothing left in TMPDIR", os.listdir(tmp))
        check("already shutting down" in srv.text(), "late signal: the server says it is shutting down", srv.tail(800))
    finally:
        srv.stop(signal.SIGKILL)
        for p in pids.values():
            if alive(p):
                os.kill(p, signal.SIGCONT)
                os.kill(p, signal.SIGKILL)
    # a second signal ends the drain at once: the request in flight fails naming it
    srv = Server(exe, model, ["--tp", "1", "--drain-timeout", "60"], SLOW, worker)
    try:
        c, r = srv.stream_start(LONG)
        check(len(read_sse_events(r, 1, 30)) == 1, "second signal: streaming started")
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGTERM)
        rest = b" ".join(read_rest(r, 30))
        c.close()
        check(b"(a second signal)" in rest and b"shutting_down" in rest, "second signal: the request failed naming it",
              rest[-300:])
        srv.proc.wait(30)
        check(srv.proc.returncode == 0, "second signal: exit 0")
    finally:
        srv.stop(signal.SIGKILL)
    srv = Server(exe, model, ["--tp", "1", "--drain-timeout", "1"], SLOW, worker)
    try:
        c, r = srv.stream_start(LONG)
        check(len(read_sse_events(r, 1, 30)) == 1, "drain timeout: streaming started")
        srv.proc.send_signal(signal.SIGTERM)
        rest = b" ".join(read_rest(r, 30))
        c.close()
        check(b"before the request finished (drain timeout)" in rest and b"shutting_down" in rest,
              "drain timeout: the in-flight request failed with the reason, as a shutdown (retryable), whatever "
              "step it was in", rest[-300:])
        srv.proc.wait(30)
        check(srv.proc.returncode == 0, "drain timeout: exit 0")
    finally:
        srv.stop(signal.SIGKILL)
    # a step that hangs (every step sleeps 600 s; --step-timeout-ms at its default, 600 s): the
    # drain still ends after --drain-timeout, the step given up, rather than after the step timeout
    srv = Server(exe, model, ["--tp", "1", "--drain-timeout", "1"], {"MLA_WORKER_STEP_DELAY_MS": "600000"}, worker)
    try:
        res = {}

        def call():
            try:
                res["r"] = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, timeout=90)
            except Exception as e:  # noqa: BLE001
                res["r"] = (None, repr(e).encode())
        th = threading.Thread(target=call, daemon=True)
        th.start()

        def running():
            st, d = srv.get("/metrics")
            return st == 200 and any(line.startswith(b"mlaserve_num_requests_running") and line.endswith(b" 1")
                                     for line in d.splitlines())
        check(wait_for(running, 30, 0.1), "hung step: the request is in the running batch")
        srv.proc.send_signal(signal.SIGTERM)
        try:
            rc = srv.proc.wait(60)  # the hung step alone would hold it for 600 s
        except Exception:  # noqa: BLE001
            rc = None
        check(rc == 0, "hung step: SIGTERM exits 0 after the drain timeout (exit status %r)" % rc, srv.tail(1500))
        th.join(30)
        st, body = res.get("r", (None, b""))
        check(st == 503 and b"shutting_down" in body and b"before the request finished (drain timeout)" in body,
              "hung step: the request failed naming the drain timeout", (st, body[:300]))
    finally:
        srv.stop(signal.SIGKILL)


def case_bounds():
    srv = Server(exe, model, ["--tp", "1", "--max-body", "2000", "--max-conns", "3", "--max-queue", "1",
                              "--max-seqs", "1"], {"MLA_WORKER_STEP_DELAY_MS": "30"}, worker)
    try:
        st, d = srv.post("/v1/completions", None, raw=json.dumps({"prompt": "x" * 5000, "max_tokens": 1}))
        check(st == 413, "bounds: body over --max-body -> 413", st)
        st, d = srv.post("/v1/completions", {"prompt": list(range(1, 300)), "max_tokens": 1})
        check(st == 400 and b"context" in d, "bounds: prompt longer than the context -> 400", d[:200])
        st, d = srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 100000})
        check(st == 400 and b"max_tokens" in d, "bounds: max_tokens beyond the context -> 400", d[:200])
        # --max-queue 1 with one running sequence: of 4 concurrent requests at least one is 429
        res = []

        def one():
            try:
                res.append(srv.post("/v1/completions", {"prompt": "Hi", "max_tokens": 20, "ignore_eos": True})[0])
            except Exception as e:  # noqa: BLE001
                res.append(str(e))
        ts = [threading.Thread(target=one) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        check(429 in res and 200 in res, "bounds: --max-queue -> 429 for the overflow", res)
        # --max-conns 3: with 3 connections inside a request body, a 4th one's request gets 503
        # and it is closed, but for a probe's GET of /health, which is answered (idle connections,
        # and then those still inside their request head, would be closed to make room instead)
        socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(3)]
        for s in socks:
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.3)
        line = http_status_line(srv.port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        check(b" 503 " in line, "bounds: a request over --max-conns -> 503", line)
        line = http_status_line(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        check(b" 200 " in line, "bounds: /health over --max-conns answered (a probe place)", line)
        for s in socks:
            s.close()
        check(srv.stop() == 0, "bounds: clean exit")
    finally:
        srv.stop(signal.SIGKILL)


{"death": lambda: (case_death(), case_death_exit()), "hang": case_hang, "coord": case_coord, "drain": case_drain, "bounds": case_bounds}[case]()
finish()
