"""Hardening tests of the HTTP front (issue 36) against the fake backend
(tests/serve/fake_server_main.c): large responses arrive whole, the API key is checked before
the body is read, request bodies are bounded over all connections, idle connections make room
for new ones, the header timeout, trailing data after the JSON body, HEAD, streaming to HTTP/1.0
clients, wrong-key attempts, that tokenizing a large prompt does not stall other clients, that
every response is counted by status class in /metrics, and probes answered past --max-conns.
Usage: test_harden.py FAKE_SERVER_EXE [PART...]. 127.0.0.1 only, free ports, bounded in time."""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pbapi"))
import fakeref as R  # noqa: E402
import pbutil as pb  # noqa: E402
from mlatest import FAILS, ServeProcess, check, http_request as request, http_status_line, summary  # noqa: E402,F401

EXE = sys.argv[1]
PARTS = set(sys.argv[2:])


def part(name):
    return not PARTS or name in PARTS


def connect(port, timeout=10):
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_all(s, limit_s=10):
    """Everything the server sends until it closes (or limit_s passes)."""
    out = b""
    end = time.time() + limit_s
    s.settimeout(0.5)
    while time.time() < end:
        try:
            d = s.recv(1 << 20)
        except socket.timeout:
            continue
        except ConnectionResetError:
            break
        if not d:
            break
        out += d
    return out


def split_response(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hd = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hd[k.strip().lower()] = v.strip()
    return lines[0], hd, body


def post_raw(port, path, body, headers=b"", version=b"HTTP/1.1"):
    s = connect(port)
    s.sendall(b"POST " + path + b" " + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n" + headers +
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    out = read_all(s, 30)
    s.close()
    return out


# ---------------------------------------------------------------- item 1: big responses
def test_big_response(exe):
    # /tokenize of a 1.6 MB prompt: ~6 MB of JSON, more than 4 x the 1 MiB write queue
    srv = R.Server(exe, "--max-body", 8 << 20)
    try:
        prompt = "x" * (1600 * 1000)
        body = json.dumps({"prompt": prompt, "add_special_tokens": False}).encode()
        raw = post_raw(srv.port, b"/tokenize", body)
        status, hd, data = split_response(raw)
        n = int(hd.get("content-length", "-1"))
        check(status.startswith("HTTP/1.1 200") and len(data) == n,
              "a %d-byte response arrives whole (got %d bytes)" % (n, len(data)))
        try:
            j = json.loads(data)
            check(j["count"] == len(prompt) and j["tokens"][:3] == [120, 120, 120], "big /tokenize answer is right")
        except ValueError:
            check(False, "big /tokenize answer is JSON")
        check("does not read" not in srv.logtext(), "no 'client does not read' in the log")
    finally:
        check(srv.stop() == 0, "big-response server clean exit")


# ---------------------------------------------------------------- responses counted by class
def test_response_counts(exe):
    """mlaserve_http_responses_total counts every status line sent: the HTTP layer's own refusals
    (413, 414, 431) beside the handler's (404, 400), and a stream when it begins (one the client
    leaves mid-way included)."""
    srv = R.Server(exe, "--max-body", 1000, "--step-delay-ms", 20)

    def counts():
        st, _, data = request(srv.port, "GET", "/metrics", json_type=False)
        out = {}
        for line in data.decode().splitlines():
            if line.startswith("mlaserve_http_responses_total{"):
                out[line.split('code="')[1][:3]] = int(float(line.rsplit(" ", 1)[1]))
        return out

    try:
        before = counts()
        sent = [split_response(post_raw(srv.port, b"/v1/completions", b'{"prompt": "' + b"a" * 2000 + b'"}'))[0],
                http_status_line(srv.port, b"GET /v1/models?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
                http_status_line(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 17000 + b"\r\nConnection: close\r\n\r\n"),
                http_status_line(srv.port, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
                split_response(post_raw(srv.port, b"/v1/completions", b"{bad json"))[0]]
        want = ["413", "414", "431", "404", "400"]
        check([x.split()[1].decode() if isinstance(x, bytes) else x.split()[1] for x in sent] == want,
              "the refusals sent: %s" % want, sent)
        # a stream the client leaves after its first bytes
        c = connect(srv.port)
        body = b'{"prompt": "hi", "max_tokens": 200, "stream": true, "ignore_eos": true}'
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        first = c.recv(64)
        c.close()
        check(first.startswith(b"HTTP/1.1 200"), "the stream began", first)
        after = counts()
        d = {k: after.get(k, 0) - before.get(k, 0) for k in ("2xx", "4xx", "5xx")}
        # 2xx: the stream and the first /metrics scrape (counted as it was sent)
        check(d == {"2xx": 2, "4xx": 5, "5xx": 0}, "every response counted by class", (before, after))
    finally:
        check(srv.stop() == 0, "response-count server clean exit")


# ---------------------------------------------------------------- probes past --max-conns
def test_probe_conns(exe):
    """Every place held by a generation: a probe's connection is still taken (up to --probe-conns
    more) and its /health and /metrics answered; anything else on it is a 503."""
    srv = R.Server(exe, "--max-conns", 2, "--probe-conns", 2, "--step-delay-ms", 50, "--max-seqs", 2)
    busy = []
    try:
        body = b'{"prompt": "hi", "max_tokens": 200, "stream": true, "ignore_eos": true}'
        for _ in range(2):
            c = connect(srv.port)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            check(c.recv(64).startswith(b"HTTP/1.1 200"), "a generation holds a place")
            busy.append(c)
        # /health and /metrics answered (GET and HEAD, their paths as the router reads them: a
        # query, a trailing slash, an absolute URL, a fragment), anything else a 503
        cases = [(b"GET /health", b"200"), (b"GET /metrics?x=1", b"200"), (b"GET /v1/models", b"503"),
                 (b"HEAD /health/", b"200"), (b"GET http://x/metrics#a", b"200"), (b"POST /health", b"503")]
        got = [http_status_line(srv.port, line + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close"
                                               b"\r\n\r\n")[9:12] for line, _ in cases]
        check(got == [w for _, w in cases], "full: the probe paths answered, the rest 503", list(zip(cases, got)))
        # a keep-alive probe connection: its next request is held to the same paths while the server
        # is full, and is an ordinary one once a place is free
        c = connect(srv.port)
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        out = read_all(c, 10)
        c.close()
        check(out.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 503" in out and b"too many open connections" in out,
              "a probe connection's next request: the same rule", out[:300])
        p = connect(srv.port)
        p.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = p.recv(4096)
        for b in busy:
            b.close()
        busy = []
        time.sleep(0.5)
        p.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = read_all(p, 10)
        p.close()
        check(first.startswith(b"HTTP/1.1 200") and out.startswith(b"HTTP/1.1 200"),
              "a probe connection once places are free: served", out[:200])
    finally:
        for c in busy:
            c.close()
        check(srv.stop() == 0, "probe-conns server clean exit")


# ---------------------------------------------------------------- item 3: early key check, budget, idle
def test_early_auth_and_budget(exe):
    srv = R.Server(exe, "--api-key", "sekrit", "--max-body", 4 << 20, "--max-body-total", 1 << 20,
                   "--request-timeout-ms", 8000, "--header-timeout-ms", 600, "--max-conns", 8,
                   "--idle-timeout-ms", 30000)
    port = srv.port
    try:
        # headers announce 4 MB, no body: refused at once, before any body byte
        s = connect(port)
        t0 = time.time()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 401") and time.time() - t0 < 3,
              "no key: 401 before the body (%.1fs): %r" % (time.time() - t0, out[:40]))
        s = connect(port)
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 4000000\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 401"), "wrong key: 401 before the body: %r" % out[:40])
        # with the key: bodies are buffered, up to 1 MiB over all connections
        held = []
        refused = 0
        for i in range(4):
            s = connect(port)
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                      b"Content-Length: 500000\r\n\r\n" + b"{\"prompt\":\"" + b"a" * 399000)
            held.append(s)
            time.sleep(0.3)
        for s in held:
            s.settimeout(0.3)
            try:
                d = s.recv(100)
            except socket.timeout:
                d = b""
            if d.startswith(b"HTTP/1.1 503"):
                refused += 1
        check(1 <= refused <= 2, "bodies over the total budget get 503 (%d of 4 refused)" % refused)
        for s in held:
            s.close()
        time.sleep(0.3)
        st, _, data = request(port, "POST", "/tokenize", {"prompt": "ab"}, headers={"Authorization": "Bearer sekrit"})
        check(st == 200, "served after the held bodies are gone (%d)" % st)
        # header timeout: an unfinished header block gets 408 after 0.6 s, not the 8 s request timeout
        s = connect(port)
        t0 = time.time()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        out = read_all(s, 6)
        s.close()
        check(out.startswith(b"HTTP/1.1 408") and time.time() - t0 < 3,
              "header timeout 408 in %.1fs: %r" % (time.time() - t0, out[:40]))
        # max connections 8: idle connections make room for a new client
        idle = [connect(port) for _ in range(8)]
        time.sleep(0.3)
        st, _, _ = request(port, "GET", "/health", timeout=5)
        check(st == 200, "9th client served while 8 idle connections are open (%d)" % st)
        for s in idle:
            s.close()
        time.sleep(0.3)
        # ... but busy connections (requests in progress) are kept: then 503
        busy = []
        for _ in range(8):
            s = connect(port)
            s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\nContent-Length: 100\r\n\r\n{")
            busy.append(s)
        time.sleep(0.3)
        s = connect(port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 503"), "all connections busy -> 503: %r" % out[:40])
        for s in busy:
            s.close()
    finally:
        check(srv.stop() == 0, "early-auth server clean exit")


# ---------------------------------------------------------------- item 8: HTTP details
def test_http_details(exe):
    srv = R.Server(exe, "--step-delay-ms", 1)
    port = srv.port
    try:
        for body in (b'{"prompt":"ab"} xyz', b'{"prompt":"ab"}{"prompt":"cd"}', b'{"prompt":"ab"}\x00junk'):
            status, _, data = split_response(post_raw(port, b"/tokenize", body))
            check(status.startswith("HTTP/1.1 400") and b"after its JSON value" in data,
                  "trailing data after the JSON body -> 400: %r %r" % (body, data[:120]))
        status, _, data = split_response(post_raw(port, b"/tokenize", b'{"prompt":"ab"}  \r\n'))
        check(status.startswith("HTTP/1.1 200"), "trailing whitespace is fine")
        # HEAD: GET's headers, no body
        s = connect(port)
        s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 200") and out.count(b"HTTP/1.1 200") == 2 and out.count(b'{"status":"ok"}') == 1,
              "HEAD /health: 200 without a body, then GET on the same connection: %r" % out[:300])
        hd = split_response(out)[1]
        check(hd.get("content-length") == "15", "HEAD carries GET's Content-Length")
        st, hd, data = request(port, "HEAD", "/v1/models")
        check(st == 200 and data == b"" and int(hd.get("Content-Length", "0")) > 0, "HEAD /v1/models")
        st, hd, _ = request(port, "PUT", "/health", body=b"")
        check(st == 405 and "HEAD" in hd.get("Allow", ""), "405 names GET, HEAD: %r" % hd.get("Allow"))
        # a streamed answer to an HTTP/1.0 client: no chunked encoding, ends with the connection
        raw = post_raw(port, b"/v1/completions", json.dumps({"prompt": "ab", "max_tokens": 5, "stream": True}).encode(),
                       version=b"HTTP/1.0")
        status, hd, body = split_response(raw)
        check(status.startswith("HTTP/1.1 200") and "transfer-encoding" not in hd and hd.get("connection") == "close",
              "HTTP/1.0 stream: no chunked encoding: %r" % raw[:200])
        check(body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n"), "HTTP/1.0 stream body is plain SSE: %r" % body[-60:])
        toks, _, _, _ = R.generate(R.encode("ab"), 5)
        text = "".join(json.loads(b[6:])["choices"][0]["text"] for b in body.decode().split("\n\n")
                       if b.startswith("data: {"))
        check(text == R.text_of(toks), "HTTP/1.0 stream text")
    finally:
        check(srv.stop() == 0, "details server clean exit")


def test_wrong_keys(exe):
    srv = R.Server(exe, "--api-key", "sekrit")
    port = srv.port
    try:
        # a wrong key closes the connection: no fast guessing on one connection
        s = connect(port)
        req = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guess\r\n\r\n"
        s.sendall(req * 50)
        out = read_all(s, 5)
        s.close()
        check(out.count(b"HTTP/1.1 401") == 1, "one 401 per connection, then it closes (%d)" % out.count(b"HTTP/1.1 401"))
        # requests with no key at all get 401 and do not count towards the lockout
        codes = [request(port, "GET", "/v1/models")[0] for _ in range(12)]
        check(codes == [401] * 12, "no key: 401 every time, no lockout: %r" % codes)
        # after 10 failures from this address within 10 s: 429 even with the right key
        codes = []
        for i in range(11):
            st, hd, _ = request(port, "GET", "/v1/models", headers={"Authorization": "Bearer guess%d" % i})
            codes.append(st)
        check(codes[:9] == [401] * 9 and codes[9:] == [429, 429], "wrong keys: 401 x9 then 429: %r" % codes)
        st, hd, data = request(port, "GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        check(st == 429 and int(hd.get("Retry-After", "0")) >= 1, "blocked address: 429 with Retry-After (%d)" % st)
        st, _, _ = request(port, "GET", "/health")
        check(st == 200, "/health needs no key and is not blocked")
        time.sleep(10.5)
        st, _, _ = request(port, "GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        check(st == 200, "the right key works again after the window (%d)" % st)
        # whitespace after a field value is not part of it (RFC 9110 5.5): the key still matches
        s = connect(port)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit \t\r\nConnection: close\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 200"), "a key followed by whitespace is the key: %r" % out[:120])
    finally:
        check(srv.stop() == 0, "wrong-keys server clean exit")


def test_cors(exe):
    """--cors-origins: an allowed Origin gets Access-Control-Allow-Origin (and Vary) on every answer,
    a 401 included; its preflight is a 204 without a key; another origin, or a server without the
    flag, gets no CORS header and its OPTIONS is refused as before; an over-long list of header
    names is not echoed (control bytes never reach it: the parser refuses them)."""
    ui, other = "https://ui.example:8443", "https://evil.example"
    srv = R.Server(exe, "--api-key", "sekrit", "--cors-origins", "http://a.example, " + ui)  # a space after the comma
    port = srv.port
    key = {"Authorization": "Bearer sekrit"}
    try:
        st, hd, _ = request(port, "GET", "/v1/models", headers=dict(key, Origin=ui))
        check(st == 200 and hd.get("Access-Control-Allow-Origin") == ui and hd.get("Vary") == "Origin",
              "allowed origin: ACAO %s (%d)" % (hd.get("Access-Control-Allow-Origin"), st))
        st, hd, _ = request(port, "GET", "/v1/models", headers={"Origin": ui.upper().replace("HTTPS", "https")})
        check(st == 401 and hd.get("Access-Control-Allow-Origin"), "a 401 carries it too, origin without case (%d)" % st)
        st, hd, body = request(port, "GET", "/v1/models", headers=dict(key, Origin=other))
        check(st == 403 and "Access-Control-Allow-Origin" not in hd and b"origin_not_allowed" in body,
              "another origin: 403, no ACAO (%d)" % st)
        # a page's simple POST (text/plain, no preflight) from another origin runs nothing
        st, hd, body = request(port, "POST", "/v1/completions", body='{"prompt": "hi", "max_tokens": 2}',
                               headers=dict(key, Origin=other, **{"Content-Type": "text/plain;charset=UTF-8"}))
        check(st == 403 and b"--cors-origins" in body, "a simple POST from another origin: 403 (%d)" % st)
        pre = {"Origin": ui, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
        st, hd, data = request(port, "OPTIONS", "/v1/chat/completions", headers=pre, json_type=False)
        check(st == 204 and hd.get("Access-Control-Allow-Origin") == ui and
              "POST" in hd.get("Access-Control-Allow-Methods", "") and
              hd.get("Access-Control-Allow-Headers") == pre["Access-Control-Request-Headers"] and
              hd.get("Access-Control-Max-Age") == "600" and data == b"",
              "preflight: 204 without a key (%d %r)" % (st, hd))
        st, hd, _ = request(port, "OPTIONS", "/v1/chat/completions", headers=dict(pre, Origin=other), json_type=False)
        check(st == 403 and "Access-Control-Allow-Origin" not in hd, "preflight from another origin: %d" % st)
        # a preflight and a request on one connection, then a streamed answer with the header
        s = connect(port)
        s.sendall(b"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: " + ui.encode() +
                  b"\r\nAccess-Control-Request-Headers: " + b"x-a," * 100 + b"\r\n\r\n"
                  b"GET /health HTTP/1.1\r\nHost: x\r\nOrigin: " + ui.encode() + b"\r\nConnection: close\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 204") and b"Access-Control-Allow-Headers: Authorization, Content-Type\r\n" in out
              and out.count(b"Access-Control-Allow-Origin: " + ui.encode()) == 2 and b"HTTP/1.1 200" in out,
              "pipelined preflight + request; an over-long header list is not echoed: %r" % out[:400])
        st, hd, body = request(port, "POST", "/v1/completions", {"prompt": "ab", "max_tokens": 2, "stream": True},
                               headers=dict(key, Origin=ui))
        check(st == 200 and hd.get("Access-Control-Allow-Origin") == ui and b"[DONE]" in body, "streamed: ACAO %d %r %r" % (st, hd, body[-200:]))
        # the answers of the request parser itself (limits, refused encodings) carry it as well
        o = b"Origin: " + ui.encode() + b"\r\nAuthorization: Bearer sekrit\r\n"
        for want, raw in ((413, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + o + b"Content-Length: 99000000\r\n\r\n"),
                          (411, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + o + b"\r\n"),
                          (415, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + o +
                           b"Content-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}"),
                          (501, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + o + b"Transfer-Encoding: gzip\r\n\r\n")):
            s = connect(port)
            s.sendall(raw)
            out = read_all(s, 5)
            s.close()
            check(out.startswith(b"HTTP/1.1 %d" % want) and b"\r\nAccess-Control-Allow-Origin: " + ui.encode() + b"\r\n" in out
                  and b'"error"' in out, "the parser's %d carries the CORS header: %r" % (want, out[:300]))
            if want == 415:
                check(b'"code":"content_encoding_not_supported"' in out, "415: its own code: %r" % out[-200:])
        s = connect(port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: " + other.encode() + b"\r\n\r\n")
        out = read_all(s, 5)
        s.close()
        check(out.startswith(b"HTTP/1.1 411") and b"Access-Control-Allow-Origin" not in out,
              "the parser's answer to another origin has none: %r" % out[:200])
    finally:
        check(srv.stop() == 0, "cors server clean exit")
    srv = R.Server(exe)
    try:
        st, hd, _ = request(srv.port, "GET", "/v1/models")
        check(st == 200 and "Access-Control-Allow-Origin" not in hd, "no --cors-origins: no CORS headers")
        st, hd, _ = request(srv.port, "GET", "/v1/models", headers={"Origin": ui})
        check(st == 403 and "Access-Control-Allow-Origin" not in hd, "no --cors-origins: a page's request is refused")
        st, hd, _ = request(srv.port, "OPTIONS", "/v1/models", headers={"Origin": ui}, json_type=False)
        check(st == 403, "no --cors-origins: OPTIONS is refused (%d)" % st)
    finally:
        check(srv.stop() == 0, "plain server clean exit")
    srv = R.Server(exe, "--cors-origins", "*")
    try:
        st, hd, _ = request(srv.port, "GET", "/v1/models", headers={"Origin": other})
        check(st == 200 and hd.get("Access-Control-Allow-Origin") == "*" and "Vary" not in hd, "'*': any origin")
    finally:
        check(srv.stop() == 0, "any-origin server clean exit")


# ---------------------------------------------------------------- item 7: tokenizing off the loop
def test_tokenize_off_loop(exe):
    # the fake tokenizer sleeps --tok-delay-ms per call: the loop must keep serving meanwhile
    srv = R.Server(exe, "--tok-delay-ms", 2000)
    port = srv.port
    try:
        res = {}

        def slow():
            res["tok"] = request(port, "POST", "/tokenize", {"prompt": "abc"}, timeout=30)

        th = threading.Thread(target=slow)
        th.start()
        time.sleep(0.3)
        t0 = time.time()
        st, _, _ = request(port, "GET", "/health", timeout=10)
        dt = time.time() - t0
        check(st == 200 and dt < 0.5, "/health answered in %.2fs while a prompt is tokenized" % dt)
        th.join(30)
        st, _, data = res.get("tok", (0, None, b""))
        check(st == 200 and json.loads(data)["tokens"] == R.encode("abc"), "the slow /tokenize answers right")
        # pipelined requests on one connection keep their order
        s = connect(port)
        body = b'{"prompt":"xy","max_tokens":2}'
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body) +
                  b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = read_all(s, 20)
        s.close()
        i1, i2 = out.find(b"text_completion"), out.find(b'"status":"ok"')
        check(0 < i1 < i2, "pipelined answers in order")
        # a client that leaves while its prompt is tokenized: nothing leaks, the server goes on
        s = connect(port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.2)
        s.close()
        time.sleep(2.5)
        st, _, _ = request(port, "GET", "/health", timeout=10)
        check(st == 200, "served after a client left during tokenizing")
        st, _, data = request(port, "GET", "/metrics", timeout=10)
        check(st == 200 and b'finish_reason="cancelled"} 1\n' in data, "the request left in tokenizing counts as cancelled",
              [ln for ln in data.decode(errors="replace").splitlines() if "cancelled" in ln])
    finally:
        check(srv.stop() == 0, "tokenize server clean exit")


def test_pb_off_loop(exe):
    # the gRPC port: a Generate's prompt is made off the loop thread too
    api_pb2, api_grpc, grpc = pb.stubs()
    srv = ServeProcess([exe], ["--tok-delay-ms", 1500], proto=True, timeout=20, prefix="fake_server_pb_")
    try:
        chan = grpc.insecure_channel("127.0.0.1:%d" % srv.proto_port)
        stub = api_grpc.MlaServeStub(chan)
        call = stub.Generate(api_pb2.GenerateRequest(prompt="abc", max_tokens=3), timeout=30)
        time.sleep(0.3)
        t0 = time.time()
        st, _, _ = request(srv.port, "GET", "/health", timeout=10)
        dt = time.time() - t0
        check(st == 200 and dt < 0.5, "/health answered in %.2fs while a gRPC prompt is tokenized" % dt)
        toks, _, _, _ = R.generate(R.encode("abc"), 3)
        text = "".join(r.text for r in call)
        check(text == R.text_of(toks), "the gRPC Generate answers right: %r" % text)
        # cancelled (Cancel by request_id) while its prompt is made: CANCELLED
        call = stub.Generate(api_pb2.GenerateRequest(request_id=2, prompt="abc", max_tokens=3), timeout=30)
        time.sleep(0.2)
        stub.Cancel(api_pb2.CancelRequest(request_id=2), timeout=10)
        try:
            list(call)
            check(False, "cancelled while tokenizing: no error")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.CANCELLED, "cancelled while tokenizing: %s" % e.code())
        # refused after tokenizing (longer than the context): INVALID_ARGUMENT
        try:
            list(stub.Generate(api_pb2.GenerateRequest(prompt="x" * 3000, max_tokens=3), timeout=30))
            check(False, "refused after tokenizing: no error")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "refused after tokenizing: %s" % e.code())
        # a call reset while its prompt is made: nothing breaks
        call = stub.Generate(api_pb2.GenerateRequest(prompt="abc", max_tokens=3), timeout=30)
        time.sleep(0.2)
        call.cancel()
        toks, _, _, _ = R.generate(R.encode("xyz"), 2)
        text = "".join(r.text for r in stub.Generate(api_pb2.GenerateRequest(prompt="xyz", max_tokens=2), timeout=30))
        check(text == R.text_of(toks), "served after a call left during tokenizing: %r" % text)
        # Tokenize goes the same way
        fut = stub.Tokenize.future(api_pb2.TokenizeRequest(text="abc"), timeout=30)
        time.sleep(0.3)
        t0 = time.time()
        st, _, _ = request(srv.port, "GET", "/health", timeout=10)
        dt = time.time() - t0
        check(st == 200 and dt < 0.5, "/health answered in %.2fs while a gRPC Tokenize runs" % dt)
        check(list(fut.result().ids) == R.encode("abc"), "the gRPC Tokenize answers right")
        chan.close()
    finally:
        check(srv.stop(timeout=30) == 0, "gRPC tokenize server clean exit")


def test_pb_cancel_queued(exe):
    # Cancel(request_id) ends the call it names at once, queued behind a running step or not: the
    # scheduler's own final event for it comes only after that step (3 s here)
    api_pb2, api_grpc, grpc = pb.stubs()
    srv = ServeProcess([exe], ["--step-delay-ms", 3000, "--max-seqs", 1], proto=True, timeout=20,
                       prefix="fake_server_pbc_")
    try:
        chan = grpc.insecure_channel("127.0.0.1:%d" % srv.proto_port)
        stub = api_grpc.MlaServeStub(chan)
        first = stub.Generate(api_pb2.GenerateRequest(prompt="abc", max_tokens=2), timeout=60)
        time.sleep(0.5)
        queued = stub.Generate(api_pb2.GenerateRequest(request_id=5, prompt="xyz", max_tokens=2), timeout=60)
        time.sleep(0.5)
        t0 = time.time()
        stub.Cancel(api_pb2.CancelRequest(request_id=5), timeout=10)
        try:
            list(queued)
            check(False, "a queued call cancelled: no error")
        except grpc.RpcError as e:
            dt = time.time() - t0
            check(e.code() == grpc.StatusCode.CANCELLED and dt < 1.5,
                  "a queued call cancelled: %s after %.2fs (a step takes 3 s)" % (e.code(), dt))
        toks, _, _, _ = R.generate(R.encode("abc"), 2)
        check("".join(r.text for r in first) == R.text_of(toks), "the running call finished beside it")
        chan.close()
    finally:
        check(srv.stop(timeout=30) == 0, "gRPC cancel server clean exit")


def main():
    for name, t in (("big", test_big_response), ("counts", test_response_counts), ("probes", test_probe_conns),
                    ("auth", test_early_auth_and_budget), ("details", test_http_details),
                    ("keys", test_wrong_keys), ("cors", test_cors), ("offloop", test_tokenize_off_loop), ("pboffloop", test_pb_off_loop),
                    ("pbcancel", test_pb_cancel_queued)):
        if not part(name):
            continue
        t0 = time.time()
        t(EXE)
        print("%-28s %.2fs" % (t.__name__, time.time() - t0), flush=True)
    sys.exit(summary())


if __name__ == "__main__":
    main()
