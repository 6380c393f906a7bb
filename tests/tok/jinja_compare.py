#!/usr/bin/env python3
"""chat_jinja against jinja2 (an independent renderer) with Hugging Face's chat-template
environment: trim_blocks, lstrip_blocks, loopcontrols, HF's tojson, raise_exception.
Renders the released templates of DATA_DIR/*.jinja and a set of feature templates on several
conversations (system, multi-turn, tool calls with mapping / string arguments, tool results,
reasoning, list content, unicode) and compares byte for byte. Exit 77 without jinja2.
usage: jinja_compare.py TEST_CHAT DATA_DIR"""
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja2 (PyPI) is not installed: skipped")
    sys.exit(77)


def hf_env():
    # as transformers' _compile_jinja_template
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


B = "<｜begin▁of▁sentence｜>"
E = "<｜end▁of▁sentence｜>"
CONVS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
    [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "  spaced  \n"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nreason\n</think>\n\nanswer"},
     {"role": "user", "content": "q2"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ans", "reasoning_content": "thought"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
         {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
     {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "noon"},
     {"role": "assistant", "content": "It is sunny."}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "x": [1, 2.5, None, True]}}}]},
     {"role": "tool", "content": "sunny"}],
    [{"role": "user", "content": [{"type": "text", "text": "part1 "}, {"type": "text", "text": "part2"}]}],
    [{"role": "user", "content": "数字 ünïcode ✓ 😀 \"quotes\" 'single' \\ back"}],
]
VARIANTS = [
    {"add_generation_prompt": True},
    {"add_generation_prompt": False},
    {"add_generation_prompt": True, "enable_thinking": False},
    {"add_generation_prompt": True, "thinking": True, "enable_thinking": True},
    {"add_generation_prompt": True, "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Wetter für eine Stadt",
                                                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]},
]

FEATURES = [
    "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ m.role }}{% if not loop.last %}, {% endif %}{% endfor %}",
    "{%- for m in messages -%}\n  [{{ m['role'] | upper }}]\n  {{- m.content if m.content is string else m.content | tojson }}\n{% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages if m.role != 'system' %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ messages | length }}",
    "{{ [1, 2.5, none, true, 'a\\'b', {'k': [1]}] }} {{ 1.0 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 3 * 'ab' }} {{ 1e20 }} {{ 0.1 + 0.2 }}",
    "{{ 'a,b,,c'.split(',') }} {{ '  x y  '.split() }} {{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ 'Hello World'.lower() }} {{ 'abc'[::-1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[-1] }}",
    "{% macro f(a, b='B', c=none) %}<{{ a }}|{{ b }}|{{ c }}>{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(a=3, c='C') }}{% set x = f('z') %}{{ x | length }}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}{% for x in [] %}no{% else %}empty{% endfor %}",
    "{% set d = {'b': 1, 'a': [1, 'x']} %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d | tojson }} {{ d | tojson(indent=2) }} {{ 'é😀' | tojson }} {{ 'é' | tojson(ensure_ascii=True) }} {{ d.get('zz', 'def') }} {{ d.keys() | list }}",
    "{{ messages[0].missing is defined }} {{ messages[0].missing | default('dflt') }} {{ none is none }} {{ 3 is odd }} {{ 'x' in 'xyz' }} {{ 'q' not in ['a'] }} {{ 1 < 2 and 2 <= 2 or false }} {{ not 0 }} {{ (1, 2) }}{{ [] | first }}",
    "  {% if true %}\n    indented\n  {% endif %}\n{# comment #}\n  {#- c2 -#}  x  {%+ if true %}plus{% endif +%}\n{% raw %}{{ not rendered }}{% endraw %}\nend",
    "{%- set a = 1 -%}{% set b %}block {{ a }}{% endset %}[{{ b }}]{{ b | trim }}{{ messages | map(attribute='role') | join(',') }}{{ messages | selectattr('role', 'equalto', 'user') | list | length }}{{ [3,1,2] | reverse | list }}{{ 'ab' | list }}",
    "{{ messages[-1]['content'] }}{{ messages[1:] | length }}{{ messages[:1][0].role }}{{ 'x' ~ 1 ~ none ~ true }}{{ (messages | last).role }}{{ 5 if false }}|{{ -3 | abs }}{{ '7' | int + 1 }}{{ 2 | float }}{{ 'A b' | title }} {{ 'ab' | capitalize }}",
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('system first') }}{% endif %}ok",
    "{{ messages[0].content.split('</think>', 1)[1] }}",
    "{{ undefined_name.attr }}",
    "{{ 'a' + 1 }}",
    "{{ strftime_now('%Y-%m') }} {{ strftime_now('%d') | length }}",
]


# chat requests as clients send them (content as text parts, tool-call arguments as JSON strings),
# with tools and the thinking switches: rendered through chat_tmpl_apply_json (which normalizes the
# messages) against jinja2 on messages normalized here as vLLM does (parts joined one a line; arguments
# parsed into an object when the template renders objects, else kept as the JSON string)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
REQUESTS = [
    [{"role": "system", "content": [{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Use tools."}]},
     {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]}],
    [{"role": "user", "content": "Weather in Paris and the time?"},
     {"role": "assistant", "content": "", "reasoning_content": "Two calls.", "tool_calls": [
         {"id": "functions.get_weather:0", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
         {"id": "functions.get_time:1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
     {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
     {"role": "tool", "tool_call_id": "functions.get_time:1", "content": "noon"},
     {"role": "assistant", "content": "Sunny, and it is noon."},
     {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
]
REQ_VARIANTS = [
    {"add_generation_prompt": True},
    {"add_generation_prompt": True, "tools": TOOLS},
    {"add_generation_prompt": True, "tools": TOOLS, "enable_thinking": False},
    {"add_generation_prompt": True, "thinking": True},
    {"add_generation_prompt": True, "enable_thinking": True, "tools": TOOLS[:1]},
]


def renders_object_arguments(env, tmpl):
    probe = [{"role": "user", "content": "u"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_0", "type": "function", "function": {"name": "probe_fn", "arguments": {"probe_key": "probe_val"}}}]},
             {"role": "tool", "tool_call_id": "call_0", "content": "r"}, {"role": "user", "content": "u2"}]
    try:
        return "probe_key" in env.from_string(tmpl).render(messages=probe, add_generation_prompt=True, bos_token=B, eos_token=E)
    except Exception:
        return False


def normalized(msgs, args_object):
    out = []
    for m in msgs:
        m = json.loads(json.dumps(m))
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        for tc in m.get("tool_calls") or []:
            a = tc["function"]["arguments"]
            if args_object and isinstance(a, str):
                tc["function"]["arguments"] = json.loads(a)
            elif not args_object and not isinstance(a, str):
                tc["function"]["arguments"] = json.dumps(a, separators=(",", ":"))
        out.append(m)
    return out


def main():
    exe, data = sys.argv[1:3]
    env = hf_env()
    templates = []
    for p in sorted(glob.glob(os.path.join(data, "*.jinja"))):
        with open(p, encoding="utf-8") as f:
            templates.append((os.path.basename(p), f.read()))
    templates += [(f"feature{i}", t) for i, t in enumerate(FEATURES)]
    jobs, refs = [], []
    for name, tmpl in templates:
        for ci, conv in enumerate(CONVS):
            for vi, var in enumerate(VARIANTS):
                if name.startswith("feature") and vi > 1:
                    continue
                variables = dict(var, messages=conv, bos_token=B, eos_token=E)
                try:
                    ref, ref_err = env.from_string(tmpl).render(**variables), None
                except Exception as ex:  # the reference fails: ours must fail too
                    ref, ref_err = None, f"{type(ex).__name__}: {ex}"
                jobs.append({"template": tmpl, "vars": variables})
                refs.append((name, ci, vi, ref, ref_err))
        if name.startswith("feature"):
            continue
        obj = renders_object_arguments(env, tmpl)
        for ri, req in enumerate(REQUESTS):
            for vi, var in enumerate(REQ_VARIANTS):
                try:
                    ref, ref_err = env.from_string(tmpl).render(
                        **dict(var, messages=normalized(req, obj), bos_token=B, eos_token=E)), None
                except Exception as ex:
                    ref, ref_err = None, f"{type(ex).__name__}: {ex}"
                jobs.append({"template": tmpl, "vars": dict(var, messages=req, bos_token=B, eos_token=E), "apply": True})
                refs.append((name + " (request)", ri, vi, ref, ref_err))
    with tempfile.TemporaryDirectory() as tmp:
        jp = os.path.join(tmp, "jobs.json")
        with open(jp, "w", encoding="utf-8") as f:
            json.dump(jobs, f, ensure_ascii=False)
        r = subprocess.run([exe, "--render-batch", jp], capture_output=True)
    if r.returncode != 0:
        print(r.stderr.decode(errors="replace"))
        return 1
    ours = json.loads(r.stdout)
    n = bad = 0
    for (name, ci, vi, ref, ref_err), o in zip(refs, ours):
        n += 1
        ok = (not o["ok"]) if ref_err else (o["ok"] and o["out"] == ref)
        if not ok:
            bad += 1
            if bad <= 8:
                print(f"MISMATCH {name} conv{ci} var{vi}")
                print("  jinja2:", repr(ref) if ref_err is None else ref_err)
                print("  ours:  ", repr(o["out"]) if o["ok"] else o["err"])
    print(f"{n - bad}/{n} renderings agree with jinja2 {jinja2.__version__}")
    return 1 if bad or len(ours) != len(jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
