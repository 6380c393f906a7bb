"""Anthropic's Messages API (POST /v1/messages) through the official `anthropic` client, against the
fake server running a scripted model (tests/serve/fake_backend.h) under the released chat templates
of tests/data/chat. Every dialect case of test_chat_dialects.py that has a Messages form is asked
again as a Messages request: its content blocks (thinking, text, tool_use) must hold what the chat
answer's fields hold there (the expected values written in that file), and the stream, read through
the client's own `messages.stream` (which builds the message from the events), the same blocks.
Then the request's translation (system, tool_use and tool_result blocks, thinking, a last assistant
turn as the prefix; counted against /tokenize of the chat messages they stand for), stop_reason
and usage, and the refusals.
Usage: test_messages.py FAKE_SERVER_EXE DATA_DIR. Exits 77 without the anthropic package."""
import json
import os
import sys

try:
    import anthropic
except ImportError:
    print("anthropic package not installed: skipped (pip install anthropic)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_chat_dialects as D  # noqa: E402
from mlatest import check, http_get, http_post, summary  # noqa: E402

SKIP = ("skip_special_tokens", "response_format")  # no Messages form: those cases are left out


def tool_of(t):
    f = t["function"]
    return dict({"name": f["name"], "input_schema": f["parameters"]},
                **({"description": f["description"]} if "description" in f else {}))


def messages_kw(req, max_tokens):
    """A dialect case's request as a Messages request, or None where it has no such form."""
    if any(k in req for k in SKIP):
        return None
    # temperature, top_p and top_k are the API's members, not the newer SDK's typed parameters
    kw = {"model": "fake-model", "messages": req.get("messages", D.MSGS), "extra_body": {"temperature": 0},
          "max_tokens": req.get("max_tokens", max_tokens)}
    if "tools" in req:
        kw["tools"] = [tool_of(t) for t in req["tools"]]
    tc = req.get("tool_choice")
    choice = None
    if isinstance(tc, dict):
        choice = {"type": "tool", "name": tc["function"]["name"]}
    elif tc:
        choice = {"type": {"auto": "auto", "required": "any", "none": "none"}[tc]}
    if req.get("parallel_tool_calls") is False:
        choice = dict(choice or {"type": "auto"}, disable_parallel_tool_use=True)
    if choice:
        kw["tool_choice"] = choice
    if "stop" in req:
        kw["stop_sequences"] = req["stop"]
    ctk = req.get("chat_template_kwargs", {})
    if set(ctk) - {"enable_thinking", "thinking"}:
        return None
    for on in ctk.values():
        kw["thinking"] = {"type": "enabled", "budget_tokens": 1024} if on else {"type": "disabled"}
        if on:  # the budget must be less than max_tokens
            kw["max_tokens"] = max(kw["max_tokens"], 1025)
    return kw


def result_of(msg):
    """A message's blocks as test_chat_dialects' expectations read (content "" as None)."""
    content, reasoning, calls = None, None, []
    for b in msg.content:
        if b.type == "text":
            content = (content or "") + b.text
        elif b.type == "thinking":
            reasoning = (reasoning or "") + b.thinking
        elif b.type == "tool_use":
            calls.append((b.id, "function", b.name, b.input))
    return {"content": content or None, "reasoning": reasoning, "calls": calls}


def cut_calls_as_empty(exp):
    """The expectation with a call cut off (its arguments not JSON) as the Messages answer gives it:
    input {} (its text went out only as the stream's input_json_delta)"""
    return dict(exp, calls=[c[:3] + ({},) if isinstance(c[3], tuple) else c for c in exp["calls"]])


def main():
    exe, data = sys.argv[1:3]
    srv = D.Servers(exe, data, "messages_")
    script_of = srv.script_of

    def client(tmpl, extra=()):
        port = srv.port(tmpl, extra)
        return port, anthropic.Anthropic(base_url="http://127.0.0.1:%d" % port, api_key="x", timeout=30,
                                         max_retries=0)

    try:
        n_cases = 0
        for name, tmpl, extra, output, req, exp, exp_finish in D.CASES:
            kw = messages_kw(req, 1000)
            if kw is None:
                continue
            n_cases += 1
            _, cl = client(tmpl, extra)
            for as_tokens in (True, False):
                what = "%s (%s)" % (name, "marker tokens" if as_tokens else "byte tokens")
                ex = exp[0 if as_tokens else 1] if isinstance(exp, tuple) else exp
                script_of(output, as_tokens)
                m = cl.messages.create(**kw)
                got = result_of(m)
                check(D.expect_match(got, cut_calls_as_empty(ex)), what + ": content blocks", (got, ex))
                want = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[exp_finish]
                if "stop" in req and exp_finish == "stop":
                    want = "stop_sequence"
                check(m.stop_reason == want and m.id.startswith("msg_") and m.role == "assistant",
                      what + ": stop_reason " + want, m.stop_reason)
                with cl.messages.stream(**kw) as st:
                    for _ in st:
                        pass
                    s = st.get_final_message()
                # a call cut off: the client's stream builds what its partial input parses to, the whole
                # message {} (compared where the calls are whole)
                whole = [not isinstance(c[3], tuple) for c in ex["calls"]]
                sr = result_of(s)
                check(D.no_ids(dict(sr, calls=[c for c, w in zip(sr["calls"], whole) if w])) ==
                      D.no_ids(dict(got, calls=[c for c, w in zip(got["calls"], whole) if w])) and
                      len(sr["calls"]) == len(got["calls"]) and s.stop_reason == m.stop_reason,
                      what + ": stream equals it", (sr, got))
        check(n_cases >= 40, "dialect cases asked as Messages requests", n_cases)

        port, cl = client("glm-5.jinja")
        q = [{"role": "user", "content": "What is 2+2?"}]
        # usage: the prompt's tokens (those from the prefix cache as cache_read_input_tokens), output
        script_of("Weigh it.</think>Four.")
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50)
        st, body = http_post(port, "/v1/chat/completions", {"model": "fake-model", "messages": q, "max_tokens": 50})
        cu = json.loads(body)["usage"]
        u = m.usage
        check(u.input_tokens + u.cache_read_input_tokens == cu["prompt_tokens"] and
              u.output_tokens == cu["completion_tokens"] and u.cache_creation_input_tokens == 0,
              "usage as the chat's", (u, cu))
        check([b.type for b in m.content] == ["thinking", "text"] and m.content[0].thinking == "Weigh it." and
              m.content[1].text == "Four." and m.stop_reason == "end_turn" and m.model == "fake-model",
              "thinking and text blocks", m)
        # max_tokens cuts it
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=4)
        check(m.stop_reason == "max_tokens" and m.usage.output_tokens == 4, "max_tokens", m)
        # a stop sequence: stop_reason stop_sequence naming it, whole and streamed
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50, stop_sequences=["zz", "ou"])
        check(m.stop_reason == "stop_sequence" and m.stop_sequence == "ou" and m.content[-1].text == "F",
              "stop_sequence", m)
        with cl.messages.stream(model="fake-model", messages=q, max_tokens=50, stop_sequences=["ou"]) as s:
            types = [ev.type for ev in s]
            fin = s.get_final_message()
        check(fin.stop_reason == "stop_sequence" and fin.stop_sequence == "ou" and types[0] == "message_start" and
              types[-1] == "message_stop" and "message_delta" in types, "stop_sequence streamed", (types, fin))
        # system (a string, or text blocks with cache_control) is a system message first
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50, system=[
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
        st, body = http_post(port, "/tokenize", {"messages": [{"role": "system", "content": "Be brief."}] + q})
        n_sys = json.loads(body)["count"] if st == 200 else -1
        check(m.usage.input_tokens + m.usage.cache_read_input_tokens == n_sys, "system blocks", (m.usage, body[:80]))
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50, system="Be brief.")
        check(m.usage.input_tokens + m.usage.cache_read_input_tokens == n_sys, "system string", m.usage)
        # Claude Code's billing header line (its hashes new each request) is not read: the same prompt as
        # without it, as a block of its own or as a string's first line; the next request, with other
        # hashes, reads all of that prompt from the prefix cache
        def billing(cch):
            return "x-anthropic-billing-header: cc_version=2.1.100.%s; cc_entrypoint=cli; cch=%s;" % (cch[:3], cch)
        _, pcl = client("glm-5.jinja", ["--prefix-cache", "1"])  # blocks of 16 positions
        for i, cch in enumerate(("eb6c6", "0aaa9")):
            m = pcl.messages.create(model="fake-model", messages=q, max_tokens=50, system=[
                {"type": "text", "text": billing(cch)}, {"type": "text", "text": "Be brief."}])
            u = m.usage
            check(u.input_tokens + u.cache_read_input_tokens == n_sys and
                  u.cache_read_input_tokens == (0 if i == 0 else (n_sys - 1) // 16 * 16),
                  "billing header block %d not read" % i, u)
        ct = cl.messages.count_tokens(model="fake-model", messages=q, system=billing("71fea") + "\nBe brief.")
        check(ct.input_tokens == n_sys, "billing header line of a system string not read", (ct, n_sys))
        st, body = http_post(port, "/tokenize", {"messages": q})
        ct = cl.messages.count_tokens(model="fake-model", messages=q,
                                      system=[{"type": "text", "text": billing("aaaaa")}])
        check(st == 200 and ct.input_tokens == json.loads(body)["count"], "a system of the header alone: none",
              (ct, body[:80]))
        ct = cl.messages.count_tokens(model="fake-model", messages=q, system="Be brief.\n" + billing("71fea"))
        check(ct.input_tokens > n_sys, "the header line read where it is not first", (ct, n_sys))
        # the same line where a proxy forwards Claude Code's system prompt into chat completions (a string,
        # text parts, a system message of its own): not read there either
        for i, sys_msgs in enumerate(([{"role": "system", "content": billing("eb6c6") + "\nBe brief."}],
                                      [{"role": "system", "content": [{"type": "text", "text": billing("0aaa9")},
                                                                      {"type": "text", "text": "Be brief."}]}],
                                      [{"role": "developer", "content": billing("71fea")},
                                       {"role": "system", "content": "Be brief."}])):
            st, body = http_post(port, "/tokenize", {"messages": sys_msgs + q})
            check(st == 200 and json.loads(body)["count"] == n_sys, "chat: billing line %d not read" % i, body[:80])
        st, body = http_post(port, "/tokenize", {"messages": [{"role": "system", "content": "Be brief.\n" +
                                                               billing("71fea")}] + q})
        check(st == 200 and json.loads(body)["count"] > n_sys, "chat: the line read where it is not first", body[:80])
        for path in ("/tokenize", "/v1/chat/completions"):  # nothing but that line: nothing to answer
            st, body = http_post(port, path, {"model": "fake-model", "messages": [
                {"role": "system", "content": billing("eb6c6")}]})
            check(st == 400 and b"only Claude Code's billing line" in body, "chat: the line alone refused " + path,
                  (st, body[:200]))

        # a tool loop: the assistant's thinking, text and tool_use, the user's tool_result, as the
        # chat messages they stand for (the prompt's tokens counted against /tokenize of those)
        weather = tool_of(D.WEATHER)
        loop = [{"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Need it.", "signature": ""},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
        as_chat = [{"role": "user", "content": "weather?"},
                   {"role": "assistant", "reasoning_content": "Need it.", "content": "Checking.", "tool_calls": [
                       {"id": "toolu_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}]
        script_of("Ok.</think>Sunny.")
        m = cl.messages.create(model="fake-model", messages=loop, tools=[weather], max_tokens=50)
        st, body = http_post(port, "/tokenize", {"messages": as_chat, "tools": [D.WEATHER]})
        n = json.loads(body)["count"] if st == 200 else -1
        check(m.usage.input_tokens + m.usage.cache_read_input_tokens == n and m.content[-1].text == "Sunny.",
              "a tool loop as chat messages", (m.usage, n, body[:200]))
        p = D.prompt_of(json.loads(body)["tokens"]) if st == 200 else ""
        check("<arg_value>Paris</arg_value>" in p and "sunny" in p and "Need it." in p, "the call, its result and "
              "the thinking rendered", p)
        # count_tokens: the same prompt's tokens, without max_tokens
        ct = cl.messages.count_tokens(model="fake-model", messages=loop, tools=[weather])
        check(ct.input_tokens == n, "count_tokens as /tokenize", (ct, n))
        ct = cl.messages.count_tokens(model="fake-model", messages=q, system="Be brief.")
        check(ct.input_tokens == n_sys, "count_tokens with system", (ct, n_sys))
        st, body = http_post(port, "/v1/messages/count_tokens", {"model": "fake-model", "messages": q, "tools": [
            {"type": "web_search_20250305", "name": "web_search"}]})
        check(st == 400 and b"web_search_20250305" in body, "count_tokens refuses as messages does", body[:200])
        # tool_result content as text blocks, is_error taken
        loop2 = loop[:2] + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                           "is_error": False, "content": [{"type": "text",
                                                                                            "text": "sunny"}]}]}]
        m = cl.messages.create(model="fake-model", messages=loop2, tools=[weather], max_tokens=50)
        check(m.usage.input_tokens + m.usage.cache_read_input_tokens == n, "tool_result text blocks", m.usage)
        # turns of one role in a row are one turn (their blocks in order), as Anthropic's API joins them
        split = [{"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": [{"type": "thinking", "thinking": "Need it.", "signature": ""}]},
                 {"role": "assistant", "content": "Checking."},
                 {"role": "assistant", "content": [loop[1]["content"][2]]}, loop[2]]
        ct = cl.messages.count_tokens(model="fake-model", messages=split, tools=[weather])
        check(ct.input_tokens == n, "assistant turns in a row as one", (ct, n))
        st, body = http_post(port, "/tokenize", {"messages": [{"role": "user", "content": "a\nb"}]})
        ct = cl.messages.count_tokens(model="fake-model", messages=[
            {"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": "b"}]}])
        check(st == 200 and ct.input_tokens == json.loads(body)["count"], "user turns in a row as one", (ct, body[:80]))
        st, body = http_post(port, "/v1/messages/count_tokens", {"model": "fake-model", "messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "image", "source": {}}]}]})
        check(st == 400 and b"messages[1].content[0]" in body, "a mistake in a joined turn named where it is",
              body[:300])
        st, body = http_post(port, "/v1/messages/count_tokens", {"model": "fake-model", "messages": loop + [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]})
        check(st == 400 and b"messages[3]: tool_use_id 'toolu_9' names no tool_use" in body,
              "an unknown tool_use_id in a joined turn named at its own message", body[:300])
        # a last run of assistant turns: one prefix the answer goes on from
        st, body = http_post(port, "/tokenize", {"messages": q + [{"role": "assistant", "content": "Four\nFive"}],
                                                 "continue_final_message": True, "add_generation_prompt": False})
        ct = cl.messages.count_tokens(model="fake-model", messages=q + [{"role": "assistant", "content": "Four"}, {
            "role": "assistant", "content": [{"type": "text", "text": "Five"}]}])
        check(st == 200 and ct.input_tokens == json.loads(body)["count"], "assistant turns in a row as the prefix",
              (ct, body[:120]))
        # the billing header line is skipped in the system prompt only
        st, body = http_post(port, "/tokenize", {"messages": [{"role": "user", "content": billing("eb6c6")}]})
        ct = cl.messages.count_tokens(model="fake-model", messages=[{"role": "user", "content": billing("eb6c6")}])
        check(st == 200 and ct.input_tokens == json.loads(body)["count"], "a user text of the header line kept",
              (ct, body[:80]))
        # context_management: Claude Code's edit, which keeps every thinking block, is the request as sent;
        # an edit that would clear something is refused by name
        ct0 = cl.messages.count_tokens(model="fake-model", messages=loop, tools=[weather])
        for cm in ({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}, {"edits": []},
                   {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "all"}}]}):
            st, body = http_post(port, "/v1/messages/count_tokens", {"model": "fake-model", "messages": loop,
                                                                     "tools": [weather], "context_management": cm})
            check(st == 200 and json.loads(body)["input_tokens"] == ct0.input_tokens, "context_management %r" % cm,
                  body[:200])
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=20, extra_body={
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}})
        check(m.stop_reason in ("end_turn", "max_tokens"), "a message with Claude Code's context_management", m)
        for cm in ({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]},
                   {"edits": [{"type": "clear_thinking_20251015"}]}, {"edits": [{"type": "clear_tool_uses_20250919"}]},
                   {"edits": "x"}, {"clear": True}):
            st, body = http_post(port, "/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": q,
                                                        "context_management": cm})
            check(st == 400 and b"context_management" in body, "context_management %r refused" % cm, body[:300])
        # diagnostics (cache diagnostics): no earlier message to compare: null; an id never answered here:
        # previous_message_not_found
        for prev, want in ((None, None), ("msg_1", {"cache_miss_reason": {"type": "previous_message_not_found"}})):
            req = {"model": "fake-model", "max_tokens": 8, "messages": q, "diagnostics": {"previous_message_id": prev}}
            st, body = http_post(port, "/v1/messages", req)
            check(st == 200 and "diagnostics" in json.loads(body) and json.loads(body)["diagnostics"] == want,
                  "diagnostics %r" % prev, body[:300])
            st, body = http_post(port, "/v1/messages", dict(req, stream=True))
            start = [json.loads(ln[6:]) for ln in body.decode().split("\n") if ln.startswith("data: ")][0]
            check(st == 200 and start["type"] == "message_start" and start["message"]["diagnostics"] == want,
                  "diagnostics %r in message_start" % prev, body[:300])
        # against an earlier answer: null where the prompt goes on from its prompt (Claude Code's billing line,
        # new each request, not counted); else the first place it leaves it (tools, system, a message), with
        # the earlier prompt's tokens from there on (shared out by bytes: all of them from the tools, fewer the
        # later the place)
        base = {"model": "fake-model", "max_tokens": 8, "tools": [weather], "messages": q,
                "system": [{"type": "text", "text": billing("aaaaa")}, {"type": "text", "text": "Be brief."}]}
        st, body = http_post(port, "/v1/messages", dict(base, diagnostics={"previous_message_id": None}))
        first = json.loads(body) if st == 200 else {}
        pid, ptok = first.get("id", ""), sum(first.get("usage", {}).get(k, 0) for k in (
            "input_tokens", "cache_read_input_tokens"))
        check(st == 200 and first.get("diagnostics", 0) is None and ptok > 0, "a first turn that asks", body[:200])

        def diag(req, stream=False):
            st, body = http_post(port, "/v1/messages", dict(req, diagnostics={"previous_message_id": pid},
                                                              stream=stream))
            if st != 200:
                return "status %d" % st
            if stream:
                return [json.loads(ln[6:]) for ln in body.decode().split("\n")
                        if ln.startswith("data: ")][0]["message"].get("diagnostics", "absent")
            return json.loads(body).get("diagnostics", "absent")
        later = q + [{"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"}]
        check(diag(dict(base, messages=later, system=[{"type": "text", "text": billing("bbbbb")},
                                                      {"type": "text", "text": "Be brief."}])) is None,
              "the prompt going on from the earlier one: null")
        got = {}
        for what, req in (("tools_changed", dict(base, tools=[dict(weather, description="Weather, now.")])),
                          ("system_changed", dict(base, system="Be very brief.")),
                          ("messages_changed", dict(base, messages=[{"role": "user", "content": "What is 2+3?"}]))):
            d = diag(req)
            why = d.get("cache_miss_reason", {}) if isinstance(d, dict) else {}
            got[what] = why.get("cache_missed_input_tokens", -1)
            check(why.get("type") == what and 0 < got[what] <= ptok, what, d)
            check(diag(req, stream=True) == d, what + " in message_start")
        check(got["tools_changed"] == ptok and ptok > got["system_changed"] > got["messages_changed"],
              "the tokens missed fewer the later the change", (ptok, got))
        st, body = http_post(port, "/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": q})
        check(st == 200 and "diagnostics" not in json.loads(body), "no diagnostics unless asked", body[:200])
        for d in ({"previous_message_id": 3}, {"compare": "x"}, "x"):
            st, body = http_post(port, "/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": q,
                                                        "diagnostics": d})
            check(st == 400 and b"diagnostics" in body, "diagnostics %r refused" % (d,), body[:300])
        # is_error true: the result's text says so
        loop3 = loop[:2] + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                           "is_error": True, "content": "no such city"}]}]
        st, body = http_post(port, "/tokenize", {"messages": as_chat[:2] + [
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such city"}], "tools": [D.WEATHER]})
        ct = cl.messages.count_tokens(model="fake-model", messages=loop3, tools=[weather])
        p = D.prompt_of(json.loads(body)["tokens"]) if st == 200 else ""
        check(ct.input_tokens == json.loads(body)["count"] and "Error: no such city" in p,
              "a tool_result with is_error as a result reading Error:", (ct, body[:200]))
        # tool search (Claude Code's, ENABLE_TOOL_SEARCH): a tool of defer_loading true is not in the prompt's list
        # of tools; a tool_reference in a tool_result brings it in there, as its definition in the chat form, so
        # that the prompt before it is the prompt without it; its calls are read as any tool's (typed by its schema)
        finder = {"name": "ToolSearch", "description": "Finds tools",
                  "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
        finder_chat = {"type": "function", "function": {"name": "ToolSearch", "description": "Finds tools",
                                                        "parameters": finder["input_schema"]}}
        deferred = dict(weather, defer_loading=True)
        ct = cl.messages.count_tokens(model="fake-model", messages=q, tools=[finder, deferred])
        st, body = http_post(port, "/tokenize", {"messages": q, "tools": [finder_chat]})
        check(st == 200 and ct.input_tokens == json.loads(body)["count"], "a deferred tool not listed",
              (ct, body[:120]))
        found = [{"role": "user", "content": "weather?"},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s", "name": "ToolSearch",
                                                    "input": {"query": "weather"}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
                     {"type": "tool_reference", "tool_name": "get_weather"}]}]}]
        found_chat = [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "toolu_s", "type": "function",
                           "function": {"name": "ToolSearch", "arguments": "{\"query\":\"weather\"}"}}]},
                      {"role": "tool", "tool_call_id": "toolu_s",
                       "content": json.dumps(D.WEATHER, separators=(",", ":"))}]
        ct = cl.messages.count_tokens(model="fake-model", messages=found, tools=[finder, deferred])
        st, body = http_post(port, "/tokenize", {"messages": found_chat, "tools": [finder_chat]})
        n_found = json.loads(body)["count"] if st == 200 else -1
        # (the text itself: tests/unit/test_api_messages.c)
        check(ct.input_tokens == n_found, "a tool_reference as the tool's definition there", (ct, body[:120]))
        script_of('x</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>'
                  '<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>')
        m = cl.messages.create(model="fake-model", messages=found, tools=[finder, deferred], max_tokens=80)
        tu = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and len(tu) == 1 and tu[0].name == "get_weather" and
              tu[0].input == {"city": "Oslo", "days": 3}, "a deferred tool's call typed by its schema", m)
        # chat completions: function.defer_loading, the same rule
        st, body = http_post(port, "/tokenize", {"messages": found_chat, "tools": [
            finder_chat, {"type": "function", "function": dict(D.WEATHER["function"], defer_loading=True)}]})
        check(st == 200 and json.loads(body)["count"] == n_found, "chat: a deferred tool not listed",
              body[:120])
        st, body = http_post(port, "/tokenize", {"messages": found_chat, "tools": [
            {"type": "function", "function": dict(D.WEATHER["function"], defer_loading="yes")}]})
        check(st == 400 and b"defer_loading" in body, "chat: defer_loading not a boolean", body[:200])
        # a call in the answer: a tool_use block with its input an object, stop_reason tool_use; streamed, the
        # client builds the same input from the input_json_delta events
        script_of('x</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>')
        m = cl.messages.create(model="fake-model", messages=q, tools=[weather], max_tokens=80)
        tu = [b for b in m.content if b.type == "tool_use"]
        check(m.stop_reason == "tool_use" and len(tu) == 1 and tu[0].name == "get_weather" and
              tu[0].input == {"city": "Oslo"}, "a tool_use block", m)
        with cl.messages.stream(model="fake-model", messages=q, tools=[weather], max_tokens=80) as s:
            for _ in s:
                pass
            fin = s.get_final_message()
        ftu = [b for b in fin.content if b.type == "tool_use"]
        check(fin.stop_reason == "tool_use" and len(ftu) == 1 and ftu[0].input == {"city": "Oslo"} and
              ftu[0].id.startswith("call_msg_"), "a tool_use block streamed", fin)
        # thinking disabled / enabled: the template's enable_thinking
        script_of("Four.")
        for th, on in (({"type": "disabled"}, False), ({"type": "enabled", "budget_tokens": 1100}, True)):
            m = cl.messages.create(model="fake-model", messages=q, max_tokens=1500, thinking=th)
            st, body = http_post(port, "/tokenize", {"messages": q, "chat_template_kwargs": {"enable_thinking": on}})
            check(m.usage.input_tokens + m.usage.cache_read_input_tokens == json.loads(body)["count"],
                  "thinking %s as enable_thinking" % th["type"], (m.usage, body[:80]))
        # adaptive: the model's own default (the template's, thinking on)
        script_of("Weigh it.</think>Four.")
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50, thinking={"type": "adaptive"})
        check([b.type for b in m.content] == ["thinking", "text"], "thinking adaptive: the model's default", m)
        # display updates (Claude Code's stream-json runs): the thinking as it comes, streamed
        with cl.messages.stream(model="fake-model", messages=q, max_tokens=50,
                                thinking={"type": "adaptive", "display": "updates"}) as s:
            kinds = [ev.delta.type for ev in s if ev.type == "content_block_delta"]
            fin = s.get_final_message()
        check("thinking_delta" in kinds and fin.content[0].thinking == "Weigh it.", "display updates", (kinds, fin))
        # the signature seals the thinking: display omitted sends it alone, and it comes back as the text
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50,
                               thinking={"type": "adaptive", "display": "omitted"})
        th = m.content[0]
        check(th.type == "thinking" and th.thinking == "" and th.signature.startswith("mlaserve-reasoning-1:"),
              "display omitted: the signature alone", m)
        with cl.messages.stream(model="fake-model", messages=q, max_tokens=50,
                                thinking={"type": "adaptive", "display": "omitted"}) as s:
            kinds = [ev.delta.type for ev in s if ev.type == "content_block_delta"]
            fin = s.get_final_message()
        check("thinking_delta" not in kinds and "signature_delta" in kinds and fin.content[0].thinking == "" and
              fin.content[0].signature == th.signature, "display omitted streamed", (kinds, fin))
        sealed = [loop[0], {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": th.signature}, *loop[1]["content"][1:]]}, loop[2]]
        script_of("Ok.</think>Sunny.")
        m = cl.messages.create(model="fake-model", messages=sealed, tools=[weather], max_tokens=50)
        back = [as_chat[0], dict(as_chat[1], reasoning_content="Weigh it."), as_chat[2]]
        st, body = http_post(port, "/tokenize", {"messages": back, "tools": [D.WEATHER]})
        check(m.usage.input_tokens + m.usage.cache_read_input_tokens == json.loads(body)["count"],
              "a thinking block's signature read back as its text", (m.usage, body[:80]))
        # output_config.format: the chat path's json_schema response_format (the scripted model writes its
        # script whatever the grammar); effort where the template reads reasoning_effort (GLM-5's does not)
        script_of('{"a": 1}')
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50, thinking={"type": "disabled"},
                               output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
        check(m.content[-1].text == '{"a": 1}', "output_config.format taken", m)
        # a last assistant turn is the prefix the answer goes on from
        script_of(" is 4.")
        m = cl.messages.create(model="fake-model", max_tokens=50, thinking={"type": "disabled"}, messages=q + [
            {"role": "assistant", "content": "2+2"}])
        check(m.content[-1].text == " is 4.", "a prefill", m)

        # arguments that are not one JSON object (junk after it, a list): input {} whole and streamed
        # (a call's input goes out whole at its end unless a tool asks for eager_input_streaming)
        kport, kcl = client("kimi-k2.jinja")
        # a raw newline inside a string: the input printed anew, so that a strict parser takes the answer
        script_of("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                  '{"city": "Os\nlo"}<|tool_call_end|><|tool_calls_section_end|>')
        st, body = http_post(kport, "/v1/messages", {"model": "fake-model", "messages": q, "max_tokens": 80,
                                                     "tools": [weather]})
        try:
            j = json.loads(body)
        except ValueError:
            j = {}
        check(st == 200 and [b.get("input") for b in j.get("content", [])] == [{"city": "Os\nlo"}],
              "a raw control character in the arguments", body[:300])
        for args in ('{"city": "Oslo"} junk', '[1, 2]', '{"city": "Oslo", }'):
            script_of("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                      "<|tool_call_argument_begin|>" + args + "<|tool_call_end|><|tool_calls_section_end|>")
            st, body = http_post(kport, "/v1/messages", {"model": "fake-model", "messages": q, "max_tokens": 80,
                                                         "tools": [weather]})
            j = json.loads(body) if st == 200 else {}
            tu = [b for b in j.get("content", []) if b["type"] == "tool_use"]
            with kcl.messages.stream(model="fake-model", messages=q, tools=[weather], max_tokens=80) as s:
                deltas = [ev.delta.partial_json for ev in s if ev.type == "content_block_delta" and
                          ev.delta.type == "input_json_delta"]
                fin = s.get_final_message()
            check(len(tu) == 1 and tu[0]["input"] == {} and deltas == ["{}"] and
                  [b.input for b in fin.content if b.type == "tool_use"] == [{}],
                  "arguments %r: input {}, whole and streamed" % args, (body[:300], deltas))
        script_of("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                  '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>')
        for eager in (False, True):
            with kcl.messages.stream(model="fake-model", messages=q, max_tokens=80,
                                     tools=[dict(weather, eager_input_streaming=eager)]) as s:
                deltas = [ev.delta.partial_json for ev in s if ev.type == "content_block_delta" and
                          ev.delta.type == "input_json_delta"]
                fin = s.get_final_message()
            check("".join(deltas) == '{"city": "Oslo"}' and (len(deltas) > 1) == eager and
                  fin.content[0].input == {"city": "Oslo"}, "eager_input_streaming %s" % eager, deltas)
        # a prompt past the context, in Anthropic's words (which clients match to shorten it)
        st, body = http_post(port, "/v1/messages", {"model": "fake-model", "max_tokens": 10, "messages": [
            {"role": "user", "content": "w " * 3000}]})
        check(st == 400 and b"prompt is too long: " in body and b"tokens > 2048 maximum" in body, "prompt too long",
              body[:300])
        st, body = http_post(port, "/v1/messages", {"model": "fake-model", "max_tokens": 2040, "messages": q})
        check(st == 400 and b"exceed context limit: " in body and b"+ 2040 > 2048" in body, "input and max_tokens",
              body[:300])
        # an empty last assistant turn, an empty system prompt: as none
        script_of("Four.")
        m0 = cl.messages.create(model="fake-model", messages=q, max_tokens=20, thinking={"type": "disabled"})
        for extra in ({"messages": q + [{"role": "assistant", "content": ""}]},
                      {"messages": q + [{"role": "assistant", "content": []}]}, {"system": ""}, {"system": []}):
            kw = dict({"model": "fake-model", "messages": q, "max_tokens": 20, "thinking": {"type": "disabled"}},
                      **extra)
            m = cl.messages.create(**kw)
            check(m.usage.input_tokens + m.usage.cache_read_input_tokens ==
                  m0.usage.input_tokens + m0.usage.cache_read_input_tokens and m.content[-1].text == "Four.",
                  "as none: %r" % extra, m)

        # refusals, by name
        def refused(what, param, port_=port, **kw):
            kw.setdefault("model", "fake-model")
            kw.setdefault("messages", q)
            kw.setdefault("max_tokens", 4)
            st, body = http_post(port_, "/v1/messages", kw)
            check(st == 400 and param in body.decode(errors="replace"), what + ": 400 naming " + param, body[:300])

        refused("no max_tokens", "max_tokens", max_tokens=None)
        refused("an image block", "image", messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        refused("a server tool", "web_search_20250305", tools=[{"type": "web_search_20250305", "name": "web_search"}])
        refused("a tool_result naming no tool_use", "names no tool_use", messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}])
        refused("a thinking budget under 1024", "budget_tokens", max_tokens=3000,
                thinking={"type": "enabled", "budget_tokens": 100})
        refused("a thinking budget past max_tokens", "budget_tokens", max_tokens=2000,
                thinking={"type": "enabled", "budget_tokens": 2000})
        refused("an unknown member", "container", container="x")
        refused("metadata of another member", "metadata", metadata={"k": "v"})
        refused("a role of system in messages", "role", messages=[{"role": "system", "content": "x"}])
        # Claude Code's system turn among the messages (for a model it does not know) and its effort: refused in
        # Anthropic's words, on which Claude Code sends the request again without them
        refused("a system turn, in the words Claude Code reads", "role 'system' messages are not supported",
                messages=q + [{"role": "system", "content": [{"type": "text", "text": "# Environment",
                                                              "cache_control": {"type": "ephemeral"}}]}])
        refused("effort, in the words Claude Code reads", "effort parameter", output_config={"effort": "high"})
        refused("redacted thinking", "redacted_thinking", messages=q + [
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"},
                                              {"type": "text", "text": "a"}]},
            {"role": "user", "content": "b"}])
        refused("tool_choice any without tools", "tool_choice", tool_choice={"type": "any"})
        refused("a stop sequence list too long", "stop_sequences", stop_sequences=["s%d" % i for i in range(100)])
        refused("effort the template does not read", "output_config.effort", output_config={"effort": "high"})
        refused("thinking between_tools", "thinking", thinking={"type": "between_tools"})
        refused("a signature not ours", "signature", messages=loop[:1] + [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": "EqQBCkgIAxABGAIiQ"}, {"type": "text", "text": "a"}]},
            {"role": "user", "content": "b"}])
        refused("a tool's defer_loading not a boolean", "defer_loading",
                tools=[dict(tool_of(D.WEATHER), defer_loading="yes")])
        refused("a tool_reference naming no tool", "names no tool of 'tools'", messages=found[:2] + [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
                {"type": "tool_reference", "tool_name": "nope"}]}]}], tools=[finder, deferred])
        refused("every tool deferred", "at least one", tools=[deferred])
        refused("a tool_reference outside a tool_result", "tool_reference", messages=[
            {"role": "user", "content": [{"type": "tool_reference", "tool_name": "get_weather"}]}],
                tools=[finder, deferred])
        refused("an image in a tool_result", "tool_result (text, tool_reference)", messages=found[:2] + [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [
                {"type": "image", "source": {}}]}]}], tools=[finder, deferred])
        refused("temperature past 1", "temperature", temperature=5)
        refused("stop_sequences a string", "stop_sequences", stop_sequences="ab")
        refused("a tool type not a string", "not a string", tools=[dict(tool_of(D.WEATHER), type=5)])
        refused("display with thinking disabled", "thinking.display", thinking={"type": "disabled",
                                                                              "display": "omitted"})
        refused("budget with adaptive", "budget_tokens", thinking={"type": "adaptive", "budget_tokens": 2000})
        refused("a text block of no string", "a text block needs a string", system=[{"type": "text", "text": 5}])
        # a template without a thinking switch: R1 always thinks (disabled refused), GLM's reads one
        r1port, _ = client("deepseek-r1.jinja")
        refused("thinking disabled where the model always thinks", "thinking", port_=r1port,
                thinking={"type": "disabled"})
        # the error in Anthropic's form: "type": "error", error.type and error.message
        try:
            cl.messages.create(model="fake-model", messages=q, max_tokens=4, extra_body={"top_k": "x"})
            check(False, "top_k a string: refused")
        except anthropic.BadRequestError as e:
            check(e.status_code == 400 and "top_k" in str(e) and isinstance(e.body, dict) and
                  e.body.get("type") == "error" and e.body["error"]["type"] == "invalid_request_error",
                  "the SDK reads the 400", e.body)
        try:
            cl.messages.create(model="no-such-model", messages=q, max_tokens=4)
            check(False, "an unknown model: refused")
        except anthropic.NotFoundError as e:
            check(e.body.get("type") == "error" and e.body["error"]["type"] == "not_found_error", "a 404's form",
                  e.body)
        # aliases (serve --model-name NAME,ALIAS...): a request may give any name, the answer carries
        # the first, /v1/models lists each (Claude Code's own model names, served as they are)
        aport, acl = client("glm-5.jinja", ["--model-aliases", "claude-sonnet-4-5,claude-haiku-4-5"])
        script_of("Weigh it.</think>Four.")
        m = acl.messages.create(model="claude-haiku-4-5", messages=q, max_tokens=50)
        check(m.content[-1].text == "Four." and m.model == "fake-model", "an alias answered as the model", m)
        st, body = http_get(aport, "/v1/models")
        check(st == 200 and [d["id"] for d in json.loads(body)["data"]] ==
              ["fake-model", "claude-sonnet-4-5", "claude-haiku-4-5"], "/v1/models lists every name", body)
        st, body = http_get(aport, "/v1/models/claude-sonnet-4-5")
        check(st == 200 and json.loads(body)["id"] == "claude-sonnet-4-5", "an alias retrieved", body)
        # the Anthropic SDK's models API reads the same answers
        ms = list(acl.models.list())
        mr = acl.models.retrieve("claude-haiku-4-5")
        check([x.id for x in ms] == ["fake-model", "claude-sonnet-4-5", "claude-haiku-4-5"] and
              all(x.type == "model" and x.display_name == x.id and x.created_at.year >= 2024 for x in ms) and
              mr.id == "claude-haiku-4-5", "models.list and models.retrieve through the SDK", (ms, mr))
        # its paging: a page of limit names after (or before) a name; the SDK walks the pages
        names = ["fake-model", "claude-sonnet-4-5", "claude-haiku-4-5"]
        pg = acl.models.list(limit=2)
        check([x.id for x in pg.data] == names[:2] and pg.has_more and pg.last_id == names[1],
              "a first page of 2", pg)
        check([x.id for x in acl.models.list(limit=1)] == names, "the SDK walks pages of one", None)
        pages = (("after_id=claude-sonnet-4-5", names[2:], False), ("after_id=fake-model&limit=1", names[1:2], True),
                 ("before_id=claude-haiku-4-5&limit=1", names[1:2], True),
                 ("before_id=claude-sonnet-4-5", names[:1], False), ("beta=true", names, False),
                 ("after_id=claude-haiku-4-5", [], False), ("after_id=fake%2Dmodel&limit=1&limit=2", names[1:2], True),
                 ("before_id=fake-model", [], False))
        for q_, want, more in pages:
            st, body = http_get(aport, "/v1/models?" + q_)
            j = json.loads(body) if st == 200 else {}
            check(st == 200 and [d["id"] for d in j["data"]] == want and j["has_more"] == more and
                  j["first_id"] == (want[0] if want else None) and j["last_id"] == (want[-1] if want else None),
                  "/v1/models?" + q_, body[:300])
        bad = (("limit=0", b"limit must be"), ("limit=1001", b"limit must be"), ("limit=x", b"limit must"),
               ("after_id=nope", b"after_id 'nope' is not"),
               ("after_id=fake-model&before_id=fake-model", b"one of them at most"),
               ("before_id=a+b%2Bc", b"before_id 'a b+c' is not"), ("after_id=", b"after_id '' is not"),
               ("after_id=fake-model%00x", b"after_id holds a NUL byte"), ("limit=%2B2", b"not '+2'"),
               ("limit=+2", b"not ' 2'"))
        for q_, what in bad:
            st, body = http_get(aport, "/v1/models?" + q_)
            check(st == 400 and what in body, "/v1/models?" + q_ + " refused", body[:300])
        try:
            acl.messages.create(model="claude-opus-4", messages=q, max_tokens=4)
            check(False, "a name not among them: refused")
        except anthropic.NotFoundError as e:
            check("serves 'fake-model', also named 'claude-sonnet-4-5', 'claude-haiku-4-5'" in str(e),
                  "a name not among them: 404 naming them", e)
        # a generation that fails once the message has begun: the stream's error event, its type the
        # status's (500: api_error)
        fport, _ = client("glm-5.jinja", ["--fail-at-step", "0"])
        st, body = http_post(fport, "/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": q,
                                                     "stream": True})
        evs = [json.loads(ln[6:]) for ln in body.decode().splitlines() if ln.startswith("data: ")]
        check(st == 200 and evs and evs[0]["type"] == "message_start" and evs[-1]["type"] == "error" and
              evs[-1]["error"]["type"] == "api_error" and "generation failed" in evs[-1]["error"]["message"],
              "a failure after message_start: an error event of type api_error", body[-400:])
        # the server lives on
        script_of("Weigh it.</think>Four.")
        m = cl.messages.create(model="fake-model", messages=q, max_tokens=50)
        check(m.content[-1].text == "Four.", "answered after the refusals", m)
    finally:
        srv.stop_all()
    return summary("messages (anthropic %s): " % anthropic.__version__)


if __name__ == "__main__":
    sys.exit(main())
