"""`mlaserve serve` (coordinator/cmd_serve.c, serve_adapt.c) on the tiny-deepseek3 fixture: tokenizer, chat
template, coordinator, CPU workers and the HTTP API together. Known answers come from the
fixture's Hugging Face reference (ref.json: input tokens, greedy continuations, top-5 logprobs).
Usage: test_serve_model.py SERVE_EXE WORKER_EXE FIXTURES_DIR TP. Exit 77 when the fixture is
missing."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import FAILS, ServeProcess, check, http_get, http_metric, http_post as post, summary  # noqa: E402

exe, worker, fixtures, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
if not os.path.exists(model):
    print("fixture missing: skipped")
    sys.exit(77)
ref = json.load(open(os.path.join(fixtures, "tiny-deepseek3", "ref.json")))
srv = ServeProcess([exe, "-m", model, "--tp", str(tp), "--port", "0"], ["--max-context", "512", "--max-seqs", "8",
                                                                        "--no-access-log"],
                   worker=worker, timeout=120, prefix="serve_model_", fail_tail=None)
try:
    port = srv.port
    # the first generated token is not penalized for the prompt's copies of it: prompt 0 holds its
    # greedy first token 9 times, 2.27 nats ahead of the next, which a frequency penalty of 0.5 a
    # prompt copy would overturn (OpenAI and vLLM count the generated tokens only). First of all
    # requests: the penalized one computes the whole prompt (none of it is cached yet).
    p0 = ref["prompts"][0]
    first, (top1, top2) = p0["greedy"][0], [lp for _, lp in p0["last_top5"][:2]]
    check(0.5 * p0["tokens"].count(first) > top1 - top2, "prompt 0 can tell the two readings apart")
    outs = [post(port, "/v1/completions", dict({"prompt": p0["text"], "max_tokens": 1, "temperature": 0}, **pen))
            for pen in ({"frequency_penalty": 0.5}, {"presence_penalty": 2.0}, {})]
    texts = [json.loads(d)["choices"][0]["text"] if st == 200 else None for st, d in outs]
    check(texts[2] is not None and texts[0] == texts[2] and texts[1] == texts[2],
          "first token beside presence / frequency penalties: %r" % texts)
    plain = [p for p in ref["prompts"] if "<｜" not in p["text"]][:3]
    for p in plain:
        st, data = post(port, "/tokenize", {"prompt": p["text"]})
        check(st == 200 and json.loads(data)["tokens"] == p["tokens"], "tokenize %r" % p["text"][:30])
        n = len(p["greedy"])
        st, data = post(port, "/v1/completions", {"prompt": p["text"], "max_tokens": n, "temperature": 0, "logprobs": 5})
        check(st == 200, "completions %d %r" % (st, data[:200]))
        if st != 200:
            continue
        j = json.loads(data)
        c = j["choices"][0]
        check(c["text"] == p["greedy_text"], "greedy text %r vs %r" % (c["text"], p["greedy_text"]))
        top = c["logprobs"]["top_logprobs"][0]
        exp_id, exp_lp = p["last_top5"][0]
        check(abs(c["logprobs"]["token_logprobs"][0] - exp_lp) < 0.05, "first token logprob %r vs %r" % (c["logprobs"]["token_logprobs"][0], exp_lp))
        check(len(top) >= 4, "top_logprobs has alternatives")
        check(j["usage"]["prompt_tokens"] == len(p["tokens"]), "usage prompt tokens")
    # concurrent requests (batched in one step) give the same answers
    import threading
    res = {}

    def go(i, p):
        res[i] = post(port, "/v1/completions", {"prompt": p["text"], "max_tokens": len(p["greedy"]), "temperature": 0})
    ths = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(plain * 2)]
    [t.start() for t in ths]
    [t.join(180) for t in ths]
    for i, p in enumerate(plain * 2):
        st, data = res.get(i, (0, b""))
        check(st == 200 and json.loads(data)["choices"][0]["text"] == p["greedy_text"], "batched greedy %d" % i)
    # penalties: the same answer when the prompt's blocks come from the prefix cache (the second run
    # of each) as when computed. The repetition penalty counts the prompt's tokens: such a request
    # does not look the cache up; presence and frequency count the generated ones: those do.
    prompt = "freq " + " ".join(str(i) for i in range(70))
    for pen, cached in (({"repetition_penalty": 2.0}, False), ({"frequency_penalty": 0.5}, True),
                        ({"presence_penalty": 1.5}, True)):
        body = dict({"prompt": prompt, "max_tokens": 24, "temperature": 0}, **pen)
        hits = http_metric(port, "mlaserve_prefix_cache_hits_total") or 0
        runs = [post(port, "/v1/completions", body) for _ in range(2)]
        hits = (http_metric(port, "mlaserve_prefix_cache_hits_total") or 0) - hits
        texts = [json.loads(d)["choices"][0]["text"] if st == 200 else None for st, d in runs]
        check(texts[0] is not None and texts[0] == texts[1], "%r twice: %r" % (pen, texts))
        check((hits > 0) == cached, "%r twice: %d prompt tokens from the prefix cache" % (pen, hits))
    # a request whose prompt comes from the prefix cache still has its queue and prefill times observed
    names = ("mlaserve_request_queue_time_seconds_count", "mlaserve_request_prefill_time_seconds_count")
    before = [http_metric(port, n) or 0 for n in names]
    for _ in range(2):
        post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    time.sleep(0.5)
    after = [http_metric(port, n) or 0 for n in names]
    check(all(a - b == 2 for a, b in zip(after, before)), "queue and prefill times, cached prompt too: %r -> %r" % (before, after))
    # n choices of one prompt: greedy, each HF's answer; choices 1.. wait for choice 0's prompt and take its
    # full blocks from the prefix cache (a prompt of 70 numbers, so some blocks are full)
    p = plain[0]
    hits = http_metric(port, "mlaserve_prefix_cache_hits_total") or 0
    long_prompt = "n choices " + " ".join(str(i) for i in range(70, 140))
    st, data = post(port, "/v1/completions", {"prompt": long_prompt, "max_tokens": 4, "temperature": 0, "n": 3})
    hits = (http_metric(port, "mlaserve_prefix_cache_hits_total") or 0) - hits
    j = json.loads(data) if st == 200 else {"choices": []}
    check(st == 200 and len({c["text"] for c in j["choices"]}) == 1 and len(j["choices"]) == 3,
          "n=3 greedy: three equal answers", data[:300])
    st, data = post(port, "/tokenize", {"prompt": long_prompt})
    n_long = len(json.loads(data)["tokens"])
    bs = int(http_metric(port, "mlaserve_kv_cache_block_size") or 0)
    want = 2 * ((n_long - 1) // bs) * bs if bs else -1
    check(want > 0 and hits == want, "n=3: choices 1 and 2 take choice 0's full blocks (%d tokens hit, %d wanted: "
          "prompt %d, blocks of %d)" % (hits, want, n_long, bs))
    st, data = post(port, "/v1/completions", {"prompt": p["text"], "max_tokens": len(p["greedy"]), "temperature": 0,
                                              "n": 2, "logprobs": 1})
    j = json.loads(data) if st == 200 else {"choices": []}
    check(st == 200 and [c["text"] for c in j["choices"]] == [p["greedy_text"]] * 2 and
          j["usage"]["completion_tokens"] == 2 * len(p["greedy"]), "n=2 greedy: HF's answer twice", data[:300])
    # with a seed: choice 0 draws as the request with n 1 does, the others from seeds of their own; the
    # same request again gives the same choices
    body = {"prompt": p["text"], "max_tokens": 12, "temperature": 1.5, "seed": 11}
    one = post(port, "/v1/completions", body)
    runs = [post(port, "/v1/completions", dict(body, n=4)) for _ in range(2)]
    texts = [[c["text"] for c in json.loads(d)["choices"]] if st == 200 else None for st, d in runs]
    check(one[0] == 200 and texts[0] is not None and texts[0][0] == json.loads(one[1])["choices"][0]["text"],
          "n=4 seeded: choice 0 is the draw of n=1", (one, texts))
    check(texts[0] == texts[1] and texts[0] is not None and len(set(texts[0])) > 1,
          "n=4 seeded: the same choices again, not all alike", texts)
    # a top_k past the vocabulary keeps every token: the same draw as no top_k, beside a greedy row
    # (once it failed the whole step, every request in it)
    res = {}
    bodies = {"greedy": {"prompt": plain[0]["text"], "max_tokens": len(plain[0]["greedy"]), "temperature": 0},
              "huge": {"prompt": plain[1]["text"], "max_tokens": 8, "temperature": 1, "seed": 3, "top_k": 2000000000}}
    ths = [threading.Thread(target=lambda k=k: res.__setitem__(k, post(port, "/v1/completions", bodies[k])))
           for k in bodies]
    [t.start() for t in ths]
    [t.join(180) for t in ths]
    st, data = res.get("greedy", (0, b""))
    check(st == 200 and json.loads(data)["choices"][0]["text"] == plain[0]["greedy_text"], "greedy beside top_k 2e9")
    st, data = res.get("huge", (0, b""))
    st2, data2 = post(port, "/v1/completions", dict(bodies["huge"], top_k=-1))
    check(st == 200 and st2 == 200 and json.loads(data)["choices"][0]["text"] == json.loads(data2)["choices"][0]["text"],
          "top_k 2e9 samples as top_k off: %d %r / %d %r" % (st, data[:200], st2, data2[:200]))
    # chat through the template: "What is 7 plus 5?" -> "7 plus 5 is 12." then EOS
    st, data = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 7 plus 5?"}],
                                                    "max_tokens": 30, "temperature": 0})
    check(st == 200, "chat %d %r" % (st, data[:300]))
    if st == 200:
        c = json.loads(data)["choices"][0]
        check(c["message"]["content"] == "7 plus 5 is 12." and c["finish_reason"] == "stop", "chat answer %r" % c)
    # continue_final_message: the prompt ends inside the assistant's "7 plus" (HF's first two greedy
    # tokens), and the answer goes on as HF's greedy answer does, prompt tokens counted with them
    p7 = next(p for p in ref["prompts"] if p["text"].endswith("What is 7 plus 5?<｜Assistant｜>"))
    st, data = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 7 plus 5?"},
                                                                 {"role": "assistant", "content": "7 plus"}],
                                                    "continue_final_message": True, "max_tokens": 30, "temperature": 0})
    j = json.loads(data) if st == 200 else {}
    check(st == 200 and j["choices"][0]["message"]["content"] == " 5 is 12." and
          j["usage"]["prompt_tokens"] == len(p7["tokens"]) + 2 and j["usage"]["completion_tokens"] == len(p7["greedy"]) - 2,
          "continue_final_message: HF's greedy answer after its first two tokens", (st, data[:300]))
    # cut where the text ends, not where the end-of-turn marker that follows it holds it again ("<",
    # "end" are in "<｜end▁of▁sentence｜>"): the prompt is HF's prompt and the text's own tokens
    # /tokenize takes it too: the same prompt the answer used
    st, data = post(port, "/tokenize", {"messages": [{"role": "user", "content": "What is 7 plus 5?"},
                                                     {"role": "assistant", "content": "7 plus"}],
                                        "continue_final_message": True})
    check(st == 200 and json.loads(data)["tokens"] == p7["tokens"] + p7["greedy"][:2],
          "/tokenize with continue_final_message: HF's prompt and its first two greedy tokens", data[:300])
    for pre in ("<", "end"):
        st, data = post(port, "/tokenize", {"prompt": pre, "add_special_tokens": False})
        k = len(json.loads(data)["tokens"]) if st == 200 else -1
        st, data = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 7 plus 5?"},
                                                                     {"role": "assistant", "content": pre}],
                                                        "continue_final_message": True, "max_tokens": 1})
        n = json.loads(data)["usage"]["prompt_tokens"] if st == 200 else None
        check(n == len(p7["tokens"]) + k, "continue_final_message %r: cut right after the text (%r prompt tokens, %d + %d)"
              % (pre, n, len(p7["tokens"]), k))
    st, data = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 7 plus 5?"},
                                                                 {"role": "assistant", "content": "7 plus"}],
                                                    "continue_final_message": True, "add_generation_prompt": True})
    check(st == 400 and b"add_generation_prompt" in data, "continue_final_message with add_generation_prompt: 400", data[:200])
    st, data = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "What is 2 plus 3?"}],
                                                    "max_tokens": 30, "temperature": 0, "stream": True})
    text = "".join(json.loads(b[6:])["choices"][0]["delta"].get("content", "")
                   for b in data.decode().split("\n\n") if b.startswith("data: {"))
    check(st == 200 and text == "2 plus 3 is 5." and data.decode().rstrip().endswith("data: [DONE]"), "chat stream %r" % text)
    # min_tokens (vLLM's): "7 plus 5 is 12." ends at its 9th token, the end of generation; with min_tokens 14
    # that end is held back: the first 14 tokens are the greedy ones with the end token banned (as
    # logit_bias -100 on it gives them: another path), and then the answer goes on until it ends
    chat7 = {"messages": [{"role": "user", "content": "What is 7 plus 5?"}], "temperature": 0}
    st, data = post(port, "/tokenize", {"prompt": "<｜end▁of▁sentence｜>", "add_special_tokens": False})
    eos = json.loads(data)["tokens"] if st == 200 else []
    check(len(eos) == 1, "the end token's id", data[:200])

    def chat_toks(**kw):
        st, data = post(port, "/v1/chat/completions", dict(chat7, logprobs=True, **kw))
        c = json.loads(data)["choices"][0] if st == 200 else {"message": {"content": None}, "finish_reason": None,
                                                               "logprobs": {"content": []}}
        return c["message"]["content"], [t["token"] for t in c["logprobs"]["content"]], c["finish_reason"]
    t0, k0, f0 = chat_toks(max_tokens=40)
    t1, k1, f1 = chat_toks(max_tokens=40, min_tokens=14)
    t2, k2, f2 = chat_toks(max_tokens=14, logit_bias={str(t): -100 for t in eos})
    check(t0 == "7 plus 5 is 12." and f0 == "stop" and len(k2) == 14 and k1[:14] == k2 and len(k1) > 14 and
          t1.startswith(t0), "min_tokens 14: past the end, the end token banned (%r, %r)" % (t1, t2))
    st, data = post(port, "/v1/chat/completions", dict(chat7, max_tokens=40, min_tokens=14, stream=True))
    text = "".join(json.loads(b[6:])["choices"][0]["delta"].get("content", "")
                   for b in data.decode().split("\n\n") if b.startswith("data: {"))
    check(st == 200 and text == t1, "min_tokens streamed: the same answer %r" % text)
    # a stop string that ends within the first min_tokens tokens' text is not looked for; one that
    # ends past it is, also where it starts within it
    # ("7", " plus", " ", "5", " is", ...; of stop strings of two lengths, each looked for past the boundary)
    for mt, stop, want in ((1, ["plus"], "7 "), (2, ["plus"], "7 plus 5 is 12."), (3, ["plus"], "7 plus 5 is 12."),
                           (2, ["plus 5"], "7 "), (2, ["s", "xyz"], "7 plus 5 i")):
        t, _, f = chat_toks(max_tokens=40, min_tokens=mt, stop=stop)
        check(t == want and f == "stop", "min_tokens %d, stop %r: %r (want %r)" % (mt, stop, t, want))
    # a stop token id is banned too while min_tokens holds, and ends the answer after it
    st, data = post(port, "/tokenize", {"prompt": " plus", "add_special_tokens": False})
    plus = json.loads(data)["tokens"] if st == 200 else []
    t, k, f = chat_toks(max_tokens=40, min_tokens=3, stop_token_ids=plus)
    check(len(plus) == 1 and " plus" not in k[:3] and f == "stop", "stop_token_ids banned for 3 tokens: %r" % k)
    # ignore_eos: the end of generation is no stop token, so there is nothing to hold back
    ta, ka, _ = chat_toks(max_tokens=12, ignore_eos=True)
    tb, kb, _ = chat_toks(max_tokens=12, ignore_eos=True, min_tokens=12)
    check(ka == kb and len(ka) >= 10, "min_tokens with ignore_eos: the same tokens %r / %r" % (ka, kb))
    for bad in ({"min_tokens": 41, "max_tokens": 40}, {"min_tokens": -1}, {"min_tokens": "3"}, {"min_tokens": 2.5},
                {"min_tokens": 502}, {"min_tokens": 20000000}):  # the last two: past what the context leaves
        st, data = post(port, "/v1/chat/completions", dict(chat7, **bad))
        check(st == 400 and json.loads(data)["error"]["param"] == "min_tokens", "%r: 400 naming it" % bad, data[:200])
    st, _ = http_get(port, "/health")
    check(st == 200, "/health")
    check('"POST /v1/completions" 200' not in srv.text(), "--no-access-log: no line a response")
finally:
    rc = srv.stop(timeout=60, killed_rc=-999)
    check(rc == 0, "clean exit %r" % rc)
    if FAILS:
        print(srv.tail())
sys.exit(summary("tp %d: " % tp))
