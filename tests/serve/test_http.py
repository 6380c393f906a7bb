"""HTTP tests of the serving front against the fake backend (tests/serve/fake_server_main.c).
Usage: test_http.py FAKE_SERVER_EXE. Every answer is checked against fakeref.py, an independent
Python model of the fake backend and tokenizer. 127.0.0.1 only, free ports, bounded in time."""
import http.client
import json
import os
import re
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakeref as R  # noqa: E402
from mlatest import FAILS, check, http_metric as metric, http_request as request, summary, wait_for  # noqa: E402,F401

EXE = sys.argv[1]


def post(port, path, body, **kw):
    st, hd, data = request(port, "POST", path, body, **kw)
    try:
        j = json.loads(data)
    except ValueError:
        j = None
    return st, j, data, hd


def sse_events(data):
    """Parses an SSE body into JSON events; returns (events, saw_done, done_last)."""
    evs, done, done_last = [], False, False
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        check(block.startswith("data: "), "SSE block starts with 'data: ': %r" % block[:40])
        payload = block[6:]
        if payload == "[DONE]":
            done = True
            done_last = True
            continue
        done_last = False
        evs.append(json.loads(payload))
    return evs, done, done_last


def is_error_shape(j, status_hint=""):
    ok = isinstance(j, dict) and isinstance(j.get("error"), dict)
    if ok:
        e = j["error"]
        ok = all(k in e for k in ("message", "type", "param", "code")) and isinstance(e["message"], str) and e["message"]
    check(ok, "OpenAI error shape %s: %r" % (status_hint, j))


def ref_completion(prompt_ids, max_tokens, **kw):
    toks, lps, tops, fin = R.generate(prompt_ids, max_tokens, **kw)
    return toks, lps, tops, fin


# ---------------------------------------------------------------- main server
def test_basic(port):
    st, hd, data = request(port, "GET", "/v1/models")
    j = json.loads(data)
    check(st == 200 and j["object"] == "list" and j["data"][0]["id"] == "fake-model", "/v1/models")
    for path, want in (("/v1/models/fake-model", 200), ("/v1/models/fake%2Dmodel/", 200), ("/v1/models/x", 404)):
        st, hd, data = request(port, "GET", path)
        check(st == want and (st != 200 or json.loads(data)["id"] == "fake-model"), "GET %s: %d" % (path, st))
    st, hd, data = request(port, "GET", "/health")
    check(st == 200, "/health 200")
    # tokenize / detokenize
    st, j, _, _ = post(port, "/tokenize", {"prompt": "héllo<|eos|>"})
    check(st == 200 and j["tokens"] == R.encode("héllo<|eos|>") and j["count"] == len(j["tokens"]), "/tokenize %r" % j)
    st, j, _, _ = post(port, "/tokenize", {"prompt": "ab", "add_special_tokens": False})
    check(st == 200 and j["tokens"] == [97, 98], "/tokenize without specials")
    st, j, _, _ = post(port, "/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "hi"}]})
    check(st == 400 and j["error"]["param"] == "messages", "/tokenize: prompt and messages refused together")
    msgs = [{"role": "user", "content": "hi"}]
    st, j, _, _ = post(port, "/tokenize", {"messages": msgs})
    check(st == 200 and j["tokens"] == R.chat_prompt(msgs), "/tokenize messages")
    st, j, _, _ = post(port, "/tokenize", {"messages": msgs, "add_generation_prompt": False})
    check(st == 200 and j["tokens"] == R.chat_prompt(msgs, add_gen=False), "/tokenize messages without the generation prompt")
    for bad, field in (({"prompt": "ab", "foo": 1}, "foo"), ({"messages": msgs, "tools": [1]}, "tools"),
                       ({"prompt": "ab", "add_generation_prompt": True}, "add_generation_prompt")):
        st, j, _, _ = post(port, "/tokenize", bad)
        check(st == 400 and j["error"]["param"] == field, "/tokenize %r -> 400 naming %s: %r" % (bad, field, j))
    st, j, _, _ = post(port, "/detokenize", {"tokens": list("héllo".encode())})
    check(st == 200 and j["prompt"] == "héllo", "/detokenize %r" % j)
    st, j, _, _ = post(port, "/detokenize", {"tokens": [99999]})
    check(st == 400, "/detokenize out of range 400")
    is_error_shape(j)
    for bad, field in (({"tokens": [97], "skip_special_tokens": True}, "skip_special_tokens"), ({"tokens": [97], "x": 1}, "x")):
        st, j, _, _ = post(port, "/detokenize", bad)
        check(st == 400 and j["error"]["param"] == field, "/detokenize %r -> 400 naming %s: %r" % (bad, field, j))
    for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [97]})):
        st, j, _, _ = post(port, path, dict(body, model="fake-model"))
        check(st == 200, "%s with the served model's name: %d" % (path, st))
        st, j, _, _ = post(port, path, dict(body, model="nope"))
        check(st == 404 and j["error"]["code"] == "model_not_found", "%s with another model: 404 %r" % (path, j))


def test_completions(port):
    prompt = "hello world"
    pids = R.encode(prompt)
    toks, lps, tops, fin = ref_completion(pids, 20, n_top=3)
    st, j, _, _ = post(port, "/v1/completions", {"model": "fake-model", "prompt": prompt, "max_tokens": 20, "logprobs": 3,
                                                  "temperature": 0})
    check(st == 200, "completions 200")
    ch = j["choices"][0]
    check(ch["text"] == R.text_of(toks), "completion text %r vs %r" % (ch["text"], R.text_of(toks)))
    check(ch["finish_reason"] == fin == "length", "finish length")
    check(j["usage"] == {"prompt_tokens": len(pids), "completion_tokens": 20, "total_tokens": len(pids) + 20}, "usage %r" % j["usage"])
    lp = ch["logprobs"]
    check(lp["tokens"] == [chr(t) for t in toks], "logprobs.tokens")
    check([R.f32(x) for x in lp["token_logprobs"]] == lps, "token_logprobs")
    check(lp["text_offset"] == list(range(20)), "text_offset")
    exp_tops = [{chr(t): l for t, l in reversed(tp)} for tp in tops]
    got_tops = [{k: R.f32(v) for k, v in d.items()} for d in lp["top_logprobs"]]
    check(got_tops == exp_tops, "top_logprobs")
    check(j["object"] == "text_completion" and j["id"].startswith("cmpl-"), "completion object/id")
    # logprobs 0: no alternatives, the sampled token alone (OpenAI's completions list it beside the N)
    st, j, _, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "logprobs": 0})
    lp = j["choices"][0]["logprobs"]
    got = [{k: R.f32(v) for k, v in d.items()} for d in lp["top_logprobs"]]
    check(st == 200 and got == [{chr(t): l} for t, l in zip(toks, lps)], "logprobs 0: the sampled token %r" % got[:2])
    # token id prompt, and a list holding one prompt
    st, j2, _, _ = post(port, "/v1/completions", {"prompt": pids, "max_tokens": 20})
    check(st == 200 and j2["choices"][0]["text"] == R.text_of(toks) and j2["choices"][0]["logprobs"] is None, "token-id prompt")
    st, j2, _, _ = post(port, "/v1/completions", {"prompt": [prompt], "max_completion_tokens": 20})
    check(st == 200 and j2["choices"][0]["text"] == R.text_of(toks), "prompt list of one / max_completion_tokens")


def test_stream_completions(port):
    prompt = "stream me"
    pids = R.encode(prompt)
    toks, lps, tops, fin = ref_completion(pids, 30, n_top=2)
    st, hd, data = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 30, "stream": True,
                                                             "logprobs": 2, "stream_options": {"include_usage": True}})
    check(st == 200 and hd.get("Content-Type", "").startswith("text/event-stream"), "stream content type")
    evs, done, done_last = sse_events(data)
    check(done and done_last, "stream ends with [DONE]")
    text = "".join(e["choices"][0]["text"] for e in evs if e["choices"])
    check(text == R.text_of(toks), "streamed text")
    fins = [e["choices"][0]["finish_reason"] for e in evs if e["choices"]]
    check(fins[-1] == "length" and all(f is None for f in fins[:-1]), "stream finish_reason %r" % fins[-3:])
    ltoks, llps, offs = [], [], []
    for e in evs:
        if e["choices"] and e["choices"][0]["logprobs"]:
            l = e["choices"][0]["logprobs"]
            ltoks += l["tokens"]; llps += l["token_logprobs"]; offs += l["text_offset"]
    check(ltoks == [chr(t) for t in toks] and [R.f32(x) for x in llps] == lps and offs == list(range(30)), "streamed logprobs")
    check(evs[-1]["choices"] == [] and evs[-1]["usage"]["completion_tokens"] == 30, "usage chunk")
    check(all(e["usage"] is None for e in evs[:-1]), "usage null in the other chunks")
    # continuous_usage_stats: every chunk carries the usage so far, counting up to the last
    st, hd, data = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 30, "stream": True,
                                                             "stream_options": {"include_usage": True,
                                                                                "continuous_usage_stats": True}})
    evs, done, _ = sse_events(data)
    us = [e["usage"] for e in evs]
    seen = [u["completion_tokens"] for u in us if u]
    check(done and all(u and u["prompt_tokens"] == len(pids) and u["total_tokens"] == len(pids) + u["completion_tokens"]
                       for u in us) and seen == sorted(seen) and seen[-1] == 30 and evs[-1]["choices"] == [] and
          sum(len(e["choices"][0]["text"]) for e in evs if e["choices"]) == 30, "continuous usage in every chunk", us[:3])


def test_chat(port):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    pids = R.chat_prompt(msgs)
    toks, lps, tops, fin = ref_completion(pids, 16, n_top=2)
    st, j, _, _ = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 16, "logprobs": True, "top_logprobs": 2})
    check(st == 200 and j["object"] == "chat.completion", "chat 200")
    m = j["choices"][0]["message"]
    check(m["role"] == "assistant" and m["content"] == R.text_of(toks), "chat content")
    content = j["choices"][0]["logprobs"]["content"]
    check([c["token"] for c in content] == [chr(t) for t in toks], "chat logprobs tokens")
    check([R.f32(c["logprob"]) for c in content] == lps, "chat logprobs values")
    check(all(c["bytes"] == [t] for c, t in zip(content, toks)), "chat logprobs bytes")
    check(all([(ord(x["token"]), R.f32(x["logprob"])) for x in c["top_logprobs"]] == tp for c, tp in zip(content, tops)), "chat top_logprobs")
    check(j["usage"]["prompt_tokens"] == len(pids), "chat usage")
    # stream
    st, hd, data = request(port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 16, "stream": True})
    evs, done, _ = sse_events(data)
    check(done and evs[0]["choices"][0]["delta"].get("role") == "assistant", "chat stream role first")
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in evs)
    check(text == R.text_of(toks), "chat stream text")
    check(evs[-1]["choices"][0]["finish_reason"] == "length" and evs[-1]["object"] == "chat.completion.chunk", "chat stream finish")


def test_stops(port):
    prompt = "stop strings"
    pids = R.encode(prompt)
    toks, _, _, _ = ref_completion(pids, 60)
    full = R.text_of(toks)
    stop = full[10:13]
    cut = full.index(stop)
    for stream in (False, True):
        st, hd, data = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 60, "stop": [stop, "\u00e9\u00e9"], "stream": stream, "logprobs": 0})
        if stream:
            evs, done, _ = sse_events(data)
            text = "".join(e["choices"][0]["text"] for e in evs)
            fin = evs[-1]["choices"][0]["finish_reason"]
            ntok = sum(len(e["choices"][0]["logprobs"]["tokens"]) for e in evs if e["choices"][0]["logprobs"])
        else:
            j = json.loads(data)
            text = j["choices"][0]["text"]
            fin = j["choices"][0]["finish_reason"]
            ntok = len(j["choices"][0]["logprobs"]["tokens"])
        check(text == full[:cut], "stop string cut (stream=%s): %r vs %r" % (stream, text, full[:cut]))
        check(fin == "stop", "stop string finish (stream=%s)" % stream)
        check(ntok == cut, "logprob tokens end at the cut (stream=%s)" % stream)
    # include_stop_str_in_output: the answer ends after the stop string
    for stream in (False, True):
        st, hd, data = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 60, "stop": [stop],
                                                                 "include_stop_str_in_output": True, "stream": stream})
        text = "".join(e["choices"][0]["text"] for e in sse_events(data)[0]) if stream else \
            json.loads(data)["choices"][0]["text"]
        check(text == full[:cut + len(stop)], "stop string kept (stream=%s): %r" % (stream, text))
    # stop token ids: the 4th generated token
    st, j, _, _ = post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 60, "stop_token_ids": [toks[3]]})
    first = toks.index(toks[3])
    check(j["choices"][0]["text"] == full[:first] and j["choices"][0]["finish_reason"] == "stop", "stop_token_ids")
    check(j["usage"]["completion_tokens"] == first + 1, "stop token counted in usage")
    # with include_stop_str_in_output the stop token's text is kept too (as vLLM's), its logprob listed
    for stream in (False, True):
        st, hd, data = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 60, "stream": stream,
                                                                 "stop_token_ids": [toks[3]], "logprobs": 0,
                                                                 "include_stop_str_in_output": True})
        evs = sse_events(data)[0] if stream else [json.loads(data)]
        text = "".join(e["choices"][0]["text"] for e in evs)
        ntok = sum(len(e["choices"][0]["logprobs"]["tokens"]) for e in evs if e["choices"][0]["logprobs"])
        check(text == full[:first + 1] and ntok == first + 1 and evs[-1]["choices"][0]["finish_reason"] == "stop",
              "stop token kept with include_stop_str_in_output (stream=%s): %r, %d tokens" % (stream, text, ntok))


def test_errors(port):
    def err(body, status, what, raw=False, path="/v1/completions", param=None, says=()):
        st, j, data, _ = post(port, path, body)
        check(st == status, "%s: status %d (got %d: %r)" % (what, status, st, data[:200]))
        is_error_shape(j, what)
        if param:
            check(j["error"]["param"] == param, "%s: param %r" % (what, j["error"]["param"]))
        for needle in (says,) if isinstance(says, str) else says:
            check(isinstance(j, dict) and needle in j.get("error", {}).get("message", ""),
                  "%s: the message says %r (%r)" % (what, needle, data[:300]))
        check(not isinstance(j, dict) or ": :" not in j.get("error", {}).get("message", ""),
              "%s: one separator between the parts of the message (%r)" % (what, data[:300]))
    err(b"{not json", 400, "bad JSON")
    err(b"", 400, "empty body", says="the request body is empty")
    err([1, 2], 400, "non-object body")
    err({"prompt": "x", "temperature": "hot"}, 400, "wrong type temperature", param="temperature")
    err({"prompt": "x", "max_tokens": 1.5}, 400, "fractional max_tokens", param="max_tokens")
    err({"prompt": "x", "max_tokens": 0}, 400, "max_tokens 0", param="max_tokens")
    err({"messages": [{"role": "user", "content": "hi"}], "add_special_tokens": True}, 400,
        "/tokenize: add_special_tokens true with messages", path="/tokenize", param="add_special_tokens",
        says="chat template")
    err({"prompt": "x", "n": 0}, 400, "n=0", param="n", says="between 1 and 128")
    err({"prompt": "x", "n": 129}, 400, "n=129", param="n", says="between 1 and 128")
    err({"prompt": "x", "n": 2, "best_of": 3}, 400, "best_of above n", param="best_of", says="must equal 'n' (2)")
    err({"prompt": "x", "best_of": 2}, 400, "best_of 2 with n 1", param="best_of")
    err({"prompt": 5}, 400, "prompt type", param="prompt")
    err({"prompt": ["a", [1]]}, 400, "a list of prompts of two kinds", param="prompt", says="not both")
    err({"prompt": [[1], []]}, 400, "an empty prompt in a list", param="prompt", says="[1] must not be empty")
    err({"prompt": [[], [1]]}, 400, "an empty first prompt in a list", param="prompt", says="[0] must not be empty")
    err({"prompt": [[1], [2, "x"]]}, 400, "a malformed id in the second prompt", param="prompt",
        says="'prompt' [1] must be a list of non-negative integer token ids")
    err({"prompt": [[-1], [2]]}, 400, "a negative id in the first prompt", param="prompt",
        says="'prompt' [0] must be a list")
    err({"prompt": ["a"] * 129}, 400, "129 prompts", param="prompt", says="at most 128 prompts")
    err({"prompt": ["a", "b"], "n": 65}, 400, "130 choices", param="n", says="at most 128 choices")
    err({"prompt": [[66], [1 << 30]]}, 400, "a token past the vocabulary in the second prompt", param="prompt",
        says="(the prompt at index 1)")
    err({"prompt": [[1 << 30], [66]]}, 400, "a token past the vocabulary in the first prompt", param="prompt",
        says="(the prompt at index 0)")
    err({"prompt": "x", "stop": 3}, 400, "stop type", param="stop")
    err({"prompt": "x", "stop": ""}, 400, "an empty stop string", param="stop", says="must not be empty")
    err({"prompt": "x", "stop": ["a", ""]}, 400, "an empty stop string listed", param="stop", says="must not be empty")
    err({"prompt": "x", "top_p": 0}, 400, "top_p 0", param="top_p", says="(0, 1]")
    err({"prompt": "x", "top_p": 1.5}, 400, "top_p 1.5", param="top_p", says=("(0, 1]", "got 1.5"))
    err({"prompt": "x", "top_p": 1e-300}, 400, "top_p 0 as a float", param="top_p", says="is 0 as a 32-bit float")
    err({"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty 0", param="repetition_penalty",
        says="(0, 100]")
    # seeds: a JSON number past 2^53 is not read exactly (9007199254740993 reads as ...992), so
    # it is refused by name rather than silently becoming another seed
    for raw in (b"9007199254740992", b"9007199254740993", b"-9007199254740993", b"1e300"):
        err(b'{"prompt": "x", "max_tokens": 1, "seed": ' + raw + b"}", 400, "seed %s" % raw.decode(), param="seed",
            says="2^53")
    err({"prompt": "x", "seed": 1.5}, 400, "fractional seed", param="seed", says="'seed' must be an integer")
    for seed in (2**53 - 1, -(2**53 - 1), 0):
        st, j, data, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 1, "seed": seed})
        check(st == 200, "seed %d accepted (%d %r)" % (seed, st, data[:200]))
    err({"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}, 400,
        "stream_options.include_usage type", param="stream_options", says="'stream_options.include_usage'")
    # nesting past the parser's limit (1000 levels) is named as such, not "not valid JSON"
    deep = b'{"prompt": "x", "stop": ' + b"[" * 1200 + b"]" * 1200 + b"}"
    err(deep, 400, "nesting past the limit", says=("deeper than the limit of 1000 levels", "at byte 1023"))
    err(b'{"prompt": "x", "stop": "[[[[", "max_tokens": }', 400, "brackets in strings are no nesting",
        says=("not valid JSON", "at byte 46"))
    # half a surrogate pair has no UTF-8 form: named, with its place; a whole pair, or an escaped
    # backslash before "ud83d", is text
    err(b'{"prompt": "ab\\ud83d", "max_tokens": 1}', 400, "a lone high surrogate", says=("half a UTF-16 surrogate pair", "at byte 14"))
    err(b'{"prompt": "\\ude00x", "max_tokens": 1}', 400, "a lone low surrogate", says=("half a UTF-16 surrogate pair", "at byte 12"))
    err(b'{"prompt": "\\ud83d\\u0041", "max_tokens": 1}', 400, "a high surrogate before no low one", says="at byte 12")
    err(b'{"prompt": "\\ud83d\\ude00", "max_tokens": }', 400, "a whole pair is no lone surrogate",
        says=("not valid JSON", "at byte 41"))
    for ok in (b'{"prompt": "\\ud83d\\ude00", "max_tokens": 1}', b'{"prompt": "\\\\ud83d", "max_tokens": 1}'):
        st, j, data, _ = post(port, "/v1/completions", ok)
        check(st == 200, "%r accepted (%d %r)" % (ok, st, data[:200]))
    # numbers that strtod reads but JSON's grammar does not allow: refused with their place
    head = b'{"prompt": "x", "max_tokens": '
    for raw in (b"01", b"00.5", b"1.", b"-01", b"1.e3"):
        err(head + raw + b"}", 400, "the number %s" % raw.decode(),
            says=("a number JSON does not allow", "at byte %d" % len(head)))
    ok = b'{"prompt": "x 01 1.", "max_tokens": 1, "temperature": 0.5, "top_p": 1E+0, "seed": -0}'
    st, j, data, _ = post(port, "/v1/completions", ok)
    check(st == 200, "JSON's own numbers, and number-like text in a string, accepted (%d %r)" % (st, data[:200]))
    err(b" \r\n", 400, "an empty body is named as such", says="the request body is empty")
    err({"prompt": "x", "logprobs": 50}, 400, "logprobs 50", param="logprobs")
    err({"prompt": "x", "stream": "yes"}, 400, "stream type", param="stream")
    err({"prompt": "x", "model": "other"}, 404, "unknown model", param="model",
        says="The model 'other' does not exist (this server serves")
    err({"prompt": [1, 99999]}, 400, "token id out of range")
    err({"prompt": "x" * 3000}, 400, "prompt over context")
    err({"prompt": "x" * 100, "max_tokens": 2000}, 400, "prompt + max_tokens over context", param="max_tokens")
    err({"messages": "hi"}, 400, "messages type", path="/v1/chat/completions", param="messages")
    err({"messages": [{"role": "user", "content": 3}]}, 400, "content type", path="/v1/chat/completions")
    err({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs without logprobs", path="/v1/chat/completions")
    err({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options without stream",
        param="stream_options")
    err({"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}, 400,
        "continuous_usage_stats without include_usage", param="stream_options", says="needs 'include_usage'")
    err({"prompt": "x", "include_stop_str_in_output": 1}, 400, "include_stop_str_in_output type",
        param="include_stop_str_in_output")
    err({"messages": [{"role": "user", "content": "x"}], "stream": False, "stream_options": {"include_usage": True}}, 400,
        "chat stream_options without stream", path="/v1/chat/completions", param="stream_options")
    # a body that is not UTF-8 (JSON is UTF-8, RFC 8259): refused, naming the byte
    for body in (b'{"prompt": "x", "\xff\xfe": 1}', b'{"prompt": "a\xffb"}', b'{"prompt": "a\xed\xa0\x80"}'):
        st, j, data, _ = post(port, "/v1/completions", body)
        check(st == 400 and j is not None and "not valid UTF-8" in j["error"]["message"],
              "body not UTF-8 %r: 400 naming it (%d %r)" % (body[:24], st, data[:200]))
    # strict JSON, as Python's json behind other servers: raw control characters in strings and a
    # member given twice are refused by name (not read one way here and another way elsewhere)
    for body, needle in ((b'{"prompt": "a\nb", "max_tokens": 1}', "raw control character"),
                         (b'{"prompt": "x", "max_tokens": 1, "max_tokens": 5}', "'max_tokens' twice"),
                         (b'{"messages": [{"role": "user", "content": "x", "role": "user"}]}', "'role' twice")):
        st, j, data, _ = post(port, "/v1/completions", body)
        check(st == 400 and j is not None and needle in j["error"]["message"],
              "strict JSON %r: 400 naming it (%d %r)" % (body[:30], st, data[:200]))
    st, j, data, _ = post(port, "/v1/completions", b'{"prompt": "a\\nb\\t", "max_tokens": 1}')
    check(st == 200, "escaped control characters are fine (%d %r)" % (st, data[:200]))
    # the refused member's name comes back as valid UTF-8, also when cut in a character
    for key in (("ab" + "\u00e9" * 40).encode(),):
        st, _, data, _ = post(port, "/v1/completions", b'{"prompt": "x", "' + key + b'": 1}')
        try:
            j = json.loads(data.decode("utf-8"))
        except ValueError:
            j = None
        check(st == 400 and j is not None and j["error"]["param"], "refused member %r: JSON in UTF-8 (%d %r)" % (key[:8], st, data[:200]))
    # a NUL character would end the string where the server reads it: refused, not cut short
    for body, where, what in ((b'{"prompt": "a\\u0000b"}', "/v1/completions", "escaped NUL in prompt"),
                              (b'{"prompt": "a\x00b"}', "/v1/completions", "raw NUL in prompt"),
                              (json.dumps({"messages": [{"role": "user", "content": "a\x00b"}]}).encode(),
                               "/v1/chat/completions", "NUL in a message"),
                              (b'{"prompt": "a\\u0000b"}', "/tokenize", "NUL in a tokenize prompt")):
        st, j, data, _ = post(port, where, body)
        check(st == 400 and j is not None and "NUL" in j["error"]["message"],
              "%s: 400 naming the NUL (%d %r)" % (what, st, data[:200]))
    st, j, data, _ = post(port, "/v1/completions", {"prompt": "a\\u0000b", "max_tokens": 1})
    check(st == 200, "an escaped backslash before u0000 is plain text (%d %r)" % (st, data[:200]))
    st, j, data, _ = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    check(st == 400 and "needs a string 'text'" in j["error"]["message"],
          "a text part without text is named as such (%d %r)" % (st, data[:200]))
    # a message's members: a misspelt one, a missing content, OpenAI's answer members sent back
    # empty (taken) or not (refused), a name that is not a string
    chat = "/v1/chat/completions"
    err({"messages": [{"role": "user", "contnet": "x"}]}, 400, "misspelt message member", path=chat,
        param="messages", says="messages[0].contnet is not a member")
    err({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "txt": "b"}]}]}, 400,
        "a text part's unknown member", path=chat, param="messages", says="'txt' is not a member of a text part")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    for bad, says in (({**call, "bogus": 1}, "tool_calls[0].bogus is not a member of a tool call"),
                      ({**call, "function": {"name": "f", "arguments": "{}", "argumnets": "x"}},
                       "tool_calls[0].function.argumnets is not a member"),
                      ({**call, "id": 5}, "tool_calls[0].id must be a string"),
                      ({**call, "index": -1}, "tool_calls[0].index must be a non-negative integer")):
        err({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [bad]},
                          {"role": "tool", "tool_call_id": "c1", "content": "1"}]}, 400, says, path=chat,
            param="messages", says="messages[1]." + says)
    st, j, data, _ = post(port, chat, {"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{**call, "index": 0}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"}], "max_tokens": 2})
    check(st == 200, "a tool call gathered from a stream, its index kept, is taken (%d %r)" % (st, data[:200]))
    err({"messages": [{"role": "system", "content": "s"}, {"role": "user"}]}, 400, "message without content", path=chat,
        says="messages[1].content is required")
    err({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]}, 400,
        "assistant turn without content or tool calls", path=chat, says="content is required (or tool_calls)")
    err({"messages": [{"role": "user", "content": "x", "name": 3}]}, 400, "name not a string", path=chat,
        says="messages[0].name must be a string")
    err({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "refusal": "no"},
                      {"role": "user", "content": "z"}]}, 400, "a refusal sent back", path=chat,
        says="messages[1].refusal is not supported")
    st, j, data, _ = post(port, chat, {"messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", "refusal": None, "annotations": [], "audio": None, "function_call": None},
        {"role": "user", "content": "z", "name": "ann"}], "max_tokens": 2})
    check(st == 200, "OpenAI's answer members sent back empty are taken (%d %r)" % (st, data[:200]))
    # "developer" is OpenAI's newer name for "system" (rendered as such: tests/unit/test_chat.c)
    st, j, data, _ = post(port, "/v1/chat/completions",
                          {"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "x"}],
                           "max_tokens": 4})
    check(st == 200, "role developer accepted (%d %r)" % (st, data[:200]))
    for role in ("function", "ipython"):
        st, j, data, _ = post(port, "/v1/chat/completions",
                              {"messages": [{"role": role, "content": "Be brief."}, {"role": "user", "content": "x"}]})
        check(st == 400 and j["error"]["param"] == "messages" and ("'%s'" % role) in j["error"]["message"],
              "role %s refused by name (%d %r)" % (role, st, data[:200]))
    st, hd, data = request(port, "GET", "/nope")
    check(st == 404, "unknown route 404")
    is_error_shape(json.loads(data))
    st, hd, data = request(port, "GET", "/v1/completions")
    check(st == 405 and hd.get("Allow") == "POST", "wrong method 405 %r" % hd)
    is_error_shape(json.loads(data))
    st, hd, data = request(port, "POST", "/health", b"{}")
    check(st == 405, "POST /health 405")


def recv_until(s, marker=None, got=b""):
    """Reads socket s onto got until marker is in it (None: until the peer closes), or the peer closes."""
    while marker is None or marker not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    return got


def raw(port, payload, timeout=10, read_until_close=True, step=0):
    """Sends payload (in writes of step bytes, 1 ms apart, where step > 0) and reads the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    for i in range(0, len(payload), step or max(len(payload), 1)):
        s.sendall(payload[i:i + (step or len(payload))])
        if step:
            time.sleep(0.001)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
            if not read_until_close:
                break
    except socket.timeout:
        out += b"<timeout>"
    s.close()
    return out


def test_http_level(port):
    out = raw(port, b"BLAH BLAH\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 400"), "garbage request line -> 400: %r" % out[:60])
    out = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 431"), "header too large -> 431: %r" % out[:60])
    hdrs = b"".join(b"X-%d: v\r\n" % i for i in range(100))
    out = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n" + hdrs + b"\r\n")
    check(out.startswith(b"HTTP/1.1 431"), "too many headers -> 431")
    out = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 400"), "bad content-length -> 400")
    out = raw(port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 414"), "long URL -> 414")
    # RFC 9112 3.2: HTTP/1.1 needs one Host field; HTTP/1.0 may leave it out
    out = raw(port, b"GET /health HTTP/1.1\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 400") and b"Host" in out, "HTTP/1.1 without Host -> 400: %r" % out[:160])
    out = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 400") and b"Host" in out, "two Host fields -> 400: %r" % out[:160])
    out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"
              b"Connection: close\r\n\r\n5\r\n{\"pro\r\n0\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 400") and b"more than one Transfer-Encoding" in out,
          "chunked twice -> 400: %r" % out[:200])
    out = raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 400") and b"more than one Authorization" in out,
          "two Authorization fields -> 400: %r" % out[:200])
    # obs-fold (RFC 9112 5.2): refused whether the fold arrives in one read or split over many;
    # a value split by the reads alone is one value
    folded = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\nConnection: close\r\n\r\n"
    plain = b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a b c d e f\r\nConnection: close\r\n\r\n"
    for step in (0, 1, 2, 3, 5):
        for req, want in ((folded, b"HTTP/1.1 400"), (plain, b"HTTP/1.1 200")):
            out = raw(port, req, step=step)
            check(out.startswith(want) and (want.endswith(b"200") or b"obs-fold" in out),
                  "%s in reads of %d bytes -> %s: %r" % ("obs-fold" if req is folded else "a plain value", step,
                                                         want[9:].decode(), out[:160]))
    out = raw(port, b"GET /health HTTP/1.0\r\n\r\n")
    check(b" 200 " in out[:20], "HTTP/1.0 without Host -> 200: %r" % out[:60])
    out = raw(port, b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n")
    check(b" 505 " in out[:20] or out.startswith(b"HTTP/1.1 400"), "HTTP/2.0 request line refused: %r" % out[:40])
    # pipelining + keep-alive + close
    body = b'{"prompt":"ab","max_tokens":3}'
    req = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    out = raw(port, req + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check(out.count(b"HTTP/1.1 200 OK") == 3, "three pipelined responses: %r" % out[:400])
    i1, i2, i3 = out.find(b"text_completion"), out.find(b'"status":"ok"'), out.find(b'"object":"list"')
    check(0 < i1 < i2 < i3, "pipelined responses in order")
    # chunked request body
    out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
              b"5\r\n{\"pro\r\n11\r\nmpt\": \"abc\"}     \r\n0\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 200") and b"[257,97,98,99]" in out, "chunked request body: %r" % out[-80:])
    out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n")
    check(out.startswith(b"HTTP/1.1 400") and b"chunk size" in out and b"content-length header" not in out,
          "an overflowing chunk size: 400 naming the chunk: %r" % out[-160:])
    for cl in (b"99999999999999999999", b"12a"):
        out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: " + cl + b"\r\n\r\n")
        check(out.startswith(b"HTTP/1.1 400") and b"Content-Length is not a decimal number of bytes" in out,
              "Content-Length %s: 400 naming the header: %r" % (cl.decode(), out[-200:]))
    # a coding beside chunked would be read as raw bytes: 501; a POST without a length: 411, and its
    # bytes are not read as a next request
    out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
              b"5\r\n{\"pro\r\n0\r\n\r\n")
    check(out.startswith(b"HTTP/1.1 501") and b"only chunked" in out and out.count(b"HTTP/1.1") == 1,
          "gzip, chunked -> 501: %r" % out[:200])
    # a compressed body would be read as JSON: 415; an expectation other than 100-continue: 417,
    # answered before the body (not a wait for it)
    for head, want in ((b"Content-Encoding: gzip", b"415"), (b"Expect: something-else", b"417")):
        out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n" + head + b"\r\n\r\n")
        check(out.startswith(b"HTTP/1.1 " + want) and out.count(b"HTTP/1.1") == 1, "%r -> %r: %r" % (head, want, out[:200]))
    out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Encoding: identity\r\nContent-Length: 16\r\n"
              b"Connection: close\r\n\r\n{\"prompt\": \"ab\"}")
    check(out.startswith(b"HTTP/1.1 200"), "Content-Encoding: identity is taken: %r" % out[:200])
    # a space before the colon is refused, not honoured (RFC 9112 5.1): no framing a proxy reads otherwise
    for head in (b"Transfer-Encoding : gzip, chunked", b"Content-Length : 16", b"Host : x", b"X\tY: 1"):
        out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n\r\n{\"prompt\": \"ab\"}")
        check(out.startswith(b"HTTP/1.1 400") and (b"header field name" in out or b"\t" in head) and
              out.count(b"HTTP/1.1") == 1,
              "%r -> 400: %r" % (head, out[:200]))
    out = raw(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n\r\n{\"prompt\": \"ab\"}")
    check(out.startswith(b"HTTP/1.1 411") and b"Content-Length" in out and out.count(b"HTTP/1.1") == 1,
          "POST without a length -> 411 alone: %r" % out[:300])
    # Expect: 100-continue
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
    first = s.recv(100)
    check(first.startswith(b"HTTP/1.1 100 Continue"), "100 Continue: %r" % first)
    s.sendall(b'{"prompt":"ab"}')
    rest = recv_until(s)
    s.close()
    check(b"[257,97,98]" in rest, "body after 100-continue")
    # keep-alive on one http.client connection
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(5):
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        check(r.status == 200, "keep-alive request %d" % i)
    c.close()


def stream_client(port, prompt, max_tokens, results, idx):
    try:
        st, hd, data = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "stream": True}, timeout=60)
        evs, done, _ = sse_events(data)
        results[idx] = (st, "".join(e["choices"][0]["text"] for e in evs), done)
    except Exception as e:  # noqa: BLE001
        results[idx] = (0, repr(e), False)


def test_concurrent(port, n=64):
    results = [None] * n
    ths = [threading.Thread(target=stream_client, args=(port, "client %d says" % i, 24 + i % 9, results, i)) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    ok = 0
    for i, r in enumerate(results):
        toks, _, _, _ = R.generate(R.encode("client %d says" % i), 24 + i % 9)
        if r and r[0] == 200 and r[2] and r[1] == R.text_of(toks):
            ok += 1
        else:
            print("client", i, r, flush=True)
    check(ok == n, "%d concurrent streaming clients correct (%d ok)" % (n, ok))


def test_disconnect(port):
    before = metric(port, 'mlaserve_requests_total{model="fake-model",finish_reason="cancelled"}')
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = json.dumps({"prompt": "long one", "max_tokens": 1500, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < 5:
        got += s.recv(4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
    s.close()
    # others are served meanwhile and afterwards
    toks, _, _, _ = R.generate(R.encode("after"), 10)
    st, j, _, _ = post(port, "/v1/completions", {"prompt": "after", "max_tokens": 10})
    check(st == 200 and j["choices"][0]["text"] == R.text_of(toks), "served after an abrupt disconnect")
    deadline = time.time() + 20
    while time.time() < deadline:
        if metric(port, "mlaserve_num_requests_running") == 0 and \
                metric(port, 'mlaserve_requests_total{model="fake-model",finish_reason="cancelled"}') == before + 1:
            break
        time.sleep(0.05)
    check(metric(port, "mlaserve_num_requests_running") == 0, "disconnected stream cancelled in the scheduler")
    check(metric(port, "mlaserve_kv_cache_blocks_used") == 0, "its cache blocks freed")
    # a client that goes away during a non-streamed request
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = json.dumps({"prompt": "long two", "max_tokens": 1500}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    time.sleep(0.1)
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline and metric(port, "mlaserve_num_requests_running") != 0:
        time.sleep(0.05)
    check(metric(port, "mlaserve_num_requests_running") == 0, "non-streamed request cancelled on disconnect")
    # a client that leaves a response of three streamed choices: all three are cancelled
    before = metric(port, 'mlaserve_requests_total{model="fake-model",finish_reason="cancelled"}')
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = json.dumps({"prompt": "long three", "max_tokens": 1500, "stream": True, "n": 3}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b"data: ") < 8:
        got += s.recv(4096)
    check(b'"index":2' in got or b'"index":1' in got, "three choices streamed: %r" % got[-300:])
    s.close()
    ok = wait_for(lambda: metric(port, "mlaserve_num_requests_running") == 0 and
                  metric(port, 'mlaserve_requests_total{model="fake-model",finish_reason="cancelled"}') == before + 3, 20)
    check(ok, "the three choices of a stream its client left are cancelled")
    check(metric(port, "mlaserve_kv_cache_blocks_used") == 0, "their cache blocks freed")


def test_metrics(port):
    st, hd, data = request(port, "GET", "/metrics")
    t = data.decode()
    check(st == 200 and hd.get("Content-Type", "").startswith("text/plain"), "/metrics 200 text/plain")
    for name in ("mlaserve_time_to_first_token_seconds_bucket", "mlaserve_inter_token_latency_seconds_count",
                 "mlaserve_num_requests_waiting", "mlaserve_kv_cache_usage_ratio", "mlaserve_prompt_tokens_total",
                 "mlaserve_generation_tokens_total", "# TYPE mlaserve_time_to_first_token_seconds histogram"):
        check(name in t, "metrics has " + name)
    check(metric(port, 'mlaserve_time_to_first_token_seconds_count{model="fake-model"}') > 0, "ttft observed")
    check(metric(port, 'mlaserve_generation_tokens_total{model="fake-model"}') > 100, "tokens out counted")
    # each finished request is observed once, also one that a stop string ends and one whose prompt
    # comes from the prefix cache; counted by the time its answer is in (a stop string's too,
    # though the scheduler lets go of it a step later)
    names = ("mlaserve_request_prompt_tokens_count", "mlaserve_request_generation_tokens_count",
             'mlaserve_requests_total{model="fake-model",finish_reason="stop"}',
             'mlaserve_requests_total{model="fake-model",finish_reason="length"}')
    before = [metric(port, n) or 0 for n in names]
    body = {"prompt": "metrics " * 40, "max_tokens": 12, "temperature": 0}
    st, j, _, _ = post(port, "/v1/completions", body)
    text = j["choices"][0]["text"] if st == 200 else ""
    st2, j2, _, _ = post(port, "/v1/completions", dict(body, stop=[text[4:7]])) if len(text) >= 7 else (0, {}, 0, 0)
    check(st == 200 and st2 == 200 and j2["choices"][0]["finish_reason"] == "stop", "a stop-string finish (%r)" % text)
    after = [metric(port, n) or 0 for n in names]
    check([a - b for a, b in zip(after, before)] == [2, 2, 1, 1],
          "observed twice each, one stop and one length, as the answers are in: %r -> %r" % (before, after))
    time.sleep(0.5)  # and not again when the scheduler lets go of the stopped one
    later = [metric(port, n) or 0 for n in names]
    check(later == after, "counted once: %r -> %r" % (after, later))


# ---------------------------------------------------------------- second server: limits, auth
def test_limits(exe):
    hf = os.path.join(os.environ.get("TMPDIR", "/tmp"), "mla_health_%d" % os.getpid())
    if os.path.exists(hf):
        os.unlink(hf)
    srv = R.Server(exe, "--api-key", "sekrit", "--max-body", 4096, "--max-queue", 2, "--max-seqs", 1,
                   "--step-delay-ms", 20, "--max-context", 64, "--request-timeout-ms", 500,
                   "--idle-timeout-ms", 3000, "--max-conns", 8, "--health-file", hf, "--eos-period", 7)
    port = srv.port
    auth = {"Authorization": "Bearer sekrit"}
    try:
        st, j, _, hd = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2})
        check(st == 401 and "WWW-Authenticate" in hd, "no key 401")
        is_error_shape(j)
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"Authorization": "Bearer nope"})
        check(st == 401, "wrong key 401")
        # Anthropic's clients send the key as x-api-key
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"x-api-key": "sekrit"})
        check(st == 200, "x-api-key taken as the key", j)
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2}, headers={"X-Api-Key": "nope"})
        check(st == 401, "a wrong x-api-key 401")
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2},
                           headers={"x-api-key": "sekrit", "Authorization": "Bearer sekrit"})
        check(st == 200, "x-api-key beside Authorization, one key: taken", j)
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2},
                           headers={"x-api-key": "other", "Authorization": "Bearer sekrit"})
        check(st == 400 and "different keys" in j["error"]["message"], "x-api-key and Authorization of two keys: 400",
              j)
        # Anthropic's routes answer errors in its form ("type": "error", its type names): the server's
        # own (a body too large by its Content-Length or as it streams in, a URL in absolute form) and
        # the API's (a refused key, a method, JSON it cannot read); the other routes keep OpenAI's
        key = {"x-api-key": "sekrit"}

        def anthropic_error(what, st, data, status, etype):
            try:
                j = json.loads(data)
            except ValueError:
                j = None
            check(st == status and isinstance(j, dict) and j.get("type") == "error" and
                  isinstance(j.get("error"), dict) and j["error"].get("type") == etype and
                  isinstance(j["error"].get("message"), str) and j["error"]["message"], what, data[:300])

        st, _, data, _ = post(port, "/v1/messages", {"model": "m", "max_tokens": 2, "messages": []},
                              headers={"x-api-key": "nope"})
        anthropic_error("a wrong x-api-key on /v1/messages", st, data, 401, "authentication_error")
        st, _, data, _ = post(port, "/v1/messages/count_tokens", "{", headers=key)
        anthropic_error("JSON it cannot read on count_tokens", st, data, 400, "invalid_request_error")
        st, _, data, _ = post(port, "/v1/messages", {"prompt": "y" * 5000}, headers=key)
        anthropic_error("a body past --max-body on /v1/messages", st, data, 413, "request_too_large")
        st, _, data = request(port, "GET", "/v1/messages/", headers=key)
        anthropic_error("GET /v1/messages", st, data, 405, "invalid_request_error")
        out = raw(port, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sekrit\r\nTransfer-Encoding: chunked\r\n"
                  b"Connection: close\r\n\r\n1388\r\n" + b"y" * 5000 + b"\r\n0\r\n\r\n")
        head, _, data = out.partition(b"\r\n\r\n")
        anthropic_error("a chunked body past --max-body", int(head.split(b" ")[1]), data, 413, "request_too_large")
        out = raw(port, b"POST http://x/v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nx-api-key: nope\r\n"
                  b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
        head, _, data = out.partition(b"\r\n\r\n")
        anthropic_error("a URL in absolute form", int(head.split(b" ")[1]), data, 401, "authentication_error")
        out = raw(port, b"GET /v1/messages?" + b"q" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, data = out.partition(b"\r\n\r\n")
        anthropic_error("a URL past the limit on /v1/messages", int(head.split(b" ")[1]), data, 414,
                        "invalid_request_error")
        # the form is the request's: a /v1/messages error, then on the same connection a request
        # line that is not one, in OpenAI's form
        out = raw(port, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sekrit\r\nContent-Length: 1\r\n\r\n{"
                  b"BLAH BLAH\r\n\r\n")
        parts = out.split(b"HTTP/1.1 ")
        first = parts[1].partition(b"\r\n\r\n")[2] if len(parts) == 3 else b""
        second = parts[2].partition(b"\r\n\r\n")[2] if len(parts) == 3 else b""
        anthropic_error("keep-alive: the Messages error", 400 if len(parts) == 3 else 0, first, 400,
                        "invalid_request_error")
        check(len(parts) == 3 and parts[2].startswith(b"400") and json.loads(second).get("type") is None and
              json.loads(second)["error"]["type"] == "invalid_request_error", "keep-alive: the next error in OpenAI's form",
              out[-400:])
        st, j, _, _ = post(port, "/v1/completions", "{", headers=key)
        check(st == 400 and "type" not in j, "the other routes keep OpenAI's form", j)
        is_error_shape(j)
        # OpenAI's type names where Anthropic's differ
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "y" * 5000}, headers=key)
        check(st == 413 and j["error"]["type"] == "invalid_request_error", "413: invalid_request_error", j)
        st, j, _, _ = post(port, "/v1/completions", {"model": "nope", "prompt": "y"}, headers=key)
        check(st == 404 and j["error"]["type"] == "not_found_error", "404: not_found_error", j)
        st, hd, data = request(port, "GET", "/health")
        check(st == 200, "/health needs no key")
        # EOS (eos period 7): stops with finish stop, EOS not in the text
        pids = R.encode("eos test")
        toks, _, _, fin = R.generate(pids, 40, eos_period=7, max_context=64)
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "eos test", "max_tokens": 40}, headers=auth)
        check(st == 200 and j["choices"][0]["text"] == R.text_of(toks) and j["choices"][0]["finish_reason"] == fin, "EOS ends generation (%s)" % fin)
        check(j["usage"]["completion_tokens"] == len(toks), "EOS counted")
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "eos test", "max_tokens": 40, "ignore_eos": True}, headers=auth)
        # with ignore_eos the EOS token is generated like any other (rendered as nothing)
        check(st == 200 and j["choices"][0]["finish_reason"] == "length", "ignore_eos runs to the length")
        # body too large
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "y" * 5000}, headers=auth)
        check(st == 413, "body too large 413 (got %d)" % st)
        # prompt over the context
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "z" * 70}, headers=auth)
        check(st == 400 and j["error"]["code"] == "context_length_exceeded", "prompt over context 400")
        # prompt + completion over the context: the error names the field the client sent
        for field in ("max_tokens", "max_completion_tokens"):
            st, j, _, _ = post(port, "/v1/completions", {"prompt": "z" * 10, field: 60}, headers=auth)
            check(st == 400 and j["error"]["code"] == "context_length_exceeded" and j["error"]["param"] == field,
                  "completion over the context names %s" % field, j)
        # health callback
        open(hf, "w").close()
        st, hd, data = request(port, "GET", "/health")
        check(st == 503 and "worker" in json.loads(data)["error"]["message"], "/health 503 when a worker is down")
        os.unlink(hf)
        st, hd, data = request(port, "GET", "/health")
        check(st == 200, "/health back to 200")
        # slow client: partial request -> 408 after the request timeout, others unaffected
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        t0 = time.time()
        st, hd, data = request(port, "GET", "/health")
        check(st == 200, "served while a slow client dawdles")
        out = b""
        try:
            while True:
                d = s.recv(4096)
                if not d:
                    break
                out += d
        except socket.timeout:
            pass
        s.close()
        check(out.startswith(b"HTTP/1.1 408"), "slow client gets 408: %r" % out[:40])
        check(time.time() - t0 < 9, "slow client dropped within the request timeout")
        # too many queued: max_seqs 1, max_queue 2, 20 ms a step. One streamed request is running
        # first (its first token has come back), so the queue's two places are free and the later
        # seven race only for them: at least two are taken, at least one is refused with 429.
        body = json.dumps({"prompt": "q-first", "max_tokens": 40, "ignore_eos": True, "stream": True}).encode()
        first = socket.create_connection(("127.0.0.1", port), timeout=30)
        first.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        head = recv_until(first, b"data: ")
        check(head.startswith(b"HTTP/1.1 200") and b"data: " in head, "first queued request streams: %r" % head[:40])
        results, retry_after = [None] * 7, [None] * 7

        def longreq(i):
            r = post(port, "/v1/completions", {"prompt": "q%d" % i, "max_tokens": 40, "ignore_eos": True}, headers=auth)
            results[i], retry_after[i] = r[0], r[3].get("Retry-After")
        ths = [threading.Thread(target=longreq, args=(i,)) for i in range(7)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(60)
        check(set(results) <= {200, 429} and results.count(429) >= 1 and results.count(200) >= 2,
              "too many queued -> 429: %r" % results)
        check(all(ra == "1" for st, ra in zip(results, retry_after) if st == 429), "a 429 says Retry-After: %r" % retry_after)
        rest = recv_until(first, b"data: [DONE]", head)
        first.close()
        check(b"data: [DONE]" in rest, "the running request finished beside the refusals")
        # a streamed answer whose first token ends it (no text at all): one empty final chunk
        eos_prompt = next(x for x in ("e%d" % i for i in range(400)) if R.fake_next(R.encode(x), 7)[0] == R.EOS)
        for n in (1, 2):
            st, hd, data = request(port, "POST", "/v1/completions", {"prompt": eos_prompt, "max_tokens": 5, "stream": True,
                                                                     "n": n}, headers=auth)
            evs, done, _ = sse_events(data)
            check(st == 200 and done and "".join(c["text"] for e in evs for c in e["choices"]) == "" and
                  sorted(c["index"] for e in evs for c in e["choices"] if c["finish_reason"] == "stop") == list(range(n)),
                  "a streamed answer of no text, n=%d" % n, data[-300:])
        # n choices are taken all or none. More than the server takes at once (one running place,
        # two waiting) can never be: 400. Three beside a running stream find two places: 429, and
        # the two taken go again
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "five", "max_tokens": 3, "n": 4}, headers=auth)
        check(st == 400 and j["error"]["param"] == "n" and "at most 3 requests at once" in j["error"]["message"],
              "n=4 past what the server takes: 400 (%d %r)" % (st, j))
        body = json.dumps({"prompt": "q-long", "max_tokens": 50, "ignore_eos": True, "stream": True}).encode()
        first = socket.create_connection(("127.0.0.1", port), timeout=30)
        first.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        head = recv_until(first, b"data: ")
        names = ('mlaserve_requests_total{model="fake-model",finish_reason="cancelled"}',
                 'mlaserve_prompt_tokens_total{model="fake-model"}')
        before = [metric(port, x) for x in names]
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "three", "max_tokens": 3, "n": 3}, headers=auth)
        check(st == 429 and j["error"]["code"] == "too_many_requests" and "--max-queue is 2" in j["error"]["message"],
              "n=3 beside a stream: 429 naming the cap (%d %r)" % (st, j))
        # the room for all three is looked at first: none was queued (choices taken, then given
        # back at the next step, would count against --max-queue for the request behind)
        check(metric(port, "mlaserve_num_requests_waiting") == 0, "a refused n=3 left nothing in the queue")
        check([metric(port, x) for x in names] == before, "a refused request is in no count (cancelled, prompt tokens)",
              (before, [metric(port, x) for x in names]))
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "one", "max_tokens": 2}, headers=auth)
        check(st == 200, "the request right behind a refused n=3 is taken (%d %r)" % (st, j))
        rest = recv_until(first, b"data: [DONE]", head)
        first.close()
        check(b"data: [DONE]" in rest, "the stream finished beside the refusal")
        st, j, _, _ = post(port, "/v1/completions", {"prompt": "two", "max_tokens": 3, "n": 3}, headers=auth)
        check(st == 200 and len(j["choices"]) == 3, "n=3 served on an idle server (%d)" % st)
        # max connections: 8 connections inside their request head (a slowloris): the 9th client
        # closes the one that has been at it longest and is served (connections with a request
        # body in flight are kept, then 503: tests/serve/test_harden.py)
        socks = []
        for _ in range(8):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            socks[-1].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            time.sleep(0.02)
        time.sleep(0.2)
        out = raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        check(out.startswith(b"HTTP/1.1 200"), "connection limit, heads stalled -> served: %r" % out[:40])
        socks[0].settimeout(2)
        try:
            first_gone = socks[0].recv(100) == b""
        except OSError:
            first_gone = True
        check(first_gone, "the longest-stalled head was closed for it")
        for s in socks:
            s.close()
        time.sleep(0.2)
        st, hd, data = request(port, "GET", "/health")
        check(st == 200, "served again after connections closed")
    finally:
        rc = srv.stop()
        check(rc == 0, "limits server clean exit (%r)\n%s" % (rc, srv.logtext()[-2000:]))


def test_backend_failure(exe):
    srv = R.Server(exe, "--fail-at-step", 0)
    try:  # three choices in the failed step: one answer, the error
        st, j, _, _ = post(srv.port, "/v1/completions", {"prompt": "x", "max_tokens": 4, "n": 3})
        check(st == 500 and "worker 1 is down" in j["error"]["message"], "backend failure -> 500 with the reason: %r" % j)
        st, j, _, _ = post(srv.port, "/v1/completions", {"prompt": "x", "max_tokens": 4})
        check(st == 200, "served after a failed step")
    finally:
        check(srv.stop() == 0, "failure server clean exit")


def test_user(exe):
    """OpenAI's "user" (the end user's id): taken, and written in the request's debug log line;
    bounded and free of control characters (a log line stays one line)"""
    srv = R.Server(exe, "--log-level", "debug")
    try:
        st, j, _, _ = post(srv.port, "/v1/completions", {"prompt": "x", "max_tokens": 3, "user": "alice-7"})
        check(st == 200, "user taken: %r" % j)
        for bad in (1, "x" * 257, "a\nb", "\u00e9\u0085x", "\u009f"):  # C0 and C1 controls
            st, j, _, _ = post(srv.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                                  "max_tokens": 3, "user": bad})
            check(st == 400 and j["error"]["param"] == "user", "user %r -> 400: %r" % (bad, j))
    finally:
        check(srv.stop() == 0, "user server clean exit")
    check(re.search(r'cmpl-[0-9a-f]+ \(user "alice-7"\): 2 prompt \+ 3 completion tokens, length', srv.logtext()),
          "the request's log line names its user")


def test_long_prefill(exe):
    """--long-prefill-tokens: a short request sent while a long prompt (6001 tokens, more than the
    limit) is being prefilled finishes before the long one's first token; with the limit off it
    waits for that prefill (the order of events, not their times)"""
    def run(limit):
        srv = R.Server(exe, "--max-context", 8192, "--n-blocks", 1024, "--step-tokens", 32, "--step-delay-ms", 5,
                       "--max-seqs", 16, "--long-prefill-tokens", limit)
        at = {}
        started = threading.Event()
        try:
            def long_one():
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
                c.request("POST", "/v1/completions", json.dumps({"prompt": "H" * 6000, "max_tokens": 2, "stream": True}),
                          {"Content-Type": "application/json"})
                r = c.getresponse()  # the stream's headers: the request is with the scheduler
                at["long_status"] = r.status
                started.set()
                while True:
                    line = r.readline()
                    if not line:
                        break
                    if line.startswith(b"data: {") and "long_first" not in at:
                        at["long_first"] = time.monotonic()
                c.close()
            t = threading.Thread(target=long_one)
            t.start()
            started.wait(30)
            time.sleep(0.05)  # the long prompt is in its prefill (6001 tokens, <= 32 a step, 5 ms a step)
            st, j, _, _ = post(srv.port, "/v1/completions", {"prompt": "short", "max_tokens": 2})
            at["short_done"] = time.monotonic()
            t.join(60)
            check(st == 200 and at.get("long_status") == 200 and "long_first" in at,
                  "limit %d: both answered (%r, %r)" % (limit, st, at))
        finally:
            check(srv.stop() == 0, "long-prefill server (limit %d) clean exit" % limit)
        return at.get("short_done", 0) < at.get("long_first", 0)
    check(run(128), "limit 128: the short request finished before the long prompt's first token")
    check(not run(0), "no limit: the short request waited for the long prompt's prefill")


def main():
    srv = R.Server(EXE, "--step-delay-ms", 2)
    try:
        for t in (test_basic, test_completions, test_stream_completions, test_chat, test_stops, test_errors,
                  test_http_level, test_concurrent, test_disconnect, test_metrics):
            t0 = time.time()
            t(srv.port)
            print("%-28s %.2fs" % (t.__name__, time.time() - t0), flush=True)
    finally:
        rc = srv.stop()
        check(rc == 0, "main server clean exit (%r)" % rc)
        if FAILS:
            print(srv.logtext()[-3000:])
    for t in (test_limits, test_backend_failure, test_user, test_long_prefill):
        t0 = time.time()
        t(EXE)
        print("%-28s %.2fs" % (t.__name__, time.time() - t0), flush=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
