"""Tool calls held to the model's format on a real engine: `mlaserve serve` (CPU workers) of small
synthetic DeepSeek-V3 and GLM-5 files (`mlaserve mkmodel --small`: random weights, the real
vocabularies' chat and tool-call markers as control tokens) with short templates that name the
tools. A request names a strict tool (tool_choice: that function, one call) and biases
the format's opening marker up so that the random model opens its call at once; from there the
grammar holds every token: the answer must be exactly one call of that tool whose arguments are
valid under its schema (an enum, an integer, a boolean), with finish_reason "tool_calls"; the
same for that tool not strict but named, and for a call of the tool without properties under
`required` (`{}`): tool_choice holds a forced call to its schema. tool_choice auto beside a JSON
response_format: a call, or the format's JSON, never free text. Also the refusals (a strict tool's
schema outside the subset; tools beside `grammar`; tool_choice required beside a JSON
response_format).
Usage: test_tool_strict.py MLASERVE_EXE WORKER_EXE WORK_DIR. Exits 77 without jsonschema."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import ServeProcess, check, http_post as post, summary  # noqa: E402

try:
    import jsonschema
except ImportError:
    print("python jsonschema missing (scripts/install-deps.sh --test): skipped")
    sys.exit(77)

exe, worker, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                           "days": {"type": "integer"}, "metric": {"type": "boolean"}},
          "required": ["city", "days", "metric"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
LOOSE = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}

# Short templates that name the tools (the released ones render their whole schemas: a long
# prompt, slow on the CPU backend of a sanitizer build; they are test_chat_dialects.py's matter)
TEMPLATES = {
    "v3": ("{{ bos_token }}{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
           "{% for m in messages %}<｜User｜>{{ m.content }}{% endfor %}<｜Assistant｜>"),
    "glm5": ("[gMASK]<sop>{% if tools %}<|system|>Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
             "{% endif %}{% for m in messages %}<|user|>{{ m.content }}{% endfor %}<|assistant|>"),
}
CASES = [  # family, the format's opening marker
    ("v3", "<｜tool▁calls▁begin｜>"),
    ("glm5", "<tool_call>"),
]

for fam, opener in CASES:
    tmpl = os.path.join(work, "%s-tools.jinja" % fam)
    with open(tmpl, "w", encoding="utf-8") as f:
        f.write(TEMPLATES[fam])
    model = os.path.join(work, "%s-small.gguf" % fam)
    subprocess.run([exe, "mkmodel", "--family", fam, "--small", "--layers", "2", "-o", model], check=True,
                   stdout=subprocess.DEVNULL)
    srv = ServeProcess([exe, "serve", "-m", model, "--port", "0", "--backend", "cpu"],
                       ["--max-context", "1024", "--chat-template", tmpl, "--tool-parser", "deepseek" if fam == "v3" else "glm"],
                       worker=worker, timeout=120, prefix="tool_strict_%s_" % fam)
    try:
        st, d = post(srv.port, "/tokenize", {"prompt": opener, "add_special_tokens": False})
        ids = json.loads(d)["tokens"] if st == 200 else []
        check(len(ids) == 1, "%s: the opener is one token: %r" % (fam, ids))
        msgs = [{"role": "user", "content": "Weather in Oslo for two days?"}]
        for tools, choice, name in (([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}},
                                     "get_weather"),
                                    ([TIME, WEATHER], "required", None),
                                    # not strict, but named: held to its schema all the same (as vLLM)
                                    ([TIME, LOOSE], {"type": "function", "function": {"name": "get_weather"}},
                                     "get_weather")):
            body = {"model": os.path.basename(model), "messages": msgs, "tools": tools, "tool_choice": choice, "temperature": 0,
                    "max_tokens": 300, "parallel_tool_calls": False, "logit_bias": {str(ids[0]): 100}}
            t0 = time.time()
            st, d = post(srv.port, "/v1/chat/completions", body, timeout=300)
            print("%s %s: %.1f s" % (fam, json.dumps(choice), time.time() - t0), flush=True)
            what = "%s, tool_choice %s" % (fam, json.dumps(choice))
            ch = json.loads(d)["choices"][0] if st == 200 else {}
            calls = ch.get("message", {}).get("tool_calls") or []
            check(st == 200 and ch.get("finish_reason") == "tool_calls" and len(calls) == 1,
                  "%s: one call, finish tool_calls: %s %r" % (what, st, d[:400]))
            if not calls:
                continue
            fn = calls[0]["function"]
            if name:
                check(fn["name"] == name, "%s: the named tool: %s" % (what, fn["name"]))
            try:
                args = json.loads(fn["arguments"])
            except ValueError:
                args = None
            if fn["name"] == "get_weather":
                ok = args is not None
                try:
                    jsonschema.validate(args, PARAMS)
                except jsonschema.ValidationError:
                    ok = False
                check(ok, "%s: arguments valid under the schema: %r" % (what, fn["arguments"]))
            else:  # get_time, not strict, forced by "required": held to its schema, which lists no property
                check(args == {}, "%s: a forced tool's arguments held to its schema: %r" % (what, fn["arguments"]))
        # tool_choice auto beside a JSON response_format: the answer is a call (the opener biased up) or
        # the format's JSON (the opener biased down), never free text
        ans = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
               "required": ["answer"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": ans}}
        for bias, want in ((100, "tool_calls"), (-100, "stop")):
            body = {"model": os.path.basename(model), "messages": msgs, "tools": [LOOSE, TIME], "temperature": 0,
                    "max_tokens": 300, "response_format": rf, "logit_bias": {str(ids[0]): bias},
                    "parallel_tool_calls": False}
            st, d = post(srv.port, "/v1/chat/completions", body, timeout=300)
            ch = json.loads(d)["choices"][0] if st == 200 else {}
            msg = ch.get("message", {})
            what = "%s, auto beside response_format, opener bias %d" % (fam, bias)
            check(st == 200 and ch.get("finish_reason") == want, "%s: finish %s: %s %r" % (what, want, st, d[:400]))
            if want == "tool_calls":
                calls = msg.get("tool_calls") or []
                check(len(calls) >= 1 and calls[0]["function"]["name"] in ("get_weather", "get_time"),
                      "%s: a call: %r" % (what, calls))
            else:
                try:
                    jsonschema.validate(json.loads(msg.get("content") or ""), ans)
                    ok = True
                except (ValueError, jsonschema.ValidationError):
                    ok = False
                check(ok and not msg.get("tool_calls"), "%s: the format's JSON: %r" % (what, msg))
        for extra, want in (({"tool_choice": "required", "response_format": rf}, "the answer is a call"),
                            ({"grammar": "root ::= \"x\""}, "'grammar' cannot be combined")):
            body = dict({"model": os.path.basename(model), "messages": msgs, "tools": [LOOSE], "max_tokens": 2},
                        **extra)
            st, d = post(srv.port, "/v1/chat/completions", body)
            check(st == 400 and want in d.decode(), "%s: %s refused: %s %r" % (fam, list(extra), st, d[:300]))
        # refusals
        bad = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}}
        st, d = post(srv.port, "/v1/chat/completions", {"model": os.path.basename(model), "messages": msgs, "tools": [bad], "max_tokens": 2})
        check(st == 400 and "'pattern'" in d.decode() and "tool 'f' (strict)" in d.decode(), "%s: schema refused: %s %r"
              % (fam, st, d[:300]))
        # a strict schema that is not an object's; "strict" beside "function", where it would be lost
        for bad, want in (({"type": "function", "function": {"name": "f", "strict": True, "parameters": {
                               "type": "array", "items": {"type": "integer"}}}}, "of a strict tool must have"),
                          ({"type": "function", "strict": True, "function": {"name": "f"}}, "tools[0].strict")):
            st, d = post(srv.port, "/v1/chat/completions", {"model": os.path.basename(model), "messages": msgs,
                                                            "tools": [bad], "max_tokens": 2})
            check(st == 400 and want in d.decode(), "%s: %s refused: %s %r" % (fam, want, st, d[:300]))
        st, d = post(srv.port, "/v1/chat/completions", {"model": os.path.basename(model), "messages": msgs, "tools": [WEATHER],
                                                        "grammar": "root ::= \"x\"", "max_tokens": 2})
        check(st == 400 and "cannot be combined" in d.decode(), "%s: beside grammar refused: %s %r" % (fam, st, d[:300]))
    finally:
        srv.stop()
        os.remove(model)

sys.exit(summary("tool strict"))
