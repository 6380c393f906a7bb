"""Completions with `echo` (coordinator/api_server.c add_echo, sched_batch.c prompt logprobs,
worker/wk_step.c prompt_logprobs) on the fixtures, against their Hugging Face reference: the
logprob of every prompt token after the first equals the log-softmax of HF's logits
(ref_logits.f32) at the position before it, with the RoPE frequencies rounded to bf16 as HF
computed them (MLA_ROPE_FREQ_BF16). Prompts are cut into steps of 16 tokens (the token after each
step's last travels with it), a cached prefix is not used for them, and the answer's text, its
stream and its stop strings start after the prompt.
Usage: test_echo.py SERVE_EXE WORKER_EXE FIXTURES_DIR FIXTURE TP. Exit 77 when the fixture is
missing. Env: ECHO_BACKEND (default cpu; cuda to check that backend) and ECHO_TOL (default 1e-4, the CPU
forward pass's bound) for the same checks of another backend."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import FAILS, ServeProcess, check, http_post as post, summary  # noqa: E402

exe, worker, fixtures, name, tp = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
fx = os.path.join(fixtures, name)
model = os.path.join(fx, name + "-bf16.gguf")
if not os.path.exists(model):
    print("fixture missing: skipped")
    sys.exit(77)
ref = json.load(open(os.path.join(fx, "ref.json")))
V = 2048
allref = np.fromfile(os.path.join(fx, "ref_logits.f32"), dtype="<f4")
TOL = float(os.environ.get("ECHO_TOL", "1e-4"))  # CPU, measured: at most 1.2e-5 on both fixtures, TP 1 and 2
BACKEND = os.environ.get("ECHO_BACKEND", "cpu")


def hf_logprobs(p):
    n = len(p["tokens"])
    z = allref[p["logits_offset"]:p["logits_offset"] + n * V].reshape(n, V).astype(np.float64)
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


# the CPU backend unless ECHO_BACKEND names another (a CUDA build would pick its GPU)
srv = ServeProcess([exe, "-m", model, "--tp", str(tp), "--port", "0"],
                   ["--max-context", "512", "--max-seqs", "8", "--max-prefill-tokens", "16", "--backend", BACKEND],
                   worker=worker,
                   env={"MLA_ROPE_FREQ_BF16": "1"}, timeout=120, prefix="serve_echo_", fail_tail=None)
try:
    port = srv.port
    prompts = sorted(ref["prompts"], key=lambda p: -len(p["tokens"]))
    # the longest prompt first without echo, so that its blocks are in the prefix cache
    st, _ = post(port, "/v1/completions", {"prompt": prompts[0]["tokens"], "max_tokens": 1, "temperature": 0})
    check(st == 200, "the longest prompt, cached")
    for p in prompts:
        toks, n = p["tokens"], len(p["tokens"])
        st, data = post(port, "/v1/completions", {"prompt": toks, "max_tokens": 1, "temperature": 0,
                                                  "echo": True, "logprobs": 5})
        check(st == 200, "echo with logprobs, %d tokens: %d %r" % (n, st, data[:200]))
        if st != 200:
            continue
        c = json.loads(data)["choices"][0]
        lp = c["logprobs"]
        hf = hf_logprobs(p)
        check(len(lp["tokens"]) == n + 1 and len(lp["token_logprobs"]) == n + 1 and len(lp["text_offset"]) == n + 1,
              "%d tokens: one entry a prompt token and one generated" % n, len(lp["tokens"]))
        check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and lp["text_offset"][0] == 0,
              "the first prompt token has no logprob")
        got = np.array(lp["token_logprobs"][1:n], dtype=np.float64)
        want = np.array([hf[j, toks[j + 1]] for j in range(n - 1)])
        d = float(np.abs(got - want).max()) if n > 1 else 0.0
        check(d < TOL, "%d tokens: prompt logprobs within %g of HF (max %.2e)" % (n, TOL, d))
        # each position's alternatives: HF's most likely token and its logprob, and the prompt's own
        worst, missing = 0.0, []
        for j in range(n - 1):
            top = lp["top_logprobs"][j + 1] or {}
            worst = max(worst, abs(max(top.values(), default=0.0) - hf[j].max()))
            if len(top) < 4 or not any(abs(v - got[j]) < 1e-6 for v in top.values()):
                missing.append((j + 1, top))
        check(not missing, "%d tokens: 5 alternatives and the prompt token a position" % n, missing[:2])
        check(worst < TOL, "%d tokens: the most likely alternative within %g of HF (max %.2e)" % (n, TOL, worst))
        exp_id, exp_lp = p["last_top5"][0]
        check(abs(lp["token_logprobs"][n] - exp_lp) < 1e-3, "the generated token's logprob", lp["token_logprobs"][n])
        offs = lp["text_offset"]
        check(all(offs[i] <= offs[i + 1] for i in range(n)) and c["text"].startswith(c["text"][:offs[n]]),
              "text offsets grow through the prompt into the answer")
    # the answer's first token a stop token (stop_token_ids): still listed, without text, so that
    # the last entry is the generated one (lm-evaluation-harness reads token_logprobs[ctxlen:-1])
    p = ref["prompts"][0]
    n, g = len(p["tokens"]), p["greedy"][0]
    st, data = post(port, "/v1/completions", {"prompt": p["tokens"], "max_tokens": 1, "temperature": 0, "echo": True,
                                              "logprobs": 1, "stop_token_ids": [g]})
    c = json.loads(data)["choices"][0] if st == 200 else {}
    lp = c.get("logprobs") or {}
    check(st == 200 and c.get("finish_reason") == "stop" and len(lp.get("tokens", [])) == n + 1
          and lp["text_offset"][n] == len(c["text"]) and abs(lp["token_logprobs"][n] - p["last_top5"][0][1]) < 1e-3,
          "a stop token ends it: listed last, without text", (st, c.get("finish_reason"), len(lp.get("tokens", []))))
    # max_tokens 0: the prompt and its logprobs alone (OpenAI's way of scoring a text), streamed the same
    p = ref["prompts"][1]
    n = len(p["tokens"])
    body = {"prompt": p["tokens"], "max_tokens": 0, "temperature": 0, "echo": True, "logprobs": 0}
    st, data = post(port, "/v1/completions", body)
    j = json.loads(data) if st == 200 else {}
    c = j.get("choices", [{}])[0]
    lp = c.get("logprobs") or {}
    want = hf_logprobs(p)
    check(st == 200 and len(lp.get("tokens", [])) == n and c.get("finish_reason") == "length"
          and j["usage"]["completion_tokens"] == 0 and j["usage"]["prompt_tokens"] == n
          and max(abs(lp["token_logprobs"][k] - want[k - 1, p["tokens"][k]]) for k in range(1, n)) < TOL,
          "max_tokens 0 with echo: the prompt alone, its logprobs", (st, data[:300]))
    # every prompt whole, those whose last token has no text (a chat prompt's special tokens) too
    short = [(len(q["tokens"]), len((json.loads(d)["choices"][0]["logprobs"] or {}).get("tokens", [])) if s_ == 200 else s_)
             for q in ref["prompts"]
             for s_, d in [post(port, "/v1/completions", dict(body, prompt=q["tokens"]))]]
    check(all(a == b for a, b in short), "max_tokens 0 with echo: an entry for every prompt token", short)
    # a stop string at the answer's very start cuts the answer, not the prompt's last token
    # (tiny-deepseek3's chat prompts end in a special token without text)
    q = next(q for q in ref["prompts"] if "<" in q["text"])
    st, data = post(port, "/v1/completions", {"prompt": q["tokens"], "max_tokens": 8, "temperature": 0, "echo": True,
                                              "logprobs": 0, "stop": [q["greedy_text"][:1]]})
    cs = json.loads(data)["choices"][0] if st == 200 else {}
    check(st == 200 and cs.get("finish_reason") == "stop" and len(cs["logprobs"]["tokens"]) == len(q["tokens"]),
          "a stop string at the answer's start: every prompt token kept", (st, data[:300]))
    st, data = post(port, "/v1/completions", dict(body, stream=True))
    evs = [json.loads(x[6:]) for x in data.decode().split("\n\n") if x.startswith("data: {")]
    text = "".join(e["choices"][0]["text"] for e in evs if e.get("choices"))
    check(st == 200 and text == c.get("text") and sum(len((e["choices"][0].get("logprobs") or {}).get("tokens", []))
                                                      for e in evs if e.get("choices")) == n,
          "max_tokens 0 with echo, streamed: the same text and entries", (st, text))
    st, data = post(port, "/v1/completions", {"prompt": p["tokens"], "max_tokens": 0})
    check(st == 400 and b"max_tokens" in data, "max_tokens 0 without echo: 400", data[:200])
    # echo without logprobs, a string prompt: the prompt's text, then the answer of the same request
    # without echo; streamed the same
    p = next(p for p in ref["prompts"] if "<" not in p["text"])
    body = {"prompt": p["text"], "max_tokens": 8, "temperature": 0}
    st, plain = post(port, "/v1/completions", body)
    st2, echoed = post(port, "/v1/completions", dict(body, echo=True))
    check(st == 200 and st2 == 200, "echo without logprobs")
    if st == 200 and st2 == 200:
        a, b = json.loads(plain)["choices"][0], json.loads(echoed)["choices"][0]
        check(b["text"] == p["text"] + a["text"] and b["logprobs"] is None,
              "echo: the prompt's text, then the answer %r" % b["text"])
        st3, data = post(port, "/v1/completions", dict(body, echo=True, stream=True))
        text = "".join(json.loads(x[6:])["choices"][0]["text"]
                       for x in data.decode().split("\n\n") if x.startswith("data: {"))
        check(st3 == 200 and text == b["text"], "echo streamed: the same text %r" % text)
        # a stop string found only in the prompt does not end the answer
        stop = p["text"][:4]
        if stop not in a["text"]:
            st4, data = post(port, "/v1/completions", dict(body, echo=True, stop=[stop]))
            c4 = json.loads(data)["choices"][0] if st4 == 200 else {}
            check(st4 == 200 and c4.get("text") == b["text"] and c4.get("finish_reason") == "length",
                  "a stop string in the prompt only: the answer goes on", c4)
    # not a chat parameter
    st, data = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True})
    check(st == 400 and b"echo" in data, "echo on chat completions: 400", data[:200])
finally:
    rc = srv.stop(timeout=60, killed_rc=-999)
    check(rc == 0, "clean exit %r" % rc)
    if FAILS:
        print(srv.tail())
sys.exit(summary("%s tp %d: " % (name, tp)))
