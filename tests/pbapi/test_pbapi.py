"""The protobuf API (proto/api.proto, coordinator/pbapi_*, common/apiclient.*, `mlaserve client`)
against a real `mlaserve serve --tp 2` on the tiny-deepseek3 fixture. Known answers come from
the fixture's Hugging Face reference (ref.json). Malformed frames are built by hand with an
independent protobuf encoder (pbutil.py).
Usage: test_pbapi.py MLASERVE_EXE WORKER_EXE FIXTURES_DIR. Exit 77 when the fixture is missing."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pbutil as pb  # noqa: E402
from mlatest import FAILS, check, summary  # noqa: E402

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
model, ref = pb.fixture_paths(fixtures)


def client(port, *args, key=None, timeout=120):
    cmd = [exe, "client", "--port", str(port), "--timeout", "60"]
    if key:
        cmd += ["--api-key", key]
    r = subprocess.run(cmd + list(args), capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def read_until_final(conn, rid, limit=2000):
    """Frames of request rid until its final response or error: (token ids, text, final fields, error fields)."""
    ids, text = [], ""
    for _ in range(limit):
        k, f = conn.read_frame()
        if f.get(1, [0])[0] != rid:
            continue
        if k == pb.K_ERROR:
            return ids, text, None, f
        assert k == pb.K_GEN_RESP, k
        text += f.get(3, [b""])[0].decode()
        if 2 in f:
            ids.append(f[2][0])
        if 7 in f:
            return ids, text, f, None
    raise AssertionError("no final frame")


def expect_fatal(port, data, code, what, param=None):
    c = pb.Conn(port, timeout=30)
    try:
        c.send(data)
        k, f = c.read_frame()
        while k == pb.K_HELLO_REPLY:
            k, f = c.read_frame()
        ok = k == pb.K_ERROR and f.get(1, [0])[0] == 0 and f.get(2, [0])[0] == code
        if param is not None:
            ok = ok and f.get(4, [b""])[0].decode() == param
        check(ok, "%s: error frame code %s (got kind %d %r)" % (what, code, k, f))
        check(c.closed_after(10), "%s: connection closed" % what)
    except (EOFError, OSError) as e:
        check(False, "%s: %r" % (what, e))
    finally:
        c.close()


plain = [p for p in ref["prompts"] if "<｜" not in p["text"]][:3]
srv = pb.Server(exe, worker, model, tp=2, extra=["--max-context", "512", "--max-seqs", "8"])
try:
    P = srv.proto_port
    rc, out, err = client(P, "health")
    check(rc == 0 and out.strip() == "ok", "health %r %r" % (out, err))
    rc, out, err = client(P, "models")
    check(rc == 0 and out.split() == [os.path.basename(model), "512"], "models %r %r" % (out, err))
    for p in plain:
        n = len(p["greedy"])
        rc, out, err = client(P, "tokenize", p["text"])
        check(rc == 0 and [int(x) for x in out.split()] == p["tokens"], "tokenize %r: %r %r" % (p["text"][:20], out, err))
        rc, out, err = client(P, "generate", "-p", p["text"], "-n", str(n), "--temp", "0", "--stream")
        check(rc == 0 and out == p["greedy_text"] + "\n", "streamed greedy %r vs %r (%s)" % (out, p["greedy_text"], err))
        rc, out, err = client(P, "generate", "-p", p["text"], "-n", str(n), "--temp", "0", "--json", "--logprobs", "5")
        lines = [json.loads(x) for x in out.splitlines()] if rc == 0 else []
        toks = [x for x in lines if "id" in x]
        check(rc == 0 and [t["id"] for t in toks] == p["greedy"], "greedy ids %r" % out[:300])
        if toks:
            exp_id, exp_lp = p["last_top5"][0]
            check(abs(toks[0]["logprob"] - exp_lp) < 0.05 and toks[0]["top_logprobs"][0][0] == exp_id,
                  "first token logprob %r vs %r" % (toks[0], p["last_top5"][0]))
            check([t["index"] for t in toks] == list(range(len(toks))), "token indexes")
            fin = lines[-1]
            check(fin.get("finish_reason") == "length" and fin["usage"] == {"prompt_tokens": len(p["tokens"]),
                                                                          "completion_tokens": n},
                  "final frame %r" % fin)
            check("".join(t["text"] for t in toks) == p["greedy_text"], "token texts add up")
    rc, out, err = client(P, "generate", "-p", "What is 7 plus 5?", "--chat", "-n", "30", "--temp", "0")
    check(rc == 0 and out == "7 plus 5 is 12.\n" and "finish_reason stop" in err, "chat %r %r" % (out, err))

    # several requests in flight on one connection, interleaved
    c = pb.Conn(P)
    p0, p1 = plain[0], plain[1]
    c.send(pb.frame(pb.K_GENERATE, pb.generate_msg(7, p0["text"], len(p0["greedy"]), 0.0)) +
           pb.frame(pb.K_GENERATE, pb.generate_msg(8, p1["text"], len(p1["greedy"]), 0.0)) +
           pb.frame(pb.K_HEALTH, pb.f_varint(1, 9)))
    got = {7: [[], ""], 8: [[], ""]}
    done, health_seen = set(), False
    while len(done) < 2 or not health_seen:
        k, f = c.read_frame()
        rid = f.get(1, [0])[0]
        if k == pb.K_HEALTH_RESP:
            health_seen = rid == 9 and f.get(2, [0])[0] == 1
            continue
        check(k == pb.K_GEN_RESP and rid in got, "interleaved frame kind %d id %d" % (k, rid))
        if 2 in f:
            got[rid][0].append(f[2][0])
        got[rid][1] += f.get(3, [b""])[0].decode()
        if 7 in f:
            done.add(rid)
    check(health_seen, "health answered among the streams")
    check(got[7][0] == p0["greedy"] and got[7][1] == p0["greedy_text"], "in-flight 7 %r" % got[7][1])
    check(got[8][0] == p1["greedy"] and got[8][1] == p1["greedy_text"], "in-flight 8 %r" % got[8][1])
    # a request-level error keeps the connection
    c.send(pb.frame(pb.K_GENERATE, pb.generate_msg(10, ids=[999999], max_tokens=2)))
    ids, text, fin, er = read_until_final(c, 10)
    check(er is not None and er[2][0] == pb.E["INVALID_REQUEST"], "out-of-vocabulary prompt id: %r" % er)
    c.send(pb.frame(pb.K_TOKENIZE, pb.f_varint(1, 11) + pb.f_bytes(3, p0["text"])))
    k, f = c.read_frame()
    check(k == pb.K_TOK_RESP and f[1][0] == 11 and pb.packed_ints(f[2][0]) == p0["tokens"], "tokenize frame %r" % f)
    # Cancel: the request ends with ERROR_CANCELLED, the connection stays
    c.send(pb.frame(pb.K_GENERATE, pb.generate_msg(12, p0["text"], 400, 0.0, ignore_eos=True)))
    k, f = c.read_frame()
    check(k == pb.K_GEN_RESP and f[1][0] == 12, "first token before cancel")
    c.send(pb.frame(pb.K_CANCEL, pb.f_varint(1, 12)))
    ids, text, fin, er = read_until_final(c, 12)
    check(er is not None and er[2][0] == pb.E["CANCELLED"], "cancelled %r %r" % (fin, er))

    # malformed frames, each on its own connection, while another stream keeps going
    other = pb.Conn(P)
    long_p = plain[2]
    other.send(pb.frame(pb.K_GENERATE, pb.generate_msg(1, long_p["text"], len(long_p["greedy"]), 0.0)))
    hello = pb.frame(pb.K_HELLO, pb.f_varint(1, 1))
    expect_fatal(P, b"\x00\x00\x00\x00\x12", pb.E["BAD_FRAME"], "length 0")
    expect_fatal(P, b"\x00\x10\x00\x02\x12" + b"\x00" * 1000, pb.E["FRAME_TOO_LARGE"], "oversized frame")
    expect_fatal(P, hello + pb.frame(pb.K_GENERATE, b"\xff\xff\xff\xff"), pb.E["BAD_PROTOBUF"], "bad protobuf")
    expect_fatal(P, pb.frame(pb.K_GENERATE, b"\x0a\x05ab"), pb.E["BAD_PROTOBUF"], "truncated field")
    expect_fatal(P, pb.frame(7, pb.f_varint(1, 1)), pb.E["UNKNOWN_KIND"], "unknown kind")
    expect_fatal(P, pb.frame(pb.K_HEALTH, pb.f_varint(1, 1), version=2), pb.E["UNKNOWN_KIND"], "unknown version")
    expect_fatal(P, pb.frame(pb.K_ERROR, pb.f_varint(1, 1)), pb.E["BAD_FRAME"], "server-only kind")
    expect_fatal(P, pb.frame(pb.K_HELLO, pb.f_varint(1, 9)), pb.E["UNKNOWN_KIND"], "hello version 9")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(None, "hi", 2)), pb.E["INVALID_FIELD"], "no request_id",
                 "request_id")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(0, "hi", 2)), pb.E["INVALID_FIELD"], "request_id 0",
                 "request_id")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, None, 2)), pb.E["INVALID_FIELD"], "no prompt", "prompt")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, "hi", 2, ids=[1, 2])), pb.E["INVALID_FIELD"],
                 "two prompts", "prompt")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, "hi", 2, temperature=-1.0)), pb.E["INVALID_FIELD"],
                 "negative temperature", "temperature")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, "hi", 2, temperature=float("nan"))),
                 pb.E["INVALID_FIELD"], "NaN temperature", "temperature")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, "hi", 0)), pb.E["INVALID_FIELD"], "max_tokens 0",
                 "max_tokens")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, "hi", 2) + pb.f_varint(22, 21)), pb.E["INVALID_FIELD"],
                 "top_logprobs 21", "top_logprobs")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3, "hi", 2) + pb.f_bytes(17, "")),
                 pb.E["INVALID_FIELD"], "empty stop string", "stop")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(3) + pb.f_bytes(6, pb.f_bytes(2, "x"))),
                 pb.E["INVALID_FIELD"], "chat message without role", "messages")
    expect_fatal(P, pb.frame(pb.K_TOKENIZE, pb.f_varint(1, 3)), pb.E["INVALID_FIELD"], "tokenize without text", "text")
    expect_fatal(P, pb.frame(pb.K_GENERATE, pb.generate_msg(5, plain[0]["text"], 300, 0.0, ignore_eos=True)) +
                 pb.frame(pb.K_GENERATE, pb.generate_msg(5, "hi", 2)), pb.E["DUPLICATE_ID"], "duplicate request_id",
                 "request_id")
    ids, text, fin, er = read_until_final(other, 1)
    check(fin is not None and ids == long_p["greedy"] and text == long_p["greedy_text"],
          "the other stream went on through the malformed frames: %r %r" % (text, er))
    other.close()
    rc, out, err = client(P, "health")
    check(rc == 0 and out.strip() == "ok", "health after malformed frames")

    # a client that disconnects mid-stream frees its request
    m0 = pb.metrics(srv.port)
    cancelled0 = pb.metric(m0, "mlaserve_requests_total", finish_reason="cancelled")
    d = pb.Conn(P)
    d.send(pb.frame(pb.K_GENERATE, pb.generate_msg(1, plain[0]["text"], 400, 0.0, ignore_eos=True)))
    for _ in range(2):
        k, f = d.read_frame()
        check(k == pb.K_GEN_RESP and 2 in f, "token before disconnect")
    d.close()
    deadline, freed = time.time() + 60, False
    while time.time() < deadline and not freed:
        m = pb.metrics(srv.port)
        freed = (pb.metric(m, "mlaserve_requests_total", finish_reason="cancelled") >= cancelled0 + 1 and
                 pb.metric(m, "mlaserve_num_requests_running") == 0 and
                 pb.metric(m, "mlaserve_num_requests_waiting") == 0 and
                 pb.metric(m, "mlaserve_kv_cache_blocks_used") == 0)
        if not freed:
            time.sleep(0.2)
    check(freed, "disconnect cancelled the request and freed its cache blocks")
    rc, out, err = client(P, "generate", "-p", plain[0]["text"], "-n", str(len(plain[0]["greedy"])), "--temp", "0")
    check(rc == 0 and out == plain[0]["greedy_text"] + "\n", "follow-up request after the disconnect")
finally:
    rc = srv.stop()
    check(rc == 0, "clean exit %r" % rc)
    if FAILS:
        print(srv.tail())

# API key: Hello or per-request key; health needs none
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "256", "--api-key", "s3cret"])
try:
    P = srv.proto_port
    rc, out, err = client(P, "health")
    check(rc == 0 and out.strip() == "ok", "health without a key")
    rc, out, err = client(P, "models")
    check(rc == 1 and "ERROR_UNAUTHENTICATED" in err, "models without a key: %r" % err)
    rc, out, err = client(P, "models", key="s3cret")
    check(rc == 0 and out.startswith(os.path.basename(model)), "models with the key: %r %r" % (out, err))
    expect_fatal(P, pb.frame(pb.K_HELLO, pb.f_varint(1, 1) + pb.f_bytes(2, "wrong")), pb.E["UNAUTHENTICATED"],
                 "wrong key in Hello", "api_key")
    c = pb.Conn(P)
    c.send(pb.frame(pb.K_MODELS, pb.f_varint(1, 4) + pb.f_bytes(2, "s3cret")))
    k, f = c.read_frame()
    check(k == pb.K_MODELS_RESP and f[1][0] == 4, "per-request key")
    c.send(pb.frame(pb.K_MODELS, pb.f_varint(1, 5) + pb.f_bytes(2, "nope")))
    k, f = c.read_frame()
    check(k == pb.K_ERROR and f[1][0] == 5 and f[2][0] == pb.E["UNAUTHENTICATED"], "wrong per-request key")
    c.close()
finally:
    rc = srv.stop()
    check(rc == 0, "clean exit (key server) %r" % rc)
    if FAILS:
        print(srv.tail())

sys.exit(summary())
