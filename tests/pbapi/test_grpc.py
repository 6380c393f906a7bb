"""The gRPC API (proto/api.proto, coordinator/grpc_*, common/apiclient.*, `mlaserve client`,
docs/grpc.md) against a real `mlaserve serve --tp 2` on the tiny-deepseek3 fixture, through
grpcio (the official Python gRPC client, its stubs generated now from proto/api.proto with
grpcio-tools) and grpcio-health-checking (grpc.health.v1, the gRPC project's own stubs). Known
answers come from the fixture's Hugging Face reference (ref.json).
Usage: test_grpc.py MLASERVE_EXE WORKER_EXE FIXTURES_DIR [PROTO_DIR]. Exit 77 when the fixture
or grpcio-tools is missing."""
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pbutil as pb  # noqa: E402
from mlatest import check, summary, wait_for  # noqa: E402

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
proto_dir = sys.argv[4] if len(sys.argv) > 4 else pb.PROTO_DIR
model, ref = pb.fixture_paths(fixtures)
api_pb2, api_grpc, grpc = pb.stubs(proto_dir)
try:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
except ImportError:
    print("grpcio-health-checking missing (scripts/install-deps.sh --test): skipped")
    sys.exit(77)

KEY = "s3cret"
AUTH = (("authorization", "Bearer " + KEY),)
SC = grpc.StatusCode


def client(port, *args, key=KEY, extra=()):
    cmd = [exe, "client", "--port", str(port), "--timeout", "60"] + list(extra)
    if key:
        cmd += ["--api-key", key]
    r = subprocess.run(cmd + list(args), capture_output=True, timeout=180)
    return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")


def code_of(fn):
    """The status code fn's call ends with (OK when it raises nothing)."""
    try:
        fn()
        return SC.OK
    except grpc.RpcError as e:
        return e.code()


def gen(stub, timeout=120, **kw):
    """(token ids, text, last response) of a Generate call."""
    resp = list(stub.Generate(api_pb2.GenerateRequest(**kw), metadata=AUTH, timeout=timeout))
    ids = [r.token_id for r in resp if r.HasField("token_id")]
    return ids, "".join(r.text for r in resp), resp[-1] if resp else None


def metric(port, name, **labels):
    return pb.metric(pb.metrics(port), name, **labels)


# ---- raw HTTP/2 frames, for what grpcio does not show ----
def h2_frame(typ, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([typ, flags]) + struct.pack(">I", sid) + payload


def h2_headers(pairs):  # HPACK literals without indexing, new names (RFC 7541 6.2.2), short strings
    return b"".join(b"\x00" + bytes([len(k)]) + k + bytes([len(v)]) + v for k, v in pairs)


def h2_split(buf, frames):
    """the whole frames (type, flags, stream, payload) at the start of buf appended to frames; the rest"""
    while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
        n = int.from_bytes(buf[:3], "big")
        frames.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]))
        buf = buf[9 + n:]
    return buf


def h2_read(sock, frames, until):
    """reads frames (type, flags, stream, payload) into frames until until(frames) or EOF; True at EOF"""
    buf = b""
    while not until(frames):
        try:
            d = sock.recv(65536)
        except socket.timeout:
            return False
        if not d:
            return True
        buf = h2_split(buf + d, frames)
    return False


plain = [p for p in ref["prompts"] if "<｜" not in p["text"]][:3]
# every step at least 5 ms (a developer switch of the workers): a 450-token request then takes over
# 2.25 s however fast the host, so the 1.5 s and 1 s deadlines below always fall mid-stream; the
# drain at the end waits for a whole 450-token call, which a sanitized build on a busy host can
# take longer than the default 30 s over (the drain timeout itself is tested further down)
srv = pb.Server(exe, worker, model, tp=2, extra=["--max-context", "512", "--max-seqs", "16", "--api-key", KEY,
                                                 "--drain-timeout", "300"],
                env={"MLA_WORKER_STEP_DELAY_MS": "5"})
try:
    P, H = srv.proto_port, srv.port
    addr = "127.0.0.1:%d" % P
    chan = grpc.insecure_channel(addr)
    stub = api_grpc.MlaServeStub(chan)

    # ---- every method ----
    r = stub.Health(api_pb2.HealthRequest(), timeout=30)  # no key needed
    check(r.ok and r.status == "ok", "Health %r" % r)
    r = stub.Models(api_pb2.ModelsRequest(), metadata=AUTH, timeout=30)
    check([(m.id, m.max_model_len) for m in r.models] == [(os.path.basename(model), 512)], "Models %r" % r)
    r = stub.Info(api_pb2.InfoRequest(), metadata=AUTH, timeout=30)
    check(r.server == "mlaserve" and r.model == os.path.basename(model) and r.max_message == 4 << 20 and
          r.server_version and r.build.startswith("commit "), "Info %r" % r)
    for p in plain:
        r = stub.Tokenize(api_pb2.TokenizeRequest(text=p["text"]), metadata=AUTH, timeout=30)
        check(list(r.ids) == p["tokens"] and r.max_model_len == 512, "Tokenize %r: %r" % (p["text"][:20], r.ids))
        ids, text, last = gen(stub, prompt=p["text"], max_tokens=len(p["greedy"]), temperature=0)
        check(ids == p["greedy"] and text == p["greedy_text"], "Generate greedy = HF: %r vs %r" % (text, p["greedy_text"]))
        check(last.finish_reason == "length" and last.usage.prompt_tokens == len(p["tokens"]) and
              last.usage.completion_tokens == len(p["greedy"]), "Generate last message %r" % last)
        # streaming: one message per token, indexes in order, then the last one
        resp = list(stub.Generate(api_pb2.GenerateRequest(prompt_ids=p["tokens"], max_tokens=len(p["greedy"]),
                                                          temperature=0, top_logprobs=2), metadata=AUTH, timeout=120))
        toks = [x for x in resp if x.HasField("token_id")]
        check(len(resp) == len(p["greedy"]) + 1 and [x.index for x in toks] == list(range(len(toks))) and
              all(len(x.top_logprobs) == 2 and x.top_logprobs[0].token_id == x.token_id for x in toks),
              "streamed one message per token with logprobs (%d messages)" % len(resp))
        check(abs(toks[0].logprob - p["last_top5"][0][1]) < 0.05, "first logprob %.4f vs HF %.4f" %
              (toks[0].logprob, p["last_top5"][0][1]))
    # echo: a message for each prompt token first (prompt set, no index; the first without a
    # logprob, the others HF's within the fixture's bound), then the answer's tokens from index 0
    p = plain[0]
    n = len(p["tokens"])
    resp = list(stub.Generate(api_pb2.GenerateRequest(prompt_ids=p["tokens"], max_tokens=2, temperature=0,
                                                      logprobs=True, echo=True), metadata=AUTH, timeout=120))
    pt = [x for x in resp if x.prompt]
    gt = [x for x in resp if x.HasField("token_id") and not x.prompt]
    check([x.token_id for x in pt] == p["tokens"] and not pt[0].HasField("logprob") and
          not any(x.HasField("index") for x in pt) and [x.index for x in gt] == [0, 1] and
          max(abs(x.logprob - want) for x, want in zip(pt[1:], p["next_token_logprobs"])) < 0.01 and
          [x.token_id for x in gt] == p["greedy"][:2] and resp[-1].usage.completion_tokens == 2,
          "echo: the prompt's tokens and logprobs, then the answer (%d prompt messages)" % len(pt))
    resp = list(stub.Generate(api_pb2.GenerateRequest(prompt_ids=p["tokens"], max_tokens=0, logprobs=True, echo=True),
                              metadata=AUTH, timeout=120))
    check(len([x for x in resp if x.prompt]) == n and not [x for x in resp if x.HasField("index")] and
          resp[-1].finish_reason == "length" and resp[-1].usage.completion_tokens == 0,
          "echo with max_tokens 0: the prompt alone")
    ids, text, last = gen(stub, messages=[api_pb2.ChatMessage(role="user", content="What is 7 plus 5?")],
                          max_tokens=8, temperature=0)
    check(last is not None and last.finish_reason in ("stop", "length") and len(ids) >= 1, "chat Generate %r" % text)
    # min_tokens: the answer ("7 plus 5 is 12.", 9 tokens with its end) goes on past its end of generation
    ids0, text0, last0 = gen(stub, messages=[api_pb2.ChatMessage(role="user", content="What is 7 plus 5?")],
                             max_tokens=40, temperature=0)
    ids1, text1, last1 = gen(stub, messages=[api_pb2.ChatMessage(role="user", content="What is 7 plus 5?")],
                             max_tokens=40, temperature=0, min_tokens=len(ids0) + 3)
    check(last0.finish_reason == "stop" and len(ids0) < 20 and len(ids1) >= len(ids0) + 3 and
          text1.startswith(text0) and len(text1) > len(text0),
          "min_tokens: %r (%d tokens) goes on: %r (%d)" % (text0, len(ids0), text1, len(ids1)))
    check(code_of(lambda: gen(stub, prompt="1 2", max_tokens=2, min_tokens=3)) == SC.INVALID_ARGUMENT,
          "min_tokens past max_tokens: INVALID_ARGUMENT")
    r = stub.Cancel(api_pb2.CancelRequest(request_id=12345), metadata=AUTH, timeout=30)
    check(r.request_id == 12345, "Cancel of an unknown id is no error")

    # ---- grpc.health.v1 ----
    hs = health_pb2_grpc.HealthStub(chan)
    S = health_pb2.HealthCheckResponse
    check(hs.Check(health_pb2.HealthCheckRequest(), timeout=30).status == S.SERVING, "health Check ''")
    check(hs.Check(health_pb2.HealthCheckRequest(service="mlaapi.MlaServe"), timeout=30).status == S.SERVING,
          "health Check mlaapi.MlaServe")
    check(code_of(lambda: hs.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=30)) == SC.NOT_FOUND,
          "health Check of an unknown service: NOT_FOUND")
    w = hs.Watch(health_pb2.HealthCheckRequest(), timeout=30)
    check(next(w).status == S.SERVING, "health Watch: SERVING first")
    w.cancel()

    # ---- authentication ----
    for md, what in (((), "no key"), ((("authorization", "Bearer wrong"),), "wrong key"),
                     ((("authorization", KEY),), "key without Bearer")):
        check(code_of(lambda: stub.Models(api_pb2.ModelsRequest(), metadata=md, timeout=30)) == SC.UNAUTHENTICATED,
              "Models with %s: UNAUTHENTICATED" % what)
    check(code_of(lambda: list(stub.Generate(api_pb2.GenerateRequest(prompt="1 2", max_tokens=2),
                                             metadata=(("authorization", "Bearer nope"),), timeout=30)))
          == SC.UNAUTHENTICATED, "Generate with a wrong key: UNAUTHENTICATED")
    check(stub.Health(api_pb2.HealthRequest(), timeout=30).ok, "the channel still serves after wrong keys")

    # ---- a bad field fails only its own call ----
    p = plain[0]
    long_call = stub.Generate(api_pb2.GenerateRequest(prompt=p["text"], max_tokens=len(p["greedy"]), temperature=0),
                              metadata=AUTH, timeout=120)
    first = next(long_call)
    for req, what in ((api_pb2.GenerateRequest(prompt="1 2", max_tokens=0), "max_tokens 0"),
                      (api_pb2.GenerateRequest(prompt="1 2", top_logprobs=99), "top_logprobs 99"),
                      (api_pb2.GenerateRequest(messages=[api_pb2.ChatMessage(role="user", content="hi")], echo=True),
                       "echo with messages"),
                      (api_pb2.GenerateRequest(max_tokens=3), "no prompt"),
                      (api_pb2.GenerateRequest(prompt="1", prompt_ids=[1]), "two prompts"),
                      (api_pb2.GenerateRequest(prompt_ids=[999999], max_tokens=2), "token id out of range"),
                      (api_pb2.GenerateRequest(prompt="1", model="other"), "unknown model")):
        want = SC.NOT_FOUND if what == "unknown model" else SC.INVALID_ARGUMENT
        c = code_of(lambda: list(stub.Generate(req, metadata=AUTH, timeout=30)))
        check(c == want, "%s: %s (got %s)" % (what, want, c))
    try:
        list(stub.Generate(api_pb2.GenerateRequest(prompt_ids=[1, -1], max_tokens=2), metadata=AUTH, timeout=30))
        got = (SC.OK, "")
    except grpc.RpcError as e:
        got = (e.code(), e.details())
    check(got[0] == SC.INVALID_ARGUMENT and "prompt_ids" in got[1], "a negative prompt id: the error names prompt_ids %r" %
          (got,))
    # refusals the generation path makes (past the decoder) name their field as the proto does
    for req, field in ((api_pb2.GenerateRequest(prompt_ids=[5, 999999], max_tokens=2), "prompt_ids: token id 999999"),
                       (api_pb2.GenerateRequest(prompt="1 2", max_tokens=2, add_generation_prompt=False),
                        "add_generation_prompt"),
                       (api_pb2.GenerateRequest(prompt="1 2", max_tokens=2, logprobs=False, top_logprobs=3),
                        "top_logprobs"),
                       (api_pb2.GenerateRequest(prompt="1 2 3", stop_token_ids=[999999], max_tokens=2),
                        "stop_token_ids: token id 999999"),
                       (api_pb2.GenerateRequest(prompt="1 2", max_tokens=2147483647), "max_tokens: ")):
        try:
            list(stub.Generate(req, metadata=AUTH, timeout=30))
            got = (SC.OK, "")
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == SC.INVALID_ARGUMENT and got[1].startswith(field), "the refusal starts %r: %r" % (field, got))
    # two authorization fields: which one counts would be a guess
    for two in ((AUTH[0], ("authorization", "Bearer nope")), (("authorization", "Bearer nope"), AUTH[0])):
        c = code_of(lambda: stub.Info(api_pb2.InfoRequest(), metadata=two, timeout=30))
        check(c == SC.UNAUTHENTICATED, "two authorization fields: UNAUTHENTICATED (got %s)" % c)
    check(code_of(lambda: stub.Tokenize(api_pb2.TokenizeRequest(), metadata=AUTH, timeout=30)) == SC.INVALID_ARGUMENT,
          "Tokenize without text: INVALID_ARGUMENT")
    msg = api_pb2.ChatMessage(role="user", content="hi")
    check(code_of(lambda: stub.Tokenize(api_pb2.TokenizeRequest(messages=[msg], add_special_tokens=False), metadata=AUTH,
                                        timeout=30)) == SC.INVALID_ARGUMENT,
          "Tokenize messages with add_special_tokens: INVALID_ARGUMENT")
    check(code_of(lambda: stub.Cancel(api_pb2.CancelRequest(), metadata=AUTH, timeout=30)) == SC.INVALID_ARGUMENT,
          "Cancel without request_id: INVALID_ARGUMENT")
    # bytes that are no GenerateRequest, on the same channel
    raw = chan.unary_unary("/mlaapi.MlaServe/Tokenize", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    check(code_of(lambda: raw(b"\xff\xff\xff", metadata=AUTH, timeout=30)) == SC.INVALID_ARGUMENT,
          "undecodable request: INVALID_ARGUMENT")
    nope = chan.unary_unary("/mlaapi.MlaServe/Nope", request_serializer=lambda b: b, response_deserializer=lambda b: b)
    check(code_of(lambda: nope(b"", metadata=AUTH, timeout=30)) == SC.UNIMPLEMENTED, "unknown method: UNIMPLEMENTED")
    rest = list(long_call)
    ids = [first.token_id] + [x.token_id for x in rest if x.HasField("token_id")]
    check(ids == p["greedy"] and rest[-1].finish_reason == "length",
          "the call in flight on the channel finished right beside the bad ones")

    # ---- cancel mid-stream, Cancel by request_id, deadlines: the scheduler drops the request ----
    def settled(cancelled0):
        return wait_for(lambda: metric(H, "mlaserve_num_requests_running") == 0 and
                        metric(H, "mlaserve_num_requests_waiting") == 0 and
                        metric(H, "mlaserve_requests_total", finish_reason="cancelled") > cancelled0, 20)

    c0 = metric(H, "mlaserve_requests_total", finish_reason="cancelled")
    t0 = time.time()
    call = stub.Generate(api_pb2.GenerateRequest(prompt="1 2 3", max_tokens=450, ignore_eos=True), metadata=AUTH,
                         timeout=300)
    got = [next(call) for _ in range(3)]
    call.cancel()
    check(code_of(lambda: list(call)) == SC.CANCELLED and len(got) == 3, "cancelled mid-stream: CANCELLED")
    check(settled(c0), "cancel mid-stream reached the scheduler (running 0, cancelled counted) in %.1fs" %
          (time.time() - t0))

    c0 = metric(H, "mlaserve_requests_total", finish_reason="cancelled")
    call = stub.Generate(api_pb2.GenerateRequest(request_id=77, prompt="1 2 3", max_tokens=450, ignore_eos=True),
                         metadata=AUTH, timeout=300)
    next(call)
    stub.Cancel(api_pb2.CancelRequest(request_id=77), metadata=AUTH, timeout=30)
    check(code_of(lambda: list(call)) == SC.CANCELLED, "Cancel(request_id): the Generate ends CANCELLED")
    check(settled(c0), "Cancel(request_id) reached the scheduler")

    c0 = metric(H, "mlaserve_requests_total", finish_reason="cancelled")
    t0 = time.time()
    c = code_of(lambda: list(stub.Generate(api_pb2.GenerateRequest(prompt="1 2 3", max_tokens=450, ignore_eos=True),
                                           metadata=AUTH, timeout=1.5)))
    dt = time.time() - t0
    check(c == SC.DEADLINE_EXCEEDED and dt < 5, "deadline 1.5 s: DEADLINE_EXCEEDED after %.1fs" % dt)
    check(settled(c0), "the deadline reached the scheduler")

    # ---- 64 concurrent streams on one channel = the same requests made singly ----
    reqs = []
    for i in range(64):
        p = plain[i % len(plain)]
        reqs.append(dict(prompt=p["text"], max_tokens=4 + i % 5, temperature=0) if i % 2 == 0 else
                    dict(prompt=p["text"], max_tokens=6, temperature=0.8, seed=1000 + i))
    single = {}
    for i, kw in enumerate(reqs):
        key = tuple(sorted(kw.items()))
        if key not in single:
            single[key] = gen(stub, **kw)[:2]
    results = [None] * 64

    def run(i):
        try:
            results[i] = gen(stub, timeout=280, **reqs[i])[:2]
        except grpc.RpcError as e:
            results[i] = ("error", e.code())

    ths = [threading.Thread(target=run, args=(i,)) for i in range(64)]
    t0 = time.time()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    bad = [i for i in range(64) if results[i] != single[tuple(sorted(reqs[i].items()))]]
    check(not bad, "64 concurrent streams = single requests in %.1fs (differ: %r)" %
          (time.time() - t0, [(i, results[i]) for i in bad[:3]]))

    # ---- garbage on the port: the server stays up and serves ----
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(4096),
                 b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\x09\x00\x00\x00\x00\x01garbage!" * 50,
                 b"\x00\x00\x00\x01\x12" * 1000):
        s = socket.create_connection(("127.0.0.1", P), timeout=10)
        try:
            s.sendall(junk)
            s.settimeout(10)
            closed = False
            t_end = time.time() + 10
            while time.time() < t_end:
                d = s.recv(65536)
                if not d:
                    closed = True
                    break
            check(closed, "garbage %r...: the server closed the connection" % junk[:12])
        except (ConnectionResetError, BrokenPipeError):
            pass
        finally:
            s.close()
    check(stub.Health(api_pb2.HealthRequest(), timeout=30).ok, "the old channel still serves after garbage")
    with grpc.insecure_channel(addr) as ch2:
        ids, _, _ = gen(api_grpc.MlaServeStub(ch2), prompt=plain[0]["text"], max_tokens=len(plain[0]["greedy"]),
                        temperature=0)
        check(ids == plain[0]["greedy"], "a new channel serves right after garbage")

    # ---- the C client (`mlaserve client`) ----
    rc, out, err = client(P, "health")
    check(rc == 0 and out.strip() == "ok", "client health %r %r" % (out, err))
    rc, out, err = client(P, "models")
    check(rc == 0 and out.split() == [os.path.basename(model), "512"], "client models %r %r" % (out, err))
    rc, out, err = client(P, "info")
    check(rc == 0 and "max_message 4194304" in out and os.path.basename(model) in out, "client info %r %r" % (out, err))
    for p in plain[:2]:
        rc, out, err = client(P, "tokenize", p["text"])
        check(rc == 0 and [int(x) for x in out.split()] == p["tokens"], "client tokenize %r %r" % (out, err))
        n = str(len(p["greedy"]))
        rc, out, err = client(P, "generate", "-p", p["text"], "-n", n, "--temp", "0", "--stream")
        check(rc == 0 and out == p["greedy_text"] + "\n", "client streamed greedy %r vs %r (%s)" % (out, p["greedy_text"], err))
        rc, out, err = client(P, "generate", "-p", p["text"], "-n", n, "--temp", "0", "--json", "--logprobs", "3")
        lines = [json.loads(x) for x in out.splitlines()] if rc == 0 else []
        check([x["id"] for x in lines if "id" in x] == p["greedy"] and lines and lines[-1].get("finish_reason") == "length"
              and all(len(x["top_logprobs"]) == 3 for x in lines if "id" in x), "client --json %r" % out[-200:])
        u = lines[-1].get("usage", {}) if lines else {}
        check(u.get("completion_tokens") == len(p["greedy"]) and u.get("prompt_tokens") == len(p["tokens"]) and
              u.get("total_tokens") == len(p["tokens"]) + len(p["greedy"]), "client --json usage with its total", u)
    rc, out, err = client(P, "generate", "-p", "1 2", "-n", "0")
    check(rc == 2, "client refuses -n 0 itself")
    rc, out, err = client(P, "models", key="wrong")
    check(rc == 1 and "UNAUTHENTICATED" in err, "client with a wrong key: %r" % err)
    rc, out, err = client(P, "generate", "-p", "1 2 3", "-n", "450", "--ignore-eos", extra=["--timeout", "1"])
    check(rc == 1 and "DEADLINE_EXCEEDED" in err, "client --timeout 1: DEADLINE_EXCEEDED (%r)" % err)
    # ---- strings the HTTP API refuses: a NUL, bytes that are not UTF-8 ----
    c = code_of(lambda: list(stub.Generate(api_pb2.GenerateRequest(prompt="1 2\x003 4", max_tokens=2), metadata=AUTH,
                                           timeout=30)))
    check(c == SC.INVALID_ARGUMENT, "a prompt with a NUL: INVALID_ARGUMENT (%s)" % c)
    raw = api_pb2.GenerateRequest(prompt="1 2 X 3", max_tokens=2).SerializeToString().replace(b"X", b"\xff")
    gen_raw = chan.unary_stream("/mlaapi.MlaServe/Generate", request_serializer=lambda b: b,
                                response_deserializer=api_pb2.GenerateResponse.FromString)
    c = code_of(lambda: list(gen_raw(raw, metadata=AUTH, timeout=30)))
    check(c == SC.INVALID_ARGUMENT, "a prompt that is not UTF-8: INVALID_ARGUMENT (%s)" % c)
    # inside a repeated message: the error names the element, as the HTTP API does
    raw = api_pb2.GenerateRequest(messages=[api_pb2.ChatMessage(role="user", content="hi"),
                                            api_pb2.ChatMessage(role="user", content="a X")],
                                  max_tokens=2).SerializeToString().replace(b"X", b"\xff")
    try:
        list(gen_raw(raw, metadata=AUTH, timeout=30))
        got = (SC.OK, "")
    except grpc.RpcError as e:
        got = (e.code(), e.details())
    check(got[0] == SC.INVALID_ARGUMENT and "messages[1].content is not valid UTF-8" in got[1],
          "a message's content that is not UTF-8 is named by its index: %r" % (got,))
    # fields this server does not know (a newer client's, the removed api_key) are refused by
    # number and place, not dropped: the server would not honour them
    base = api_pb2.GenerateRequest(prompt="1 2", max_tokens=2).SerializeToString()
    chat = api_pb2.GenerateRequest(messages=[api_pb2.ChatMessage(role="user", content="hi")], max_tokens=2)
    cm = chat.messages[0].SerializeToString() + b"\x48\x05"  # ChatMessage field 9, varint 5
    for payload, says in ((base + b"\x98\x06\x05", "#99: field 99 is not a field of GenerateRequest"),
                          (base + b"\x12\x03key", "field 2 (api_key) was removed"),
                          (b"\x32" + bytes([len(cm)]) + cm + b"\x40\x02", "messages[0].#9: field 9 is not a field of "
                                                                          "ChatMessage")):
        try:
            list(gen_raw(payload, metadata=AUTH, timeout=30))
            got = (SC.OK, "")
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == SC.INVALID_ARGUMENT and says in got[1], "an unknown field refused: %r" % (got,))
    # ---- a reply larger than the connection's output bound (8 MiB with its 5-byte frame head):
    # Tokenize of 4 MiB less a byte of " \n" pairs, a token a byte, ids of two varint bytes ----
    with grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20),
                                              ("grpc.max_send_message_length", 8 << 20)]) as ch:
        r = api_grpc.MlaServeStub(ch).Tokenize(api_pb2.TokenizeRequest(text=" \n" * 2097149), metadata=AUTH, timeout=120)
        check(len(r.ids) > 4000000 and r.ByteSize() + 5 > 8 << 20, "a Tokenize reply of %d bytes (framed: over "
              "the 8 MiB bound)" % r.ByteSize())
    # ---- draining (SIGTERM with a call in flight): every connection, new ones too, is told
    # GOAWAY; a new call fails UNAVAILABLE, the call in flight ends whole ----
    slow = stub.Generate(api_pb2.GenerateRequest(prompt="1 2 3", max_tokens=450, ignore_eos=True), metadata=AUTH,
                         timeout=120)
    next(slow)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    # grpcio starts it on a new connection (the one it had was told GOAWAY), where it is answered
    # (a connection made during the drain gets its notice once its calls are answered: one at once
    # would send the call on to yet another connection, over and over until the server is gone)
    try:
        list(stub.Generate(api_pb2.GenerateRequest(prompt="1 2", max_tokens=2), metadata=AUTH, timeout=30))
        got = (SC.OK, "")
    except grpc.RpcError as e:
        got = (e.code(), e.details())
    check(got[0] == SC.UNAVAILABLE and "shutting down (signal 15)" in got[1] and srv.proc.poll() is None,
          "draining: a new Generate answered UNAVAILABLE by the draining server %r" % (got,))
    check(sum(1 for x in slow if x.HasField("token_id")) == 449, "draining: the call in flight ends whole")
    chan.close()
    srv.proc.wait(timeout=60)  # the drain ends by itself (stop() then sees the exit status)
finally:
    code = srv.stop()
    check(code == 0, "server exit status %r" % code)

# ---- a client without the key, two keys, a reply never taken, a message cut at a character ----
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "256", "--api-key", KEY, "--write-timeout-ms", "1500"])
try:
    P = srv.proto_port
    gen_hdrs = h2_headers([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/mlaapi.MlaServe/Generate"),
                           (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    # no key: the call is answered on its headers, while its message is still coming (not held)
    with socket.create_connection(("127.0.0.1", P), timeout=20) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0) + h2_frame(1, 4, 1, gen_hdrs) +
                  h2_frame(0, 0, 1, b"\x00" + struct.pack(">I", 1 << 20) + b"x" * 16000))
        frames = []
        h2_read(s, frames, lambda f: any(t == 1 and sid == 1 and fl & 1 for t, fl, sid, _ in f))
        check(any(t == 1 and sid == 1 and fl & 1 for t, fl, sid, _ in frames),
              "no key: the call is refused before its message ends (frames %r)" % [t for t, _, _, _ in frames])
    with grpc.insecure_channel("127.0.0.1:%d" % P) as ch:
        st = api_grpc.MlaServeStub(ch)
        two = (("authorization", "Bearer " + KEY), ("authorization", "Bearer other"))
        check(code_of(lambda: st.Health(api_pb2.HealthRequest(), metadata=two, timeout=30)) == SC.OK,
              "two authorization fields on a call that needs no key: answered")
        try:
            list(st.Generate(api_pb2.GenerateRequest(prompt="1 2", max_tokens=1), metadata=two, timeout=30))
            got = (SC.OK, "")
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == SC.UNAUTHENTICATED and "more than one authorization" in got[1],
              "two authorization fields on a call that needs the key: refused %r" % (got,))
        name = "a" * 1005 + "\u00e9" * 20  # the message quoting it is cut at its 1024 bytes, inside the name
        try:
            list(st.Generate(api_pb2.GenerateRequest(prompt="1", max_tokens=1, model=name), metadata=AUTH, timeout=30))
            got = (SC.OK, "")
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == SC.NOT_FOUND and "\u00e9" in got[1] and "\u00c3" not in got[1],
              "a message cut inside a quoted name stays valid UTF-8 (%r)" % (got[1][-40:],))
    # a reply the client never takes (its window 0; PINGs meanwhile): closed after --write-timeout-ms
    with socket.create_connection(("127.0.0.1", P), timeout=20) as s:
        msg = api_pb2.HealthRequest().SerializeToString()
        hh = h2_headers([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/mlaapi.MlaServe/Health"),
                         (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, struct.pack(">HI", 4, 0)) +
                  h2_frame(1, 4, 1, hh) + h2_frame(0, 1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        s.settimeout(0.3)
        t0, eof = time.time(), False
        while time.time() - t0 < 10 and not eof:
            try:
                s.sendall(h2_frame(6, 0, 0, b"12345678"))  # PING: traffic, not progress
                eof = h2_read(s, [], lambda f: False)
            except OSError:  # closed under the write
                eof = True
        dt = time.time() - t0
        check(eof and 1.0 < dt < 6, "a reply never taken: the connection closed after %.1fs (--write-timeout-ms "
              "1500)" % dt)
finally:
    code = srv.stop()
    check(code == 0, "key/stall server exit status %r" % code)

# ---- every connection slot held by a client that takes none of its reply: a new one gets in ----
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "256", "--max-conns", "2", "--write-timeout-ms",
                                                 "60000"])
try:
    P = srv.proto_port
    msg = api_pb2.HealthRequest().SerializeToString()
    hh = h2_headers([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/mlaapi.MlaServe/Health"),
                     (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    held = []
    for _ in range(2):  # window 0: the reply is held for good
        s = socket.create_connection(("127.0.0.1", P), timeout=20)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, struct.pack(">HI", 4, 0)) +
                  h2_frame(1, 4, 1, hh) + h2_frame(0, 1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        held.append(s)
    time.sleep(1.6)  # held past the second after which a held connection gives way
    with grpc.insecure_channel("127.0.0.1:%d" % P) as ch:
        c = code_of(lambda: api_grpc.MlaServeStub(ch).Health(api_pb2.HealthRequest(), timeout=20))
    check(c == SC.OK, "both slots held by clients that take nothing: a new client is served (%s)" % c)
    closed = 0
    for s in held:
        s.settimeout(2)
        try:
            closed += h2_read(s, [], lambda f: False)
        except OSError:
            closed += 1
        s.close()
    check(closed == 1, "one held connection gave way (%d closed)" % closed)
finally:
    code = srv.stop()
    check(code == 0, "held-slots server exit status %r" % code)

# ---- TLS (a self-signed certificate made now) ----
d = tempfile.mkdtemp(prefix="mla_grpc_tls_")
cert, keyf = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", keyf, "-out", cert],
                   capture_output=True)
check(r.returncode == 0, "openssl made a certificate: %r" % r.stderr[-300:])
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "256", "--tls-cert", cert, "--tls-key", keyf,
                                                 "--idle-timeout-ms", "1500"])
try:
    P = srv.proto_port
    creds = grpc.ssl_channel_credentials(root_certificates=open(cert, "rb").read())
    with grpc.secure_channel("localhost:%d" % P, creds) as ch:
        st = api_grpc.MlaServeStub(ch)
        p = plain[0]
        resp = list(st.Generate(api_pb2.GenerateRequest(prompt=p["text"], max_tokens=len(p["greedy"]), temperature=0),
                                timeout=120))
        check([x.token_id for x in resp if x.HasField("token_id")] == p["greedy"], "TLS: Generate = HF")
        check(health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=30).status ==
              health_pb2.HealthCheckResponse.SERVING, "TLS: health Check")
    with grpc.insecure_channel("127.0.0.1:%d" % P) as ch:
        c = code_of(lambda: api_grpc.MlaServeStub(ch).Health(api_pb2.HealthRequest(), timeout=5))
        check(c == SC.UNAVAILABLE, "TLS: a plain-text client fails (%s)" % c)
    rc, out, err = client(P, "generate", "-p", p["text"], "-n", str(len(p["greedy"])), "--temp", "0", key=None,
                          extra=["--host", "localhost", "--tls-ca", cert])
    check(rc == 0 and out == p["greedy_text"] + "\n", "TLS: client generate %r %r" % (out, err))
    # an idle HTTP/2 connection (TLS, ALPN h2, preface and SETTINGS, then nothing) is closed
    ctx = ssl.create_default_context(cafile=cert)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", P), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        check(s.selected_alpn_protocol() == "h2", "TLS: ALPN h2")
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        t0 = time.time()
        got = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                got += d
        except (ssl.SSLError, OSError):
            pass
        dt = time.time() - t0
        check(1.0 < dt < 6, "TLS: an idle connection closed after %.1fs (--idle-timeout-ms 1500)" % dt)
        frames = []
        h2_split(got, frames)
        types = [t for t, _, _, _ in frames]
        check(types and types[-1] == 7, "TLS: the idle connection was told GOAWAY before it closed (frames %r)" % types)
    rc, out, err = client(P, "health", key=None, extra=["--host", "localhost", "--tls"])
    check(rc == 1 and "TLS" in err, "TLS: client without the CA refuses the certificate: %r" % err)
finally:
    code = srv.stop()
    check(code == 0, "TLS server exit status %r" % code)
# ---- a drain with a call in flight (400 steps of 20 ms, past the drain timeout of 3 s): a
# connection made during it has its Health and grpc.health.v1 Check answered (draining,
# NOT_SERVING), then hears the notice (last stream id 2^31 - 1, RFC 9113 6.8), then the GOAWAY
# that names the last call taken (3: the sweep's, a second after the notice) and the close. The
# call in flight is cut off by the drain timeout: UNAVAILABLE (retryable) ----
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "512", "--drain-timeout", "3"],
                env={"MLA_WORKER_STEP_DELAY_MS": "20"})
try:
    with grpc.insecure_channel("127.0.0.1:%d" % srv.proto_port) as ch:
        it = api_grpc.MlaServeStub(ch).Generate(api_pb2.GenerateRequest(prompt="1 2 3", max_tokens=400,
                                                                        ignore_eos=True), timeout=120)
        check(next(it).HasField("token_id"), "drain: the call streams")
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        def call(sid, path):  # an empty request on stream sid
            return (h2_frame(1, 4, sid, h2_headers(
                [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x"),
                 (b"content-type", b"application/grpc"), (b"te", b"trailers")])) +
                h2_frame(0, 1, sid, b"\x00\x00\x00\x00\x00"))
        with socket.create_connection(("127.0.0.1", srv.proto_port), timeout=20) as s:
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0) + call(1, b"/mlaapi.MlaServe/Health") +
                      call(3, b"/grpc.health.v1.Health/Check"))
            frames = []
            eof = h2_read(s, frames, lambda f: False)
        gone = [struct.unpack(">I", pl[:4])[0] & 0x7FFFFFFF for t, _, _, pl in frames if t == 7]
        check(eof and gone[:1] == [0x7FFFFFFF] and gone[1:] == [3], "draining: a new connection is told GOAWAY, "
              "then its last stream id, then closed (%r, EOF %s)" % (gone, eof))
        data = b"".join(pl for t, _, sid, pl in frames if t == 0 and sid == 1)
        r = api_pb2.HealthResponse.FromString(data[5:]) if len(data) > 5 else None
        check(r is not None and not r.ok and "draining" in r.status, "draining: Health on it answered %r" % (r,))
        data = b"".join(pl for t, _, sid, pl in frames if t == 0 and sid == 3)
        r = health_pb2.HealthCheckResponse.FromString(data[5:]) if len(data) > 5 else None
        check(r is not None and r.status == health_pb2.HealthCheckResponse.NOT_SERVING,
              "draining: grpc.health.v1 Check on it NOT_SERVING (%r)" % (r,))
        try:
            for _ in it:
                pass
            got = (SC.OK, "")
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == SC.UNAVAILABLE and "drain timeout" in got[1], "drain timeout: the call ends UNAVAILABLE %r" % (got,))
finally:
    code = srv.stop()
    check(code == 0, "drain server exit status %r" % code)

# ---- an idle server's drain: a Health.Watch hears NOT_SERVING before the connection goes ----
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "512"])
try:
    # first, a deadline counts from the request's headers: a request whose message comes without
    # END_STREAM (not complete) ends DEADLINE_EXCEEDED at its time all the same
    import hpack
    with socket.create_connection(("127.0.0.1", srv.proto_port), timeout=10) as s:
        msg = api_pb2.GenerateRequest(prompt="1 2", max_tokens=2).SerializeToString()
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0) + h2_frame(1, 4, 1, h2_headers(
            [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/mlaapi.MlaServe/Generate"),
             (b":authority", b"x"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
             (b"grpc-timeout", b"800m")])) + h2_frame(0, 0, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
        t0 = time.monotonic()
        frames = []
        h2_read(s, frames, lambda f: any(t == 1 and sid == 1 and fl & 1 for t, fl, sid, _ in f))
        took = time.monotonic() - t0
    dec = hpack.Decoder()
    hdrs = [dict((k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
                 for k, v in dec.decode(pl)) for t, _, sid, pl in frames if t == 1 and sid == 1]
    st = hdrs[-1].get("grpc-status") if hdrs else None
    check(st == "4" and 0.7 <= took < 3, "a request never completed ends DEADLINE_EXCEEDED at its grpc-timeout "
          "(status %r after %.2f s)" % (st, took))
    with grpc.insecure_channel("127.0.0.1:%d" % srv.proto_port) as ch:
        w = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        check(next(w).status == health_pb2.HealthCheckResponse.SERVING, "idle drain: Watch SERVING first")
        srv.proc.send_signal(signal.SIGTERM)
        try:
            got = next(w).status
        except grpc.RpcError as e:
            got = e.code()
        check(got == health_pb2.HealthCheckResponse.NOT_SERVING, "idle drain: the watcher hears NOT_SERVING (%r)" % (got,))
        try:  # the server closes with the Watch open: its trailers say why
            got = (SC.OK, "status %s" % next(w).status)
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == SC.UNAVAILABLE and "shutting down" in got[1], "idle drain: the Watch ends UNAVAILABLE "
              "when the server closes (%r)" % (got,))
    srv.proc.wait(timeout=60)
finally:
    code = srv.stop()
    check(code == 0, "idle drain server exit status %r" % code)

# ---- a failed group under --on-worker-failure exit drains gRPC as a signal does: a Health.Watch
# hears NOT_SERVING, a new Health says why (the worker's death), the connection gets a GOAWAY ----
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "512", "--on-worker-failure", "exit"])
try:
    wpid = [int(ln.rsplit("pid ", 1)[1]) for ln in srv.text().splitlines() if "started worker 0:" in ln]
    with grpc.insecure_channel("127.0.0.1:%d" % srv.proto_port) as ch:
        w = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=60)
        check(next(w).status == health_pb2.HealthCheckResponse.SERVING and len(wpid) == 1,
              "group failed: Watch SERVING first (worker pids %r)" % wpid)
        s = socket.create_connection(("127.0.0.1", srv.proto_port), timeout=20)
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0))
        frames = []
        h2_read(s, frames, lambda f: any(t == 4 and not fl & 1 for t, fl, _, _ in f))
        os.kill(wpid[0], signal.SIGKILL)
        try:
            got = next(w).status
        except grpc.RpcError as e:
            got = e.code()
        check(got == health_pb2.HealthCheckResponse.NOT_SERVING, "group failed: the watcher hears NOT_SERVING (%r)" % (got,))
        eof = h2_read(s, frames, lambda f: False)
        s.close()
        check(eof and any(t == 7 for t, _, _, _ in frames), "group failed: the connection was told GOAWAY")
    srv.proc.wait(60)
    check(srv.proc.returncode == 1 and "killed by signal 9" in srv.text(),
          "group failed: exit status 1 naming the worker's death (%r)" % srv.proc.returncode)
finally:
    srv.stop()

# ---- a drain waits for replies a slow client has not taken yet; GOAWAY tells clients first ----
srv = pb.Server(exe, worker, model, tp=1, extra=["--max-context", "512", "--drain-timeout", "30"])
try:
    s = socket.create_connection(("127.0.0.1", srv.proto_port), timeout=20)
    # stream windows of 0: the server can send the reply's headers, not its messages
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, struct.pack(">HI", 4, 0)))
    frames = []
    h2_read(s, frames, lambda f: any(t == 4 and not fl & 1 for t, fl, _, _ in f))
    msg = api_pb2.GenerateRequest(prompt="1 2", max_tokens=30, ignore_eos=True).SerializeToString()
    s.sendall(h2_frame(4, 1, 0) + h2_frame(1, 4, 1, h2_headers(
        [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/mlaapi.MlaServe/Generate"), (b":authority", b"x"),
         (b"content-type", b"application/grpc"), (b"te", b"trailers")])) +
        h2_frame(0, 1, 1, b"\x00" + struct.pack(">I", len(msg)) + msg))
    done = wait_for(lambda: metric(srv.port, "mlaserve_requests_total", finish_reason="length") >= 1, 60)
    check(done, "slow reader: the generation finished, its reply held back by the client's window")
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    check(srv.proc.poll() is None, "slow reader: the draining server waits for the held-back reply")
    s.sendall(h2_frame(8, 0, 1, struct.pack(">I", 1 << 20)))  # WINDOW_UPDATE: the client reads now
    eof = h2_read(s, frames, lambda f: False)
    s.close()
    data = sum(len(p) for t, _, sid, p in frames if t == 0 and sid == 1)
    trailers = any(t == 1 and sid == 1 and fl & 1 for t, fl, sid, _ in frames)
    check(eof and data >= 30 * 5 and trailers, "slow reader: its 30 token messages and the trailers arrived after "
          "the SIGTERM (%d bytes of messages, trailers %s)" % (data, trailers))
    check(any(t == 7 for t, _, _, _ in frames), "drain: the connection was told GOAWAY")
    srv.proc.wait(60)
    check(srv.proc.returncode == 0, "slow-reader drain: exit status %r" % srv.proc.returncode)
finally:
    srv.stop()
sys.exit(summary("grpc_api: "))
