"""Serving acceptance on the real model: `mlaserve serve --tp 2` on the tiny-deepseek3 fixture,
every ref.json prompt once alone (greedy, max_tokens = the reference's greedy length): the answer
must be the Hugging Face greedy continuation; then 64 concurrent streaming clients (threads, raw
HTTP + Server-Sent Events) each send one of the prompts: every answer must complete and equal
the single-request one; then /metrics must add up (requests by finish reason, prompt and
generation token sums equal what the clients sent and received).
Usage: serve_accept.py MLASERVE_EXE WORKER_EXE FIXTURES_DIR. Exit 77 when the fixture is missing."""
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pbutil as pb  # noqa: E402
from mlatest import FAILS, check, summary  # noqa: E402

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
model, ref = pb.fixture_paths(fixtures)
EOS_TEXT = "<｜end▁of▁sentence｜>"
N_CLIENTS = 64


def body_for(p):
    """The request for a ref prompt: plain prompts as text (through our tokenizer), the ones with
    special tokens written out as the reference's token ids (the text form would get a second BOS)."""
    b = {"max_tokens": len(p["greedy"]), "temperature": 0}
    b["prompt"] = p["tokens"] if "<｜" in p["text"] else p["text"]
    return b


def expected(p):
    """(text, finish_reason) the reference implies: EOS ends the text (not part of it)."""
    t = p["greedy_text"]
    if t.endswith(EOS_TEXT):
        return t[: -len(EOS_TEXT)], "stop"
    return t, "length"


def post(port, body, timeout=300):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def stream(port, body, timeout=300):
    """Streams a completion: (status, text, finish_reason, usage, saw [DONE])."""
    b = dict(body, stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(b), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        data = r.read()
        c.close()
        return r.status, data.decode(errors="replace"), None, None, False
    text, finish, usage, done = "", None, None, False
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            d = ev[6:]
            if d == b"[DONE]":
                done = True
                continue
            j = json.loads(d)
            for ch in j.get("choices", []):
                text += ch.get("text", "")
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if j.get("usage"):
                usage = j["usage"]
    c.close()
    return 200, text, finish, usage, done


prompts = ref["prompts"]
srv = pb.Server(exe, worker, model, tp=2, extra=["--max-context", "512", "--max-seqs", "64", "--max-prefill-tokens", "2048"])
sent_prompt, got_completion, n_req = 0, 0, 0
try:
    port = srv.port
    m0 = pb.metrics(port)
    t0 = time.time()
    single = []
    for p in prompts:
        st, data = post(port, body_for(p))
        check(st == 200, "single %r: %d %r" % (p["text"][:30], st, data[:200]))
        if st != 200:
            single.append(None)
            continue
        j = json.loads(data)
        ch = j["choices"][0]
        exp_text, exp_finish = expected(p)
        check(ch["text"] == exp_text and ch["finish_reason"] == exp_finish,
              "single greedy %r: %r vs %r (%s)" % (p["text"][:30], ch["text"], exp_text, ch["finish_reason"]))
        check(j["usage"]["prompt_tokens"] == len(p["tokens"]) and j["usage"]["completion_tokens"] == len(p["greedy"]),
              "single usage %r vs %d/%d" % (j["usage"], len(p["tokens"]), len(p["greedy"])))
        single.append((ch["text"], ch["finish_reason"]))
        sent_prompt += len(p["tokens"])
        got_completion += len(p["greedy"])
        n_req += 1
    # the ids themselves, through the gRPC API (the HTTP API returns text): the reference's
    # greedy ids (EOS is the stop token: reported in the usage, not streamed as a token)
    api_pb2, api_grpc, grpc = pb.stubs()
    with grpc.insecure_channel("127.0.0.1:%d" % srv.proto_port) as chan:
        stub = api_grpc.MlaServeStub(chan)
        for p in prompts[:2]:
            resp = list(stub.Generate(api_pb2.GenerateRequest(prompt_ids=p["tokens"], max_tokens=len(p["greedy"]),
                                                              temperature=0.0), timeout=120))
            ids = [r.token_id for r in resp if r.HasField("token_id")]
            check(ids == p["greedy"], "greedy ids %r vs %r" % (ids, p["greedy"]))
            sent_prompt += len(p["tokens"])
            got_completion += len(p["greedy"])
            n_req += 1

    results = [None] * N_CLIENTS

    def run(i):
        try:
            results[i] = stream(port, body_for(prompts[i % len(prompts)]))
        except Exception as e:  # noqa: BLE001 (reported as a failure below)
            results[i] = (0, repr(e), None, None, False)

    print("single requests: %.1f s" % (time.time() - t0), flush=True)
    t0 = time.time()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    n_ok = 0
    for i, res in enumerate(results):
        p = prompts[i % len(prompts)]
        if res is None:
            check(False, "client %d did not finish" % i)
            continue
        st, text, finish, usage, done = res
        ok = (st == 200 and done and single[i % len(prompts)] is not None and
              (text, finish) == single[i % len(prompts)] and usage is not None and
              usage["prompt_tokens"] == len(p["tokens"]) and usage["completion_tokens"] == len(p["greedy"]))
        check(ok, "client %d: %r" % (i, res))
        if usage:
            sent_prompt += usage["prompt_tokens"]
            got_completion += usage["completion_tokens"]
        n_req += 1
        n_ok += ok
    print("concurrent phase: %.1f s" % (time.time() - t0), flush=True)
    print("%d/%d concurrent streams complete and equal to the single-request answers" % (n_ok, N_CLIENTS))
    m1 = pb.metrics(port)

    def delta(name, **lbl):
        return pb.metric(m1, name, **lbl) - pb.metric(m0, name, **lbl)

    finished = delta("mlaserve_requests_total", finish_reason="stop") + delta("mlaserve_requests_total",
                                                                              finish_reason="length")
    check(finished == n_req, "metrics: %d finished requests vs %d sent" % (finished, n_req))
    check(delta("mlaserve_requests_total", finish_reason="error") == 0, "metrics: no errors")
    check(delta("mlaserve_requests_total", finish_reason="cancelled") == 0, "metrics: no cancellations")
    n_stop = sum(1 for i in range(N_CLIENTS) if expected(prompts[i % len(prompts)])[1] == "stop")
    n_stop += sum(1 for p in prompts if expected(p)[1] == "stop") + sum(1 for p in prompts[:2] if expected(p)[1] == "stop")
    check(delta("mlaserve_requests_total", finish_reason="stop") == n_stop, "metrics: stop count %d" % n_stop)
    check(delta("mlaserve_prompt_tokens_total") == sent_prompt,
          "metrics: prompt tokens %d vs %d sent" % (delta("mlaserve_prompt_tokens_total"), sent_prompt))
    check(delta("mlaserve_generation_tokens_total") == got_completion,
          "metrics: generation tokens %d vs %d received" % (delta("mlaserve_generation_tokens_total"), got_completion))
    check(pb.metric(m1, "mlaserve_num_requests_running") == 0 and pb.metric(m1, "mlaserve_kv_cache_blocks_used") == 0,
          "metrics: nothing left running")
    e2e = pb.metric(m1, "mlaserve_e2e_request_latency_seconds_count") - pb.metric(m0, "mlaserve_e2e_request_latency_seconds_count")
    check(e2e == n_req, "metrics: e2e latency observations %d vs %d" % (e2e, n_req))
finally:
    rc = srv.stop()
    check(rc == 0, "clean exit %r" % rc)
    if FAILS:
        print(srv.tail())
sys.exit(summary())
