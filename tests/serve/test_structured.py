"""Structured output and logit_bias through `mlaserve serve` on the tiny-deepseek3 fixture (CPU workers).

1. Constrained requests (response_format json_schema on chat and completions, json_object, a GBNF
   grammar), greedy and seeded, sent all at once together with unconstrained ones: every
   constrained output that finished must parse as JSON and validate against its schema with the
   Python `jsonschema` package (a grammar output is checked with Python's `re`); every
   unconstrained answer must equal the same request's answer on its own (no constrained
   neighbour). At least most constrained outputs must finish (stop, not length).
2. The same constrained requests on a server with a small pool, chunked prefill and the prefix
   cache (preemption and recompute): the greedy answers must equal those of the roomy server (the
   grammar state follows the tokens actually generated).
3. logit_bias: +100 on a token makes greedy output that token only; -100 on the token greedy picks
   bans it.
4. Token elements: a grammar through a control token (<[id]>), and one free (!<[id]>) until it.
5. Refusals: an unsupported schema keyword, a bad grammar, left recursion, logit_bias ids out of
   range, too many entries, values beyond 100, a grammar's token id outside the vocabulary or an
   end-of-sequence one, a response_format member its type does not take: each a
   400 naming the problem.
Usage: test_structured.py SERVE_EXE WORKER_EXE FIXTURES_DIR. Exit 77 when the fixture or
jsonschema is missing."""
import json
import os
import re
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import ServeProcess, check, http_get, http_post as post, summary  # noqa: E402

try:
    import jsonschema
except ImportError:
    print("python jsonschema missing (scripts/install-deps.sh --test): skipped")
    sys.exit(77)

exe, worker, fixtures = sys.argv[1], sys.argv[2], sys.argv[3]
model = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
if not os.path.exists(model):
    print("fixture missing: skipped")
    sys.exit(77)

SCHEMAS = [
    {"type": "object",
     "properties": {"name": {"type": "string", "maxLength": 12},
                    "age": {"type": "integer"},
                    "ok": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}},
     "required": ["name", "age", "ok", "tags"], "additionalProperties": False},
    {"type": "object",
     "properties": {"kind": {"const": "point"},
                    "x": {"type": "number"}, "y": {"type": ["number", "null"]},
                    "note": {"type": "string", "minLength": 1, "maxLength": 6}},
     "required": ["kind", "x"]},
    {"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"],
                        "additionalProperties": False}},
     "type": "object",
     "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 3},
                    "choice": {"anyOf": [{"type": "boolean"}, {"enum": ["yes", "no", 3]}]}},
     "required": ["items", "choice"], "additionalProperties": False},
    {"type": "array", "items": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 4}]},
     "minItems": 2, "maxItems": 4},
]
GRAMMAR = 'root ::= "answer: " ("yes" | "no") " (" [0-9]{1,3} ")"'
GRAMMAR_RE = re.compile(r"answer: (yes|no) \([0-9]{1,3}\)")
PROMPTS = ["Give me a record.", "The quick brown fox", "Once upon a time", "JSON please:"]


def constrained_reqs():
    out = []
    for i, sc in enumerate(SCHEMAS):
        for j, pr in enumerate(PROMPTS[:3]):
            rf = {"type": "json_schema", "json_schema": {"name": "s%d" % i, "schema": sc, "strict": True}}
            samp = {"temperature": 0} if j != 2 else {"temperature": 1.0, "seed": 7 + i}
            if (i + j) % 2:
                body = {"messages": [{"role": "user", "content": pr}], "response_format": rf, "max_tokens": 300}
                out.append(("/v1/chat/completions", dict(body, **samp), sc))
            else:
                body = {"prompt": pr, "response_format": rf, "max_tokens": 300}
                out.append(("/v1/completions", dict(body, **samp), sc))
    for pr in PROMPTS[:2]:
        out.append(("/v1/completions", {"prompt": pr, "response_format": {"type": "json_object"}, "max_tokens": 160,
                                        "temperature": 0}, "object"))
    for pr in PROMPTS:
        out.append(("/v1/completions", {"prompt": pr, "grammar": GRAMMAR, "max_tokens": 40, "temperature": 0},
                    "grammar"))
    return out


FREE = [("/v1/completions", {"prompt": p, "max_tokens": 24, "temperature": 0, "logprobs": 1}) for p in PROMPTS] + \
       [("/v1/chat/completions", {"messages": [{"role": "user", "content": p}], "max_tokens": 24, "temperature": 0})
        for p in PROMPTS[:2]]


def run_all(port, reqs):
    out = {}

    def go(i):
        out[i] = post(port, reqs[i][0], reqs[i][1], timeout=600)
    ths = [threading.Thread(target=go, args=(i,)) for i in range(len(reqs))]
    [t.start() for t in ths]
    [t.join(900) for t in ths]
    return out


def text_of(path, data):
    c = json.loads(data)["choices"][0]
    return (c["message"]["content"] if "chat" in path else c["text"]), c["finish_reason"], c


def check_constrained(name, reqs, res):
    done = 0
    texts = {}
    for i, (path, body, sc) in enumerate(reqs):
        st, data = res.get(i, (0, b""))
        check(st == 200, "%s %d: status %s %r" % (name, i, st, data[:300]))
        if st != 200:
            continue
        txt, fin, _ = text_of(path, data)
        texts[i] = txt
        if fin != "stop":
            check(fin == "length", "%s %d: finish %s" % (name, i, fin))
            continue
        done += 1
        if sc == "grammar":
            check(GRAMMAR_RE.fullmatch(txt) is not None, "%s %d: grammar output %r" % (name, i, txt))
            continue
        try:
            doc = json.loads(txt)
        except ValueError as e:
            check(False, "%s %d: not JSON (%s): %r" % (name, i, e, txt))
            continue
        if sc == "object":
            check(isinstance(doc, dict), "%s %d: json_object gave %r" % (name, i, txt))
            continue
        try:
            jsonschema.validate(doc, sc)
            check(True, "valid")
        except jsonschema.ValidationError as e:
            check(False, "%s %d: %r does not validate: %s" % (name, i, txt, e.message))
    check(done * 4 >= len(reqs) * 3, "%s: %d of %d constrained outputs finished" % (name, done, len(reqs)))
    print("%s: %d of %d constrained outputs finished and were checked" % (name, done, len(reqs)))
    return texts


common = ["--max-context", "1024"]
roomy = ServeProcess([exe, "-m", model, "--port", "0"], common + ["--max-seqs", "64"], worker=worker, timeout=120,
                     prefix="structured_a_")
tight = None
try:
    port = roomy.port
    # the unconstrained requests on their own
    alone = run_all(port, FREE)
    creqs = constrained_reqs()
    mixed = run_all(port, [(p, b) for p, b, _ in creqs] + FREE)
    ta = check_constrained("roomy", creqs, mixed)
    for k in range(len(FREE)):
        sa, da = alone.get(k, (0, b""))
        sm, dm = mixed.get(len(creqs) + k, (0, b""))
        check(sa == 200 and sm == 200, "free %d: %s %s" % (k, sa, sm))
        if sa == 200 and sm == 200:
            xa, xm = json.loads(da)["choices"][0], json.loads(dm)["choices"][0]
            same = text_of(FREE[k][0], da)[0] == text_of(FREE[k][0], dm)[0]
            if "logprobs" in FREE[k][1]:
                la, lm = xa["logprobs"]["token_logprobs"], xm["logprobs"]["token_logprobs"]
                same = same and len(la) == len(lm) and all(abs(x - y) <= 1e-5 for x, y in zip(la, lm))
            check(same, "free %d equals its answer without constrained neighbours" % k)

    # preemption, recompute, prefix cache: the same greedy constrained answers
    st, m0 = http_get(port, "/metrics")
    m0 = m0.decode() if isinstance(m0, bytes) else m0
    bbytes = [int(float(l.split()[-1])) for l in m0.splitlines() if l.startswith("mlaserve_kv_cache_block_bytes")][0]
    tight = ServeProcess([exe, "-m", model, "--port", "0"],
                         common + ["--kv-memory", str(24 * bbytes), "--max-seqs", "8", "--max-prefill-tokens", "32"],
                         worker=worker, timeout=120, prefix="structured_b_")
    twice = creqs + creqs[:6]  # the second copies hit the prefix cache
    res_t = run_all(tight.port, [(p, b) for p, b, _ in twice])
    tb = check_constrained("tight", twice, res_t)
    for i, (path, body, sc) in enumerate(twice):
        if body.get("temperature") == 0 and i in tb and (i % len(creqs)) in ta:
            check(tb[i] == ta[i % len(creqs)], "tight %d equals the roomy answer: %r vs %r" % (i, tb[i], ta[i % len(creqs)]))
    st, m = http_get(tight.port, "/metrics")
    m = m.decode() if isinstance(m, bytes) else m
    pre = sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith("mlaserve_preemptions_total"))
    print("tight pool: %d preemptions" % pre)
    check(pre > 0, "the tight pool preempted")

    # logit_bias
    st, d = post(port, "/tokenize", {"prompt": " the", "add_special_tokens": False})
    tid = json.loads(d)["tokens"][-1]
    st, d = post(port, "/detokenize", {"tokens": [tid] * 5})
    want = json.loads(d)["prompt"]
    st, d = post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 5, "temperature": 0,
                                           "logit_bias": {str(tid): 100}})
    check(st == 200 and json.loads(d)["choices"][0]["text"] == want, "+100: %r vs %r" % (d[:200], want))
    st, d = post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0, "logprobs": 1})
    first = json.loads(d)["choices"][0]["text"]
    st, d = post(port, "/tokenize", {"prompt": first, "add_special_tokens": False})
    toks = json.loads(d)["tokens"]
    check(len(toks) == 1, "the greedy first token %r is one token" % first)
    st, d = post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0,
                                           "logit_bias": {str(toks[0]): -100}})
    check(st == 200 and json.loads(d)["choices"][0]["text"] != first, "-100 bans %r: %r" % (first, d[:200]))

    # token elements: a control token of the vocabulary (<｜Assistant｜>) inside a grammar's output,
    # and a free run until it (!<[id]>), the text after it held to the grammar
    st, d = post(port, "/tokenize", {"prompt": "<｜Assistant｜>", "add_special_tokens": False})
    atok = json.loads(d)["tokens"]
    check(st == 200 and len(atok) == 1, "<｜Assistant｜> is one token: %r" % (atok,))
    ctl = "<｜Assistant｜>"
    for g, rx in (('root ::= "yes" <[%d]> [a-z ]{1,8}' % atok[0], re.escape("yes" + ctl) + "[a-z ]{1,8}"),
                  ('root ::= (!<[%d]>){2,6} <[%d]> "ok"' % (atok[0], atok[0]), "(?s).*" + re.escape(ctl) + "ok")):
        st, d = post(port, "/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0, "grammar": g,
                                               "skip_special_tokens": False})
        txt = json.loads(d)["choices"][0]["text"] if st == 200 else ""
        check(st == 200 and re.fullmatch(rx, txt) is not None and txt.count(ctl) == 1,
              "grammar %s: %s %r" % (g, st, d[:300]))

    # refusals
    def refused(body, needle, path="/v1/completions"):
        st, d = post(port, path, dict({"prompt": "x", "max_tokens": 2}, **body))
        msg = json.loads(d)["error"]["message"] if st == 400 else ""
        check(st == 400 and needle in msg, "400 with %r: %s %r" % (needle, st, d[:300]))
    rf = lambda sc: {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": sc}}}
    refused(rf({"type": "string", "pattern": "^a"}), "'pattern'")
    refused(rf({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}}}), "'minimum'")
    refused(rf({"type": "object", "properties": {}, "required": ["b"]}), "'b'")
    refused(rf({"$ref": "#/$defs/nope"}), "points to nothing")
    refused({"grammar": "root ::= \"a"}, "unterminated string")
    refused({"grammar": "root ::= root \"a\" | \"b\""}, "left recursion")
    refused({"grammar": "root ::= foo"}, "'foo'")
    refused({"grammar": "root ::= [^\\x00-\\U0010FFFF]"}, "matches no text")
    refused({"grammar": "root ::= (\"a\"{0,100}){0,100} \"b\""}, "ambiguous")
    refused({"grammar": "root ::= \"a\" <[99999999]>"}, "outside the vocabulary")
    refused({"grammar": "root ::= <think>"}, "token text is not supported")
    refused({"logit_bias": {"99999999": 1}}, "out of range")
    refused({"logit_bias": {"1": 101}}, "[-100, 100]")
    refused({"logit_bias": {"x": 1}}, "not a token id")
    refused({"logit_bias": {str(i): 1 for i in range(301)}}, "at most 300")
    refused({"response_format": {"type": "yaml"}}, "json_schema")
    refused({"response_format": {"type": "json_object", "extra": 1}}, "'response_format.extra' does not apply")
    st, d = post(port, "/tokenize", {"prompt": "<\uff5cend\u2581of\u2581sentence\uff5c>", "add_special_tokens": False})
    eos = json.loads(d)["tokens"]
    check(len(eos) == 1, "the end-of-sequence text is one token: %r" % eos)
    refused({"grammar": "root ::= \"a\" <[%d]>" % eos[0]}, "an end-of-generation token")
    st, d = post(port, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    check(st == 200, "still serving")

    # grammars the matcher cannot expand (more than GRAM_MAX_EMPTY_RUN rule references in a row
    # before a character): at the start or after a first character, the request is refused by name
    # (400: the check tries every first byte) and the server keeps serving; met later, the worker
    # ends that sequence alone and its request fails naming the bound (500, or an error event in a
    # stream) while the others go on. Neither fails the worker group.
    refs = "".join('r%d ::= "x%d" | r%d\n' % (i, i, i + 1) for i in range(2100)) + 'r2100 ::= "end"\n'
    fragile = ServeProcess([exe, "-m", model, "--port", "0"], common, worker=worker, timeout=120,
                           prefix="structured_c_")
    def with_grammar(g, max_tokens):
        try:
            return post(fragile.port, "/v1/completions", {"prompt": "x", "max_tokens": max_tokens, "grammar": g}, timeout=60)
        except OSError as e:  # a timeout included
            return 0, repr(e).encode()

    try:
        for g, where in (("root ::= r0\n", "at the start"), ('root ::= "a" ( "b" | r0 )\n', "after the first character")):
            st, d = with_grammar(g + refs, 2)
            check(st == 400 and b"references in a row" in d,
                  "a reference chain too long for the matcher %s is refused by name: %s %r" % (where, st, d[:300]))
        late = 'root ::= "a" "b" ( "c" | r0 )\n' + refs
        st, d = with_grammar(late, 4)
        msg = json.loads(d)["error"]["message"] if st == 500 else ""
        check(st == 500 and "references in a row" in msg and "generated token" in msg,
              "a chain met after two characters fails that request naming the bound: %s %r" % (st, d[:300]))
        # streamed: the text so far, then an error event naming it, then [DONE]
        st, d = post(fragile.port, "/v1/completions", {"prompt": "x", "max_tokens": 4, "grammar": late,
                                                       "stream": True}, timeout=60)
        events = [l[6:] for l in d.decode().split("\n") if l.startswith("data: ")]
        errs = [json.loads(e)["error"]["message"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
        check(st == 200 and events[-1:] == ["[DONE]"] and len(errs) == 1 and "references in a row" in errs[0],
              "streamed, the failure is an error event: %s %r" % (st, d[-400:]))
        st, d = post(fragile.port, "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=60)
        check(st == 200, "still serving after them: %s %r" % (st, d[:200]))
        hs, hd = http_get(fragile.port, "/health", timeout=10)
        check(hs == 200, "the worker group is healthy: %s %r" % (hs, hd[:200]))
    finally:
        fragile.stop()
finally:
    if tight:
        tight.stop()
    roomy.stop()
sys.exit(summary("structured: "))
