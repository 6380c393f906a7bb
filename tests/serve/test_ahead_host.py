"""The workers' step ahead with rows sampled on the host (worker/wk_ahead.h) through `mlaserve
serve` on the tiny-deepseek3 fixture (CPU workers, whose engine takes greedy rows itself and so
runs a step ahead after each step).

The same requests, sent all at once and streamed, to a server with `--step-ahead off` and to one
with the step ahead on (the default; sync on this backend): greedy rows beside temperature-1
seeded rows, json_schema rows (greedy and seeded), logit_bias, repetition and presence penalties,
logprobs. Every streamed answer (its text, its finish reason, and where asked its tokens' logprobs:
on CUDA within 1e-3, since a row's logits there follow the batch it shares a step with) must be the
same on both servers; the worker with the step ahead must report rows that a plan took
from it while every batch held host-sampled rows, the one without none. Then one client's
requests one after another, each ending by its length: every row run ahead is taken (none follows a
request's last token).
Usage: test_ahead_host.py SERVE_EXE WORKER_EXE FIXTURES_DIR|MODEL.gguf [TP [BACKEND]]: SERVE_EXE is
`mlaserve` (its `serve` command) or a program that serves (mlaserve_serve_test); BACKEND (cpu) goes
to `--backend` (cuda on a GPU host: the same answers from the CUDA engine's step ahead, queued or
run; and a third server that samples every row that is not greedy on the host, whose texts must
be those of the device's sampler). Exit 77 when the fixture is missing."""
import json
import os
import re
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import ServeProcess, check, http_post as post, summary  # noqa: E402

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
tp = sys.argv[4] if len(sys.argv) > 4 else "1"
backend = sys.argv[5] if len(sys.argv) > 5 else None
cmd = [exe, "serve"] if os.path.basename(exe) == "mlaserve" else [exe]
model = fixtures if fixtures.endswith(".gguf") else os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
if not os.path.exists(model):
    print("fixture missing: skipped")
    sys.exit(77)

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "n", "tags"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}
PROMPTS = ["Give me a record.", "The quick brown fox", "Once upon a time", "JSON please:"]


def reqs():
    out = []
    for i, pr in enumerate(PROMPTS):
        out.append(("/v1/completions", {"prompt": pr, "max_tokens": 20, "temperature": 0}))
        out.append(("/v1/completions", {"prompt": pr, "max_tokens": 20, "temperature": 1.0, "seed": 11 + i,
                                        "logprobs": 2}))
        out.append(("/v1/completions", {"prompt": pr, "max_tokens": 20, "temperature": 0.8, "top_p": 0.9,
                                        "seed": 3 + i, "repetition_penalty": 1.3, "presence_penalty": 0.5}))
    for i, pr in enumerate(PROMPTS[:3]):
        samp = {"temperature": 0} if i == 0 else {"temperature": 1.0, "seed": 21 + i}
        out.append(("/v1/chat/completions", dict({"messages": [{"role": "user", "content": pr}],
                                                  "response_format": RF, "max_tokens": 60}, **samp)))
        out.append(("/v1/completions", dict({"prompt": pr, "response_format": RF, "max_tokens": 60}, **samp)))
    out.append(("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0,
                                    "logit_bias": {"5": 3.0, "17": -100}}))
    out.append(("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0.7, "seed": 9,
                                    "logit_bias": {"9": 2.5}}))
    return out


def stream(port, path, body):
    """The streamed answer: (status, text, finish reason, logprobs of each token or None)."""
    st, data = post(port, path, dict(body, stream=True), timeout=600)
    if st != 200:
        return st, data[:300], None, None
    text, fin, lps = [], None, []
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for c in ev.get("choices", []):
            text.append(c["delta"].get("content") or "" if "delta" in c else c.get("text", ""))
            fin = c.get("finish_reason") or fin
            lp = c.get("logprobs")
            if lp and lp.get("token_logprobs"):
                lps += lp["token_logprobs"]
    return st, "".join(text), fin, lps or None


def run_all(port, rs):
    out = {}

    def go(i):
        out[i] = stream(port, rs[i][0], rs[i][1])
    ths = [threading.Thread(target=go, args=(i,)) for i in range(len(rs))]
    [t.start() for t in ths]
    [t.join(900) for t in ths]
    return out


def ahead_stats(log):
    """(rows run ahead, rows taken, host rows taken) summed over the workers' exit lines, or None."""
    m = re.findall(r"step ahead: (\d+) rows run ahead, (\d+) of them taken by a plan \((\d+) sampled on the host\)",
                   log)
    return tuple(sum(int(x[k]) for x in m) for k in range(3)) if m else None


rs = reqs()
common = ["--max-context", "1024", "--max-seqs", "64", "--tp", tp] + (["--backend", backend] if backend else [])
res, stats = {}, {}
# on CUDA the first two servers sample the rows that are not greedy on the device
# (worker/engine.h dev_sample), a third on the host (MLA_WORKER_HOST_SAMPLE=1), and every text must
# be the same (the device's sampler takes the host sampler's token, up to rounding at a boundary)
modes = ("off", "queue", "queue-host") if backend == "cuda" else ("off", "queue")
for mode in modes:
    srv = ServeProcess(cmd + ["-m", model, "--port", "0"], common + ["--step-ahead", mode.split("-")[0]],
                       worker=worker, env={"MLA_WORKER_HOST_SAMPLE": "1" if mode.endswith("host") else "0"},
                       timeout=120, prefix="ahead_host_%s_" % mode)
    try:
        res[mode] = run_all(srv.port, rs)
    finally:
        srv.stop()
    stats[mode] = ahead_stats(srv.text())
    print("--step-ahead %s: step ahead rows (run, taken, host rows taken): %s" % (mode, stats[mode]))

for i, (path, body) in enumerate(rs):
    a, b = res["off"].get(i), res["queue"].get(i)
    check(a is not None and a[0] == 200, "request %d without the step ahead: %r" % (i, a))
    check(b is not None and b[0] == 200, "request %d with the step ahead: %r" % (i, b))
    if a and b and a[0] == 200 and b[0] == 200:
        # CUDA: a row's logits depend on the rows that share its step (the GEMV's tiles and splits
        # follow the batch size), and which rows share a step depends on timing in either mode, so
        # logprobs agree to 1e-3 there; the text, chosen from them, must be the same
        same = a[1:3] == b[1:3] and (a[3] == b[3] if backend in (None, "cpu") else
                                     (a[3] is None) == (b[3] is None) and len(a[3] or []) == len(b[3] or []) and
                                     all(abs(x - y) <= 1e-3 for x, y in zip(a[3] or [], b[3] or [])))
        check(same, "request %d (%s) is the same with the step ahead: %r vs %r" % (i, json.dumps(body)[:120],
                                                                                 a[1:], b[1:]))
        if "logprobs" in body:
            check(a[3] is not None and len(a[3]) > 0, "request %d streamed its logprobs" % i)
for i, (path, body) in enumerate(rs):
    a, b = res["queue"].get(i), res.get("queue-host", {}).get(i)
    if b is not None and a and a[0] == 200 and b[0] == 200:
        check(a[1:3] == b[1:3], "request %d (%s): the device's sampling gives the host's text: %r vs %r" %
              (i, json.dumps(body)[:120], a[1:3], b[1:3]))
# one client's requests, one after another, each ending by its length: the scheduler marks each
# one's last row (SeqPlan.last) and no step ahead follows it, so every row run ahead is taken
srv = ServeProcess(cmd + ["-m", model, "--port", "0"], common + ["--step-ahead", "queue"], worker=worker,
                   timeout=120, prefix="ahead_last_")
try:
    for pr in PROMPTS:
        st, data = post(srv.port, "/v1/completions", {"prompt": pr, "max_tokens": 8, "temperature": 0,
                                                      "ignore_eos": True})
        check(st == 200 and json.loads(data)["choices"][0]["finish_reason"] == "length", "%r: 8 tokens" % pr, data[:200])
finally:
    srv.stop()
one = ahead_stats(srv.text())
check(one is not None and one[0] == one[1] == 6 * len(PROMPTS) * int(tp),
      "one client: the step ahead of every decode step but each request's last, all taken: %r" % (one,))
check(stats["off"] is None or stats["off"][0] == 0, "no step ahead with --step-ahead off: %r" % (stats["off"],))
check(stats["queue"] is not None and stats["queue"][2] > 0,
      "host-sampled rows of the step ahead were taken: %r" % (stats["queue"],))
sys.exit(summary("ahead_host: "))
