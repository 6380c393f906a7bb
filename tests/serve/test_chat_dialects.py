"""Reasoning content, tool calls and template variables of the DeepSeek, GLM and Kimi chat
dialects, through the official `openai` client against the fake server running a scripted model
(tests/serve/fake_backend.h: the server generates exactly the tokens of a script file) and the
released chat templates of tests/data/chat. Every script is sent twice: with the dialect's
markers as single control tokens (as the real tokenizers have them) and byte by byte (every
marker cut across many tokens). Expected values are written here from the formats the model
families document, and streamed results must equal the non-streamed ones.
Usage: test_chat_dialects.py FAKE_SERVER_EXE DATA_DIR. Exits 77 without the openai package."""
import json
import os
import sys
import tempfile

try:
    import openai
except ImportError:
    print("openai package not installed: skipped (pip install openai)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakeref as R  # noqa: E402
from mlatest import check, http_post, summary  # noqa: E402

FAKE_VOCAB = 258
# the control tokens of tests/serve/fake_server_main.c (MARKERS), in order
MARKERS = ["<think>", "</think>",
           "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
           "<｜tool▁sep｜>",
           "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
           "<|tool_call_argument_begin|>", "<|tool_call_end|>",
           "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                    "units": {"type": ["string", "null"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
# parameters as pydantic writes them: Optional[...] as anyOf, a nested model as $ref, a Literal as enum
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "$defs": {"Filt": {"type": "object", "properties": {"lang": {"type": "string"}}}},
    "properties": {"q": {"type": "string"}, "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                   "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                   "filt": {"$ref": "#/$defs/Filt"}, "mode": {"enum": ["fast", "slow"]},
                   "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}

# a template that renders `tools` in DeepSeek's turn format (DeepSeek's released templates do not
# render tools: users serve them with --chat-template of one that does)
DS_TOOLS_TEMPLATE = ("{{ bos_token }}{% if reasoning_effort is defined %}Reasoning effort: {{ reasoning_effort }}\n"
                     "{% endif %}{% if tools %}## Tools\n{{ tools | tojson }}\n{% endif %}"
                     "{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
                     "{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>"
                     "{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>"
                     "{% endif %}{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>{% endif %}")


MSGS = [{"role": "user", "content": "What is 2+2? And the weather?"}]  # every case's question


def tokens(parts, markers_as_tokens):
    """Script ids of parts (strings; a string equal to a marker is that marker)."""
    ids = []
    for p in parts:
        if markers_as_tokens and p in MARKERS:
            ids.append(FAKE_VOCAB + MARKERS.index(p))
        else:
            ids.extend(p.encode("utf-8"))
    return ids


def prompt_of(ids):
    """the text of prompt ids: bytes, and the markers' control tokens as their text"""
    out = b""
    for t in ids:
        if t < 256:
            out += bytes([t])
        elif t >= FAKE_VOCAB:
            out += MARKERS[t - FAKE_VOCAB].encode("utf-8")
    return out.decode("utf-8", "replace")


def split_markers(text):
    """text cut into marker and non-marker parts."""
    out, i = [], 0
    while i < len(text):
        hit = next((m for m in MARKERS if text.startswith(m, i)), None)
        if hit:
            out.append(hit)
            i += len(hit)
        else:
            j = i + 1
            while j < len(text) and not any(text.startswith(m, j) for m in MARKERS):
                j += 1
            out.append(text[i:j])
            i = j
    return out


def args_of(text):
    """a call's arguments as JSON, or ("raw", text) where they are not (a call cut off)"""
    try:
        return json.loads(text)
    except ValueError:
        return ("raw", text)


def reasoning_of(obj, what):
    """the reasoning of a message or a delta: reasoning_content, which reasoning (vLLM's name) repeats"""
    rc, r = getattr(obj, "reasoning_content", None), getattr(obj, "reasoning", None)
    check(rc == r, what + ": reasoning and reasoning_content agree", (rc, r))
    return rc


def result_of(msg, what=""):
    calls = [(c.id, c.type, c.function.name, args_of(c.function.arguments)) for c in (msg.tool_calls or [])]
    return {"content": msg.content, "reasoning": reasoning_of(msg, what), "calls": calls}


def stream_result(cl, what, **kw):
    content, reasoning, calls, finish = None, None, {}, None
    ok_shape = True
    for ch in cl.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        c = ch.choices[0]
        d = c.delta
        if d.content:
            content = (content or "") + d.content
        rc = reasoning_of(d, what + ": a delta")
        if rc:
            reasoning = (reasoning or "") + rc
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                # the first delta of a call: index, id, type, name (OpenAI's stream shape)
                ok_shape &= bool(tc.id) and tc.type == "function" and bool(tc.function.name)
                calls[tc.index] = [tc.id, tc.type, tc.function.name, tc.function.arguments or ""]
            else:
                ok_shape &= tc.id is None and (tc.function.name is None)
                calls[tc.index][3] += tc.function.arguments or ""
        if c.finish_reason:
            finish = c.finish_reason
    check(ok_shape, what + ": stream tool_calls deltas shaped as OpenAI's")
    check(sorted(calls) == list(range(len(calls))), what + ": stream tool_call indices")
    out = [(v[0], v[1], v[2], args_of(v[3])) for _, v in sorted(calls.items())]
    return {"content": content, "reasoning": reasoning, "calls": out}, finish


KIMI_NO_TOOLS = ("<think>Plan.</think>Answer.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
                 "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>")
CASES = [
    # name, template, extra server args, model output, request extras, expected
    ("r1: the template opens <think>", "deepseek-r1.jinja", [],
     "Two and two.\n</think>\n\nThe answer is 4.", {},
     {"content": "The answer is 4.", "reasoning": "Two and two.", "calls": []}, "stop"),
    ("r1 with response_format: the reasoning closed before the answer", "deepseek-r1.jinja", [],
     '{"x": 4}', {"response_format": {"type": "json_object"}},
     {"content": '{"x": 4}', "reasoning": None, "calls": []}, "stop"),
    ("r1: an answer continued from inside its reasoning (continue_final_message)", "deepseek-r1.jinja", [],
     " more.</think>\n\nThe answer.", {"messages": [{"role": "user", "content": "q"},
                                                   {"role": "assistant", "content": "<think>\nLet me see"}],
                                      "continue_final_message": True},
     {"content": "The answer.", "reasoning": "more.", "calls": []}, "stop"),
    ("r1: cut off inside the reasoning", "deepseek-r1.jinja", [],
     "Still thinking about </thi", {},
     {"content": None, "reasoning": "Still thinking about </thi", "calls": []}, "stop"),
    ("v3.1 thinking on (kwargs)", "deepseek-v3.1.jinja", [],
     "plan</think>Four.", {"chat_template_kwargs": {"thinking": True}},
     {"content": "Four.", "reasoning": "plan", "calls": []}, "stop"),
    ("v3.1 thinking off: nothing eaten", "deepseek-v3.1.jinja", [],
     "Four. </think> stays", {},
     {"content": "Four. </think> stays", "reasoning": None, "calls": []}, "stop"),
    ("v3.1 thinking off: an output that opens <think> is content", "deepseek-v3.1.jinja", [],
     "<think>x</think>Four.", {},
     {"content": "<think>x</think>Four.", "reasoning": None, "calls": []}, "stop"),
    ("glm-4.6 thinking", "glm-4.6.jinja", [],
     "\n<think>Weigh it.</think>\nFour.", {},
     {"content": "Four.", "reasoning": "Weigh it.", "calls": []}, "stop"),
    ("glm-4.6 thinking off", "glm-4.6.jinja", [],
     "Four <think>x</think>", {"chat_template_kwargs": {"enable_thinking": False}},
     {"content": "Four <think>x</think>", "reasoning": None, "calls": []}, "stop"),
    ("glm-4.6 tool calls", "glm-4.6.jinja", [],
     "<think>Need the weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
     "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>",
     {"tools": [WEATHER, TIME]},
     {"content": None, "reasoning": "Need the weather.",
      "calls": [("*", "function", "get_weather", {"city": "Paris", "days": 3}), ("*", "function", "get_time", {})]},
     "tool_calls"),
    # a NUL byte in a value (the value's text; the key's too) is kept: "\u0000" in the arguments' JSON
    ("glm-4.6 a NUL byte in a call's value", "glm-4.6.jinja", [],
     "<tool_call>get_weather\n<arg_key>ci\x00ty</arg_key>\n<arg_value>Os\x00lo</arg_value>\n</tool_call>",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": None, "calls": [("*", "function", "get_weather", {"ci\x00ty": "Os\x00lo"})]},
     "tool_calls"),
    # GLM-5: the generation prompt opens <think> itself, calls in the compact form (no newlines)
    ("glm-5 thinking: the prompt opens <think>", "glm-5.jinja", [],
     "Weigh it.</think>Four.", {},
     {"content": "Four.", "reasoning": "Weigh it.", "calls": []}, "stop"),
    ("glm-5 thinking off", "glm-5.jinja", [],
     "Four <think>x</think>", {"chat_template_kwargs": {"enable_thinking": False}},
     {"content": "Four <think>x</think>", "reasoning": None, "calls": []}, "stop"),
    ("glm-5 thinking off: an output that opens <think> is content", "glm-5.jinja", [],
     "<think>x</think>Four", {"chat_template_kwargs": {"enable_thinking": False}},
     {"content": "<think>x</think>Four", "reasoning": None, "calls": []}, "stop"),
    ("glm-5 tool calls", "glm-5.jinja", [],
     "Need the weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
     "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time</tool_call>",
     {"tools": [WEATHER, TIME]},
     {"content": None, "reasoning": "Need the weather.",
      "calls": [("*", "function", "get_weather", {"city": "Paris", "days": 3}), ("*", "function", "get_time", {})]},
     "tool_calls"),
    ("glm-4.5 compact tool call (string typed as declared)", "glm-4.5.jinja", [],
     "Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>42</arg_value>"
     "<arg_key>units</arg_key><arg_value>metric</arg_value></tool_call>",
     {"tools": [WEATHER], "tool_choice": "required"},
     {"content": "Let me check.", "reasoning": None,
      "calls": [("*", "function", "get_weather", {"city": "42", "units": "metric"})]}, "tool_calls"),
    ("kimi-k2-thinking tool call", "kimi-k2-thinking.jinja", [],
     "<think>Plan a call.</think>Calling.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
     "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1"
     "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
     {"tools": [WEATHER, TIME]},
     {"content": "Calling.", "reasoning": "Plan a call.",
      "calls": [("functions.get_weather:0", "function", "get_weather", {"city": "Paris"}),
                ("functions.get_time:1", "function", "get_time", {})]}, "tool_calls"),
    ("kimi-k2 tool call", "kimi-k2.jinja", [],
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
     "{\"city\": \"Oslo\", \"days\": 2}<|tool_call_end|><|tool_calls_section_end|>",
     {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     {"content": None, "reasoning": None,
      "calls": [("functions.get_weather:0", "function", "get_weather", {"city": "Oslo", "days": 2})]}, "tool_calls"),
    ("deepseek-v3 fenced tool call", "ds-tools", ["--reasoning-parser", "deepseek-r1"],
     "<think>Look it up.</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
     "```json\n{\"city\": \"Rome\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     {"tools": [WEATHER]},
     {"content": "Sure.", "reasoning": "Look it up.",
      "calls": [("*", "function", "get_weather", {"city": "Rome"})]}, "tool_calls"),
    ("deepseek-v3.1 tool calls", "ds-tools", [],
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Lima\", \"days\": 1}"
     "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     {"tools": [WEATHER, TIME]},
     {"content": None, "reasoning": None,
      "calls": [("*", "function", "get_weather", {"city": "Lima", "days": 1}), ("*", "function", "get_time", {})]},
     "tool_calls"),
    # calls the output ends inside (as max_tokens cuts them): the arguments as far as written, left
    # open, never a marker's first bytes; the finish reason is not "tool_calls" (the calls are not
    # whole: an agent would run them)
    ("glm-5 call cut inside a value", "glm-5.jinja", [],
     "Need it.</think><tool_call>get_weather<arg_key>days</arg_key><arg_value>2</arg_value>"
     "<arg_key>city</arg_key><arg_value>Paris is", {"tools": [WEATHER]},
     {"content": None, "reasoning": "Need it.",
      "calls": [("*", "function", "get_weather", ("raw", '{"days":2,"city":"Paris is'))]}, "stop"),
    ("glm-5 call cut between pairs", "glm-5.jinja", [],
     "x</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_ke",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": "x",
      "calls": [("*", "function", "get_weather", ("raw", '{"city":"Oslo"'))]}, "stop"),
    ("glm-5 call cut in a key, then in a number", "glm-5.jinja", [],
     "x</think><tool_call>get_weather<arg_key>da", {"tools": [WEATHER]},
     {"content": None, "reasoning": "x", "calls": [("*", "function", "get_weather", ("raw", '{"da'))]},
     "stop"),
    ("glm-5 call cut in a number", "glm-5.jinja", [],
     "x</think><tool_call>get_weather<arg_key>days</arg_key><arg_value>1</arg_v", {"tools": [WEATHER]},
     {"content": None, "reasoning": "x", "calls": [("*", "function", "get_weather", ("raw", '{"days":1'))]},
     "stop"),
    ("deepseek-v3.1 call cut in its end marker", "ds-tools", [],
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Lima\"}<｜tool▁call▁e",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": None, "calls": [("*", "function", "get_weather", {"city": "Lima"})]},
     "stop"),
    # Kimi-K2 may open its tool-call section without closing its reasoning: the section ends it
    ("kimi-k2-thinking: a call opens before </think>", "kimi-k2-thinking.jinja", [],
     "<think>Plan a call.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
     "<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": "Plan a call.",
      "calls": [("functions.get_weather:0", "function", "get_weather", {"city": "Oslo"})]}, "tool_calls"),
    # GLM values typed by the parameter's schema: a string only where it allows one (pydantic's
    # Optional[str] is an anyOf); $ref, enum and untyped values read as JSON where they are
    ("glm-4.6 values typed by anyOf / $ref / enum", "glm-4.6.jinja", [],
     "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>x</arg_value>\n<arg_key>limit</arg_key>\n"
     "<arg_value>5</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", \"b\"]</arg_value>\n"
     "<arg_key>filt</arg_key>\n<arg_value>{\"lang\": \"en\"}</arg_value>\n<arg_key>mode</arg_key>\n"
     "<arg_value>fast</arg_value>\n<arg_key>note</arg_key>\n<arg_value>7</arg_value>\n</tool_call>",
     {"tools": [SEARCH]},
     {"content": None, "reasoning": None,
      "calls": [("*", "function", "search", {"q": "x", "limit": 5, "tags": ["a", "b"], "filt": {"lang": "en"},
                                              "mode": "fast", "note": "7"})]}, "tool_calls"),
    # a string beside other types (Optional[str], ["string", "null"]): the text where it is no JSON of
    # those ("null" is null, "7" stays text); a key or a tool not declared: JSON where the text is
    # JSON, else the text (as vLLM's and llama.cpp's parsers read them)
    ("glm-4.6 null for Optional[str]; keys not declared read as JSON", "glm-4.6.jinja", [],
     "<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>null</arg_value>\n<arg_key>note</arg_key>\n"
     "<arg_value>null</arg_value>\n<arg_key>extra</arg_key>\n<arg_value> 7 </arg_value>\n<arg_key>blob</arg_key>\n"
     "<arg_value>{\"x\": [1]}</arg_value>\n<arg_key>word</arg_key>\n<arg_value>hi there</arg_value>\n"
     "<arg_key>py</arg_key>\n<arg_value>None</arg_value>\n</tool_call>\n<tool_call>get_weather\n"
     "<arg_key>units</arg_key>\n<arg_value>null</arg_value>\n</tool_call>\n<tool_call>not_offered\n"
     "<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     {"tools": [SEARCH, WEATHER], "max_tokens": 800},
     {"content": None, "reasoning": None,
      "calls": [("*", "function", "search", {"q": "null", "note": None, "extra": 7, "blob": {"x": [1]},
                                              "word": "hi there", "py": None}),
                ("*", "function", "get_weather", {"units": None}),
                ("*", "function", "not_offered", {"n": 3})]}, "tool_calls"),
    # cut inside a value that may be text or JSON: withheld until it ends (what is streamed stays)
    ("glm-5 call cut inside a value not declared", "glm-5.jinja", [],
     "x</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>extra</arg_key>"
     "<arg_value>12", {"tools": [WEATHER]},
     {"content": None, "reasoning": "x",
      "calls": [("*", "function", "get_weather", ("raw", '{"city":"Oslo","extra":'))]}, "stop"),
    ("parallel_tool_calls false: the first call alone", "glm-4.6.jinja", [],
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>\n"
     "<tool_call>get_time\n</tool_call>", {"tools": [WEATHER, TIME], "parallel_tool_calls": False},
     {"content": None, "reasoning": None, "calls": [("*", "function", "get_weather", {"city": "Paris"})]},
     "tool_calls"),
    ("a stop string inside a call: finish stop", "glm-4.6.jinja", [],
     "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
     {"tools": [WEATHER], "stop": ["Par"]},
     {"content": None, "reasoning": None, "calls": [("*", "function", "get_weather", ("raw", '{"city":"'))]},
     "stop"),
    ("r1: a <think> written again after the prompt's", "deepseek-r1.jinja", [],
     "<think>\nfoo</think>bar", {},
     {"content": "bar", "reasoning": "foo", "calls": []}, "stop"),
    # the output ends inside a call's name: neither a call with a part of a name nor the markers
    # as content; other text after an opening marker is not the format and stays content
    ("glm-5 cut in a call's name", "glm-5.jinja", [],
     "x</think><tool_call>get_wea", {"tools": [WEATHER]},
     {"content": None, "reasoning": "x", "calls": []}, "stop"),
    ("deepseek-v3.1 cut in a call's name", "ds-tools", [],
     "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_we", {"tools": [WEATHER]},
     {"content": "Sure.", "reasoning": None, "calls": []}, "stop"),
    ("deepseek-v3 fenced, cut in a call's name", "ds-tools", ["--reasoning-parser", "deepseek-r1"],
     "<think>x</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weath",
     {"tools": [WEATHER]},
     {"content": "Sure.", "reasoning": "x", "calls": []}, "stop"),
    # cut inside a fence: its beginning or end is markup, never arguments
    ("deepseek-v3 fenced, cut in the opening fence", "ds-tools", ["--reasoning-parser", "deepseek-r1"],
     "<think>x</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```js",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": "x", "calls": [("*", "function", "get_weather", ("raw", ""))]}, "stop"),
    ("deepseek-v3 fenced, cut in the closing fence", "ds-tools", ["--reasoning-parser", "deepseek-r1"],
     "<think>x</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
     "```json\n{\"city\": \"Rome\"}\n``",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": "x", "calls": [("*", "function", "get_weather", {"city": "Rome"})]}, "stop"),
    ("kimi-k2 cut in a call's id", "kimi-k2.jinja", [],
     "Calling.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_we", {"tools": [WEATHER]},
     {"content": "Calling.", "reasoning": None, "calls": []}, "stop"),
    ("glm-4.6 an opening marker, then prose", "glm-4.6.jinja", [],
     "<tool_call>is how a call starts", {"tools": [WEATHER]},
     {"content": "<tool_call>is how a call starts", "reasoning": None, "calls": []}, "stop"),
    # ... with the text before it as it was (the newline is not trimmed away before a marker that
    # turns out not to open a call)
    ("glm-4.6 text, a newline, then an opening marker and prose", "glm-4.6.jinja", [],
     "Sure.\n<tool_call>is how a call starts", {"tools": [WEATHER]},
     {"content": "Sure.\n<tool_call>is how a call starts", "reasoning": None, "calls": []}, "stop"),
    ("deepseek-v3.1 text, a newline, then a section that is not the format", "ds-tools", [],
     "OK.\n<｜tool▁calls▁begin｜>nothing here", {"tools": [TIME], "skip_special_tokens": False},
     {"content": "OK.\n<｜tool▁calls▁begin｜>nothing here", "reasoning": None, "calls": []}, "stop"),
    # a call whose name ended (a whole marker after it) but that is not the format: the text stays
    # content, and what follows it too (a name cut off has no whole marker after it)
    ("deepseek-v3.1 a name with no separator, then text", "ds-tools", [],
     "OK.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁call▁end｜><｜tool▁calls▁end｜>Done.",
     {"tools": [TIME], "skip_special_tokens": False},
     {"content": "OK.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁call▁end｜><｜tool▁calls▁end｜>Done.",
      "reasoning": None, "calls": []}, "stop"),
    ("deepseek-v3 fenced with no newline after the name", "ds-tools", [],
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     {"tools": [TIME], "skip_special_tokens": False},
     {"content": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time<｜tool▁call▁end｜>"
                 "<｜tool▁calls▁end｜>", "reasoning": None, "calls": []}, "stop"),
    ("kimi-k2 a call with no argument marker, then text", "kimi-k2.jinja", [],
     "OK.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_end|>"
     "<|tool_calls_section_end|>Done.", {"tools": [TIME], "skip_special_tokens": False},
     {"content": "OK.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_end|>"
                 "<|tool_calls_section_end|>Done.", "reasoning": None, "calls": []}, "stop"),
    # text inside a GLM call that is not a key/value pair is dropped with the call's end marker
    ("glm-4.6 text inside a call that is not a pair", "glm-4.6.jinja", [],
     "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Oslo</arg_value>\nHello there</tool_call>",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": None, "calls": [("*", "function", "get_weather", {"city": "Oslo"})]},
     "tool_calls"),
    ("glm-5 text inside a call, then a call", "glm-5.jinja", [],
     "x</think><tool_call>get_time\nHello</tool_call>Done.<tool_call>get_time</tool_call>", {"tools": [TIME]},
     {"content": "Done.", "reasoning": "x",
      "calls": [("*", "function", "get_time", {}), ("*", "function", "get_time", {})]}, "tool_calls"),
    ("kimi-k2 a section opened, nothing after it", "kimi-k2.jinja", [],
     "<|tool_calls_section_begin|>", {"tools": [WEATHER]},
     {"content": None, "reasoning": None, "calls": []}, "stop"),
    ("kimi-k2 a long call id, whole", "kimi-k2.jinja", [],
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:" + "7" * 400 +
     "<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|><|tool_calls_section_end|>",
     {"tools": [WEATHER]},
     {"content": None, "reasoning": None,
      "calls": [("functions.get_weather:" + "7" * 400, "function", "get_weather", {"city": "Oslo"})]},
     "tool_calls"),
    # (a grammar holds a real model to a call here: test_tool_strict.py; the scripted model writes
    # its script, and the parser returns text without a call as content)
    ("required, a scripted answer without a call: the text is returned", "glm-4.6.jinja", [],
     "I cannot call anything.", {"tools": [WEATHER], "tool_choice": "required"},
     {"content": "I cannot call anything.", "reasoning": None, "calls": []}, "stop"),
    # no tools: Kimi-K2's reasoning parser keeps its call-section markers (they end the reasoning),
    # skip_special_tokens leaves out the calls' own
    # (a pair of expectations: the markers as their tokens, then written out in bytes: text)
    ("kimi-k2-thinking, no tools: only the section markers kept", "kimi-k2-thinking.jinja", [],
     KIMI_NO_TOOLS, {},
     ({"content": "Answer.<|tool_calls_section_begin|>functions.get_time:0{}<|tool_calls_section_end|>",
       "reasoning": "Plan.", "calls": []},
      {"content": KIMI_NO_TOOLS.split("</think>")[1], "reasoning": "Plan.", "calls": []}), "stop"),
    # (the markers kept as text: skip_special_tokens would leave their control tokens out, as below)
    ("tool_choice none: no parsing", "glm-4.6.jinja", [],
     "<tool_call>get_weather</tool_call>", {"tools": [WEATHER], "tool_choice": "none", "skip_special_tokens": False},
     {"content": "<tool_call>get_weather</tool_call>", "reasoning": None, "calls": []}, "stop"),
]


def no_ids(x):
    """a result_of's calls without their ids (two answers' calls compared where each gets its own)"""
    return dict(x, calls=[c[1:] for c in x["calls"]])


def expect_match(got, exp):
    if got["content"] != exp["content"] or got["reasoning"] != exp["reasoning"] or len(got["calls"]) != len(exp["calls"]):
        return False
    for g, e in zip(got["calls"], exp["calls"]):
        if (e[0] != "*" and g[0] != e[0]) or not g[0] or g[1:] != e[1:]:
            return False
    return True


def run_server(exe, tmpl_path, extra, script):
    return R.Server(exe, "--chat-template", tmpl_path, "--script-file", script, *extra)


class Servers:
    """The fake servers of the other APIs' tests: one a template and extra arguments, started when
    first asked for (port(tmpl, extra); "ds-tools": DS_TOOLS_TEMPLATE), all reading one script
    (script_of: the model's next output); stop_all() checks that each exits cleanly."""

    def __init__(self, exe, data, prefix):
        self.exe, self.data, self.servers = exe, data, {}
        tmp = tempfile.mkdtemp(prefix=prefix)
        self.script = os.path.join(tmp, "script")
        self.ds_tmpl = os.path.join(tmp, "ds-tools.jinja")
        with open(self.ds_tmpl, "w", encoding="utf-8") as f:
            f.write(DS_TOOLS_TEMPLATE)

    def port(self, tmpl, extra=()):
        path = self.ds_tmpl if tmpl == "ds-tools" else os.path.join(self.data, tmpl)
        key = (path, tuple(extra))
        if key not in self.servers:
            self.servers[key] = run_server(self.exe, path, list(extra), self.script)
        return self.servers[key].port

    def script_of(self, text, as_tokens=True):
        with open(self.script, "w") as f:
            f.write(" ".join(str(t) for t in tokens(split_markers(text), as_tokens)))

    def stop_all(self):
        for s in self.servers.values():
            check(s.stop() == 0, "clean exit")


def main():
    exe, data = sys.argv[1:3]
    tmp = tempfile.mkdtemp(prefix="chat_dialects_")
    script = os.path.join(tmp, "script")
    ds_tmpl = os.path.join(tmp, "ds-tools.jinja")
    with open(ds_tmpl, "w", encoding="utf-8") as f:
        f.write(DS_TOOLS_TEMPLATE)
    msgs = MSGS
    servers = {}
    try:
        for name, tmpl, extra, output, req, exp, exp_finish in CASES:
            path = ds_tmpl if tmpl == "ds-tools" else os.path.join(data, tmpl)
            key = (path, tuple(extra))
            if key not in servers:
                servers[key] = run_server(exe, path, extra, script)
            srv = servers[key]
            cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="x", timeout=30, max_retries=0)
            for as_tokens in (True, False):
                what = "%s (%s)" % (name, "marker tokens" if as_tokens else "byte tokens")
                ex = exp[0 if as_tokens else 1] if isinstance(exp, tuple) else exp
                with open(script, "w") as f:
                    f.write(" ".join(str(t) for t in tokens(split_markers(output), as_tokens)))
                kw = dict(model="fake-model", messages=msgs, max_tokens=1000, temperature=0)
                body_keys = ("chat_template_kwargs", "continue_final_message", "skip_special_tokens")  # not the client's
                extra_body = {k: v for k, v in req.items() if k in body_keys}
                kw.update({k: v for k, v in req.items() if k not in body_keys})
                r = cl.chat.completions.create(extra_body=extra_body or None, **kw)
                got = result_of(r.choices[0].message, what)
                check(expect_match(got, ex), what + ": message", (got, ex))
                check(r.choices[0].finish_reason == exp_finish, what + ": finish_reason", r.choices[0].finish_reason)
                sgot, sfin = stream_result(cl, what, extra_body=extra_body or None, **kw)
                # ids are per request: compare the rest
                strip = lambda x: dict(x, calls=[c[1:] for c in x["calls"]])  # noqa: E731
                check(strip(sgot) == strip(got) and sfin == exp_finish, what + ": stream equals the message", (sgot, got))

        # refusals, by name (one server: the GLM-4.6 template)
        srv = servers[(os.path.join(data, "glm-4.6.jinja"), ())]
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="x", timeout=30, max_retries=0)
        with open(script, "w") as f:
            f.write("65 66")

        def refused(what, param, **kw):
            try:
                cl.chat.completions.create(model="fake-model", messages=kw.pop("messages", msgs), max_tokens=4, **kw)
                check(False, what + ": refused")
            except openai.BadRequestError as e:
                body = e.body if isinstance(e.body, dict) else {}
                check(e.status_code == 400 and param in str(body.get("message", "")), what + ": 400 naming " + param, body)

        refused("continue_final_message with a user message last", "continue_final_message",
                extra_body={"continue_final_message": True})
        # GLM-4.6's template strips an assistant turn's text: the prompt cannot end inside it as given
        # (the same text earlier in the conversation does not make it look so)
        refused("continue_final_message where the template changes the text", "continue_final_message",
                messages=[{"role": "user", "content": "say  Sure"}, {"role": "assistant", "content": "  Sure"}],
                extra_body={"continue_final_message": True})
        for k, v in (("guided_json", {"type": "object"}), ("json_schema", {}),
                     ("functions", []), ("documents", []), ("echo", False)):
            refused("unhonoured parameter " + k, k, extra_body={k: v})
        refused("kwargs the template does not read", "no_such_switch",
                extra_body={"chat_template_kwargs": {"no_such_switch": True}})
        refused("reasoning_effort where the template has none", "reasoning_effort", reasoning_effort="high")
        refused("include_reasoning not a boolean", "include_reasoning", extra_body={"include_reasoning": "no"})
        refused("named tool not in tools", "not_there", tools=[WEATHER],
                tool_choice={"type": "function", "function": {"name": "not_there"}})
        refused("image parts", "image_url",
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}])
        refused("arguments that are not JSON", "arguments",
                messages=[{"role": "user", "content": "q"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{nope"}}]},
                          {"role": "user", "content": "q2"}])
        refused("a call without arguments", "function.arguments is required",
                messages=[{"role": "user", "content": "q"},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": "c1", "type": "function", "function": {"name": "get_weather"}}]},
                          {"role": "user", "content": "q2"}])
        refused("tool_choice auto without tools", "tool_choice", tool_choice="auto")
        spaced = {"type": "function", "function": dict(WEATHER["function"], name="get weather")}
        refused("a tool name with a space", "holds whitespace", tools=[spaced])
        refused("two tools of one name", "is tools[0]'s too", tools=[WEATHER, WEATHER])
        named = {"type": "function", "function": {"name": "get_weather"}}
        refused("a named tool_choice's unknown member", "tool_choice.extra is not a member", tools=[WEATHER],
                tool_choice=dict(named, extra=1))
        refused("a named tool_choice's function's unknown member", "tool_choice.function.x is not a member",
                tools=[WEATHER], tool_choice=dict(named, function={"name": "get_weather", "x": 1}))
        strict = {"type": "function", "function": dict(WEATHER["function"], strict=True)}
        # strict: true is accepted (the calls' grammar holds the arguments; the scripted model here
        # writes its script whatever the grammar: test_structured.py checks the grammar's effect)
        ok = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=4, tools=[strict])
        check(ok.choices[0].message.content == "AB", "strict: true accepted")
        loose = {"type": "function", "function": dict(WEATHER["function"], strict=False)}
        ok = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=4, tools=[loose])
        check(ok.choices[0].message.content == "AB", "strict: false accepted")
        for what, calls, named in (("tool_calls not a list", {"id": "c1"}, "tool_calls must be a list"),
                                   ("a call without its function", [{"id": "c1", "type": "function"}], "tool_calls[0]"),
                                   ("arguments as a number", [{"id": "c1", "type": "function",
                                                               "function": {"name": "f", "arguments": 3}}], "arguments")):
            refused(what, named, messages=[{"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "", "tool_calls": calls},
                                           {"role": "user", "content": "q2"}])
        # the same history with arguments as the JSON string clients send renders (GLM iterates them)
        ok = cl.chat.completions.create(model="fake-model", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "wea"}, {"type": "text", "text": "ther?"}]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
        check(ok.choices[0].message.content == "AB", "string arguments and text parts render")
        # "" for a call without arguments (some clients send it): an empty object
        ok = cl.chat.completions.create(model="fake-model", max_tokens=4, messages=[
            {"role": "user", "content": "time?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "noon"}])
        check(ok.choices[0].message.content == "AB", "empty arguments render as an empty object")
        # the rendered prompt: /tokenize of the fake byte tokenizer gives the prompt's bytes back
        st, body = http_post(srv.port, "/tokenize", {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"k\": [1, 2]}"}}]}]})
        ids = json.loads(body)["tokens"] if st == 200 else []
        prompt = prompt_of(ids)
        check("<|user|>\na\nb" in prompt and "<arg_key>k</arg_key>\n<arg_value>[1, 2]</arg_value>" in prompt,
              "normalized messages reach the template", prompt)

        # /tokenize of a chat with what its template gets beside the messages (tools, tool_choice,
        # chat_template_kwargs), as vLLM's: the count a chat request's usage reports for the same body
        q = [{"role": "user", "content": "weather?"}]
        for extra in ({"tools": [WEATHER, TIME]}, {"tools": [WEATHER, TIME], "tool_choice": "none"},
                      {"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
                      {"chat_template_kwargs": {"enable_thinking": False}}, {"add_special_tokens": False}):
            st, body = http_post(srv.port, "/tokenize", dict({"messages": q}, **extra))
            n = json.loads(body)["count"] if st == 200 else -1
            r = cl.chat.completions.create(model="fake-model", messages=q, max_tokens=1,
                                           **{k: v for k, v in extra.items() if k in ("tools", "tool_choice")},
                                           extra_body={k: v for k, v in extra.items()
                                                       if k not in ("tools", "tool_choice", "add_special_tokens")})
            check(st == 200 and n == r.usage.prompt_tokens, "/tokenize with %s: the chat's prompt tokens" % list(extra),
                  (st, n, r.usage.prompt_tokens, body[:200]))
            if "tools" in extra:
                p = prompt_of(json.loads(body)["tokens"])
                choice = extra.get("tool_choice")
                check(("get_weather" in p) == (choice in (None, "auto")) and ("get_time" in p) == (choice != "none"),
                      "/tokenize renders the tools offered", p)
        for extra, param in (({"add_special_tokens": True}, "add_special_tokens"),
                             ({"chat_template_kwargs": {"no_such_switch": 1}}, "no_such_switch")):
            st, body = http_post(srv.port, "/tokenize", dict({"messages": q}, **extra))
            check(st == 400 and param in body.decode(), "/tokenize with %s: 400" % list(extra), body[:200])
        st, body = http_post(srv.port, "/tokenize", {"prompt": "x", "tools": [WEATHER]})
        check(st == 400 and "applies to 'messages'" in body.decode(), "/tokenize tools beside a prompt: 400",
              body[:200])

        # an assistant turn of tool calls with content null (as the SDKs send a reply back) renders
        # empty content, not the text "None"
        st, body = http_post(srv.port, "/tokenize", {"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})
        ids = json.loads(body)["tokens"] if st == 200 else []
        prompt = prompt_of(ids)
        check(st == 200 and "None" not in prompt and "<arg_value>Paris</arg_value>" in prompt,
              "content null renders as empty text", prompt)
        # a template that takes the arguments as text takes any text (a call cut short gives part of one)
        ds = servers[(ds_tmpl, ())]
        st, body = http_post(ds.port, "/tokenize", {"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Par"}}]},
            {"role": "user", "content": "q2"}]})
        prompt = prompt_of(json.loads(body)["tokens"] if st == 200 else [])
        check(st == 200 and "None" not in prompt, "partial arguments as text: rendered (%d)" % st, body[:300])
        # a parsed stream still carries every token's logprobs and the usage
        r1 = servers[(os.path.join(data, "deepseek-r1.jinja"), ())]
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % r1.port, api_key="x", timeout=30, max_retries=0)
        with open(script, "w") as f:
            f.write(" ".join(str(t) for t in tokens(split_markers("Hm.</think>Yes."), True)))
        n_lp, usage, reasoning, content = 0, None, "", ""
        for ch in cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=50, stream=True, logprobs=True,
                                             stream_options={"include_usage": True}):
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                n_lp += len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0
                reasoning += getattr(c.delta, "reasoning_content", None) or ""
                content += c.delta.content or ""
        # (the EOS that ends it counts as a completion token and has no text)
        check(usage is not None and usage.completion_tokens - 1 == n_lp == len(tokens(split_markers("Hm.</think>Yes."), True)),
              "stream logprobs and usage with the parser", (n_lp, usage))
        check(reasoning == "Hm." and content == "Yes.", "stream with logprobs parsed", (reasoning, content))

        # include_reasoning: false: the reasoning parsed out of the answer and not returned
        r = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=50,
                                       extra_body={"include_reasoning": False})
        m = r.choices[0].message
        check(m.content == "Yes." and m.reasoning_content is None and getattr(m, "reasoning", None) is None,
              "include_reasoning false: content only", m)
        sgot, _ = stream_result(cl, "include_reasoning false, streamed", model="fake-model", messages=msgs,
                                max_tokens=50, extra_body={"include_reasoning": False})
        check(sgot["content"] == "Yes." and sgot["reasoning"] is None, "include_reasoning false: no reasoning streamed",
              sgot)
        r = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=50,
                                       extra_body={"include_reasoning": True})
        check(result_of(r.choices[0].message, "include_reasoning true")["reasoning"] == "Hm.",
              "include_reasoning true: the reasoning returned", r.choices[0].message)

        # a control token that is not a marker of this request's parsers (257, the fake's BOS; a
        # tool-call marker in a request without tools) follows skip_special_tokens with the
        # reasoning parser on, as without it; a NUL byte comes back whole
        calls_begin = FAKE_VOCAB + MARKERS.index("<｜tool▁calls▁begin｜>")
        with open(script, "w") as f:
            f.write(" ".join(str(t) for t in tokens(split_markers("H\x00m.</think>Yes."), True) +
                             [257, calls_begin, 77, 0, 78]))
        for skip, want in ((None, "Yes.M\x00N"), (False, "Yes.<|bos|><｜tool▁calls▁begin｜>M\x00N")):
            kw = {"extra_body": {"skip_special_tokens": False}} if skip is False else {}
            r = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=50, **kw)
            got = result_of(r.choices[0].message, "skip_special_tokens %s" % skip)
            check(got["content"] == want and got["reasoning"] == "H\x00m.", "skip_special_tokens %s with the parser: "
                  "content and reasoning" % skip, got)
            sgot, _ = stream_result(cl, "skip_special_tokens %s, streamed" % skip, model="fake-model", messages=msgs,
                                    max_tokens=50, **kw)
            check(sgot["content"] == want and sgot["reasoning"] == "H\x00m.", "skip_special_tokens %s with the "
                  "parser: streamed" % skip, sgot)

        # reasoning_effort reaches a template that reads it: the prompt grows by exactly that line
        ds = servers[(ds_tmpl, ())]
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % ds.port, api_key="x", timeout=30, max_retries=0)
        base = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=2).usage.prompt_tokens
        eff = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=2,
                                         reasoning_effort="high").usage.prompt_tokens
        check(eff - base == len("Reasoning effort: high\n"), "reasoning_effort rendered", (base, eff))

        # DeepSeek's released template does not render tools: refused, not ignored
        srv2 = run_server(exe, os.path.join(data, "deepseek-v3.1.jinja"), [], script)
        servers["v31"] = srv2
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv2.port, api_key="x", timeout=30, max_retries=0)
        refused("tools with a template that does not render them", "tools", tools=[WEATHER])
    finally:
        for s in servers.values():
            check(s.stop() == 0, "clean exit")
    return summary("chat dialects (openai %s): " % openai.__version__)


if __name__ == "__main__":
    sys.exit(main())
