"""The Responses API (POST /v1/responses) through the official `openai` client, against the fake
server running a scripted model (tests/serve/fake_backend.h) under the released chat templates of
tests/data/chat. Every dialect case of test_chat_dialects.py is asked again as a Responses
request: its output items (reasoning, message, function calls) must hold what the chat answer's
fields hold there (the expected values written in that file), and the stream, read through the
client's own `responses.stream` (which checks the events' order and identities), must give the
same items, each item's deltas its final text. Then the input items' translation (calls, their
outputs, reasoning; counted against /tokenize of the chat messages they stand for), the usage,
max_output_tokens, and the refusals.
Usage: test_responses.py FAKE_SERVER_EXE DATA_DIR. Exits 77 without the openai package."""
import base64
import json
import os
import sys

try:
    import openai
except ImportError:
    print("openai package not installed: skipped (pip install openai)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_chat_dialects as D  # noqa: E402
from mlatest import check, http_post, summary  # noqa: E402

CHAT_ONLY = ("continue_final_message", "skip_special_tokens")  # no Responses form: those cases are left out


def responses_kw(req, max_tokens):
    """A dialect case's request as a Responses request, or None where it has no such form."""
    if any(k in req for k in CHAT_ONLY):
        return None
    kw = {"model": "fake-model", "input": req.get("messages", D.MSGS), "temperature": 0,
          "max_output_tokens": req.get("max_tokens", max_tokens)}
    if "tools" in req:
        kw["tools"] = [dict({"type": "function"}, **t["function"]) for t in req["tools"]]
    tc = req.get("tool_choice")
    if isinstance(tc, dict):
        kw["tool_choice"] = {"type": "function", "name": tc["function"]["name"]}
    elif tc:
        kw["tool_choice"] = tc
    if "parallel_tool_calls" in req:
        kw["parallel_tool_calls"] = req["parallel_tool_calls"]
    if "response_format" in req:
        kw["text"] = {"format": {"type": req["response_format"]["type"]}}
    extra = {k: req[k] for k in ("chat_template_kwargs", "stop") if k in req}
    if extra:
        kw["extra_body"] = extra
    return kw


def result_of(resp):
    """A response's output as test_chat_dialects' expectations read (content "" as None)."""
    content, reasoning, calls = None, None, []
    for it in resp.output:
        if it.type == "message":
            content = (content or "") + "".join(p.text for p in it.content)
        elif it.type == "reasoning":
            reasoning = (reasoning or "") + "".join(c.text for c in (it.content or []))
        elif it.type == "function_call":
            calls.append((it.call_id, "function", it.name, D.args_of(it.arguments)))
    return {"content": content or None, "reasoning": reasoning, "calls": calls}


def stream_of(cl, what, kw):
    """The final response of a stream read by the client's `responses.stream`; each item's deltas must
    make its final text, the sequence numbers count up from 0."""
    seqs, acc, ok_deltas = [], {}, True
    with cl.responses.stream(**kw) as st:
        for ev in st:
            seqs.append(ev.sequence_number)
            if ev.type in ("response.output_text.delta", "response.reasoning_text.delta",
                           "response.function_call_arguments.delta"):
                acc[ev.item_id] = acc.get(ev.item_id, "") + ev.delta
            elif ev.type == "response.output_item.done":
                it = ev.item
                text = (it.arguments if it.type == "function_call"
                        else "".join(p.text for p in (it.content or [])))
                ok_deltas &= acc.get(it.id, "") == text
        final = st.get_final_response()
    check(seqs == list(range(len(seqs))), what + ": sequence numbers 0, 1, ...", seqs[:20])
    check(ok_deltas, what + ": each item's deltas make its text")
    return final


def main():
    exe, data = sys.argv[1:3]
    srv = D.Servers(exe, data, "responses_")
    script_of = srv.script_of

    def client(tmpl, extra=()):
        port = srv.port(tmpl, extra)
        return port, openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", timeout=30, max_retries=0)

    try:
        n_cases = 0
        for name, tmpl, extra, output, req, exp, exp_finish in D.CASES:
            kw = responses_kw(req, 1000)
            if kw is None:
                continue
            n_cases += 1
            _, cl = client(tmpl, extra)
            for as_tokens in (True, False):
                what = "%s (%s)" % (name, "marker tokens" if as_tokens else "byte tokens")
                ex = exp[0 if as_tokens else 1] if isinstance(exp, tuple) else exp
                script_of(output, as_tokens)
                r = cl.responses.create(**kw)
                got = result_of(r)
                check(D.expect_match(got, ex), what + ": output items", (got, ex))
                check(r.status == "completed" and r.incomplete_details is None, what + ": completed", r.status)
                s = stream_of(cl, what, kw)
                check(D.no_ids(result_of(s)) == D.no_ids(got) and s.status == r.status, what + ": stream equals it",
                      (result_of(s), got))
                check([it.type for it in s.output] == [it.type for it in r.output], what + ": the same items")
                # a call the output ended inside (the chat's finish_reason is then not tool_calls) is
                # incomplete; the ones before it completed
                fc = [it.status for it in r.output if it.type == "function_call"]
                want = ["completed"] * len(fc)
                if fc and exp_finish != "tool_calls":
                    want[-1] = "incomplete"
                check(fc == want, what + ": calls' status", fc)
        check(n_cases >= 40, "dialect cases asked as Responses requests", n_cases)

        port, cl = client("glm-5.jinja")
        # the usage: input as a chat prompt's tokens, output, the reasoning's share, cached tokens
        script_of("Weigh it.</think>Four.")
        q = [{"role": "user", "content": "What is 2+2?"}]
        r = cl.responses.create(model="fake-model", input=q, max_output_tokens=50)
        c = cl.chat.completions.create(model="fake-model", messages=q, max_tokens=50)
        u = r.usage
        check(u.input_tokens == c.usage.prompt_tokens and u.output_tokens == c.usage.completion_tokens and
              u.total_tokens == u.input_tokens + u.output_tokens, "usage as the chat's", (u, c.usage))
        # the scripted tokens: "Weigh it." then </think> are the reasoning's (one marker token each)
        check(u.output_tokens_details.reasoning_tokens == len("Weigh it.") + 1, "reasoning tokens", u)
        check(u.input_tokens_details.cached_tokens >= 0, "cached tokens reported", u)
        check(r.id.startswith("resp_") and r.object == "response" and r.model == "fake-model" and
              r.tool_choice == "auto" and r.tools == [] and r.parallel_tool_calls is True and
              r.text.format.type == "text" and r.store is False, "the response object's members", r)
        # a string input is the user's message; instructions a system message before it
        r2 = cl.responses.create(model="fake-model", input="What is 2+2?", max_output_tokens=50)
        check(r2.usage.input_tokens == u.input_tokens, "a string input is a user message", (r2.usage, u))
        r3 = cl.responses.create(model="fake-model", input="What is 2+2?", instructions="Be brief.",
                                 max_output_tokens=50)
        st, body = http_post(port, "/tokenize", {"messages": [{"role": "system", "content": "Be brief."}] + q})
        check(st == 200 and json.loads(body)["count"] == r3.usage.input_tokens and r3.instructions == "Be brief.",
              "instructions: a system message", (body[:100], r3.usage))
        # max_output_tokens cuts it: incomplete, the last item too, in the stream and whole
        r = cl.responses.create(model="fake-model", input=q, max_output_tokens=4)
        check(r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens" and
              r.output[-1].status == "incomplete" and r.output[-1].type == "reasoning", "max_output_tokens: incomplete",
              r)
        events = [ev for ev in cl.responses.create(model="fake-model", input=q, max_output_tokens=4, stream=True)]
        check(events[0].type == "response.created" and events[1].type == "response.in_progress" and
              events[-1].type == "response.incomplete" and
              events[-1].response.incomplete_details.reason == "max_output_tokens",
              "max_output_tokens streamed: response.incomplete", [e.type for e in events])
        # text.format json_schema: the chat path's structured output (the scripted model writes its
        # script whatever the grammar: test_structured.py checks the grammar's effect)
        script_of('{"a": 1}')
        r = cl.responses.create(model="fake-model", input=q, max_output_tokens=50, text={"format": {
            "type": "json_schema", "name": "a", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "strict": True}})
        check(r.status == "completed" and r.text.format.type == "json_schema", "text.format json_schema taken", r)

        # input items: a call, its output and the reasoning before it are the chat history they
        # stand for (the prompt's tokens counted against /tokenize of those messages)
        weather = dict({"type": "function"}, **D.WEATHER["function"])
        items = [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
                 {"type": "reasoning", "id": "rs_1", "summary": [],
                  "content": [{"type": "reasoning_text", "text": "Need it."}]},
                 {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                  "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
                 {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather",
                  "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
                 {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
        as_chat = [{"role": "user", "content": "weather?"},
                   {"role": "assistant", "reasoning_content": "Need it.", "content": "Checking.", "tool_calls": [
                       {"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        script_of("Ok.</think>Sunny.")
        r = cl.responses.create(model="fake-model", input=items, tools=[weather], max_output_tokens=50)
        st, body = http_post(port, "/tokenize", {"messages": as_chat, "tools": [D.WEATHER]})
        n = json.loads(body)["count"] if st == 200 else -1
        check(r.usage.input_tokens == n and result_of(r)["content"] == "Sunny.", "input items as chat messages",
              (r.usage.input_tokens, n, body[:200]))
        p = D.prompt_of(json.loads(body)["tokens"]) if st == 200 else ""
        check("<arg_value>Paris</arg_value>" in p and "sunny" in p, "the call and its output rendered", p)
        # as newer SDKs dump the items: their optional members as null
        dumped = [dict(it, namespace=None, caller=None) if it.get("type") == "function_call" else it for it in items]
        r = cl.responses.create(model="fake-model", input=dumped, tools=[weather], max_output_tokens=50)
        check(r.usage.input_tokens == n, "items with null namespace / caller", r.usage)
        # a reasoning item's summary where its content is empty
        summ = [items[0], {"type": "reasoning", "content": [], "summary": [{"type": "summary_text", "text": "Need it."}]},
                *items[2:]]
        r = cl.responses.create(model="fake-model", input=summ, tools=[weather], max_output_tokens=50)
        check(r.usage.input_tokens == n, "a summary read where the content is empty", (r.usage.input_tokens, n))
        # an answer that was its reasoning alone goes back as input: an assistant turn of its own
        script_of("Only thought.</think>")
        r = cl.responses.create(model="fake-model", input="q", max_output_tokens=50)
        check([it.type for it in r.output] == ["reasoning"], "an answer of reasoning alone", r.output)
        script_of("Ok.</think>Sunny.")
        back = [{"role": "user", "content": "q"}] + [it.model_dump(exclude_none=True) for it in r.output] + \
            [{"role": "user", "content": "and?"}]
        r2 = cl.responses.create(model="fake-model", input=back, max_output_tokens=50)
        st, body = http_post(port, "/tokenize", {"messages": [
            {"role": "user", "content": "q"}, {"role": "assistant", "content": "", "reasoning_content": "Only thought."},
            {"role": "user", "content": "and?"}]})
        check(st == 200 and r2.usage.input_tokens == json.loads(body)["count"], "reasoning alone sent back",
              (r2.usage, body[:100]))

        # reasoning carried by encrypted_content (include), and its summary (the reasoning whole): a
        # call's reasoning sent back as the blob alone renders as the text it sealed
        script_of("Need it.</think>Sunny.")
        r = cl.responses.create(model="fake-model", input=q, max_output_tokens=50, reasoning={"summary": "auto"},
                                include=["reasoning.encrypted_content"], prompt_cache_key="thread-1")
        rs = [it for it in r.output if it.type == "reasoning"]
        check(len(rs) == 1 and rs[0].content[0].text == "Need it." and rs[0].summary[0].text == "Need it." and
              rs[0].encrypted_content.startswith("mlaserve-reasoning-1:") and r.reasoning.summary == "auto" and
              r.prompt_cache_key == "thread-1", "summary, encrypted_content, prompt_cache_key", r)
        sealed = [items[0], {"type": "reasoning", "summary": [], "encrypted_content": rs[0].encrypted_content},
                  *items[2:]]
        r2 = cl.responses.create(model="fake-model", input=sealed, tools=[weather], max_output_tokens=50)
        st, body = http_post(port, "/tokenize", {"messages": [dict(as_chat[1], reasoning_content="") if i == 1 else m
                                                             for i, m in enumerate(as_chat)], "tools": [D.WEATHER]})
        n_without = json.loads(body)["count"] if st == 200 else -1
        check(r2.usage.input_tokens == n and n_without < n, "encrypted_content read back as its reasoning",
              (r2.usage.input_tokens, n, n_without))
        # not one of ours: a blob that is not base64, or whose text holds a NUL
        for blob in ("mlaserve-reasoning-1:@@@@", "mlaserve-reasoning-1:QQBC", "mlaserve-reasoning-1:QQ==QQ==",
                     "mlaserve-reasoning-1:" + base64.b64encode(b"bad \xff\xfe utf8").decode(),
                     "mlaserve-reasoning-1:    TmVlZA==", "mlaserve-reasoning-1:TmVl ZA=="):
            st, body = http_post(port, "/v1/responses", {"model": "fake-model", "input": [
                {"type": "reasoning", "summary": [], "encrypted_content": blob}, {"role": "user", "content": "q"}]})
            check(st == 400 and b"encrypted_content" in body, "a blob not ours refused: " + blob, body[:200])
        # summary over the older generate_summary: what is done is what the answer repeats
        r = cl.responses.create(model="fake-model", input=q, max_output_tokens=50,
                                reasoning={"summary": None, "generate_summary": "auto"})
        rs2 = [it for it in r.output if it.type == "reasoning"]
        check(rs2 and rs2[0].summary == [] and r.reasoning.summary is None, "summary null wins", r)
        # streamed: the summary's events, their deltas the reasoning
        deltas, summ_done = "", None
        with cl.responses.stream(model="fake-model", input=q, max_output_tokens=50, reasoning={"summary": "detailed"},
                                 include=["reasoning.encrypted_content"]) as st_:
            for ev in st_:
                if ev.type == "response.reasoning_summary_text.delta":
                    deltas += ev.delta
                elif ev.type == "response.reasoning_summary_text.done":
                    summ_done = ev.text
            fin = st_.get_final_response()
        frs = [it for it in fin.output if it.type == "reasoning"]
        check(deltas == summ_done == "Need it." and frs and frs[0].summary[0].text == "Need it." and
              frs[0].encrypted_content == rs[0].encrypted_content, "summary streamed", (deltas, summ_done, fin.output))
        # a request as Codex CLI (0.163) sends it for a model it does not know: its base prompt as the first
        # developer message, client_metadata (its conversation's ids), reasoning summary, encrypted reasoning,
        # prompt_cache_key, strict false tools and an MCP server's namespace, parallel calls; streamed
        codex_md = {"x-codex-installation-id": "cd5890b6-0000-4000-8000-000000000000", "thread_id": "01a2",
                    "turn_id": "01a3", "x-codex-window-id": "01a2:0"}
        codex = {"model": "fake-model", "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]}],
            "tools": [dict(weather, strict=False), {"type": "namespace", "name": "mcp__wx", "description": "Weather.",
                                                    "tools": [dict(weather, strict=False)]}],
            "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"}, "store": False,
            "stream": True, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0199a1b2-c3d4-7000-8000-000000000000", "client_metadata": codex_md}
        script_of("Need it.</think>Sunny.")

        def codex_ok(req, what):
            st, body = http_post(port, "/v1/responses", req)
            evs = [json.loads(ln[6:]) for ln in body.decode().splitlines() if ln.startswith("data: ")]
            last = evs[-1] if evs else {}
            out = last.get("response", {}).get("output", [])
            check(st == 200 and last.get("type") == "response.completed" and [it["type"] for it in out] ==
                  ["reasoning", "message"] and out[0].get("encrypted_content"), what, body[-400:])
        codex_ok(codex, "a Codex CLI request")
        # its compaction turn (on any provider but OpenAI's): the history, no tools, tool_choice auto
        codex_ok(dict(codex, tools=[], input=codex["input"] + [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summarize."}]}]),
            "a Codex CLI compaction request (no tools, tool_choice auto)")
        # an image a tool returned (its view_image): a line saying it is not shown, so that the history that
        # keeps it does not fail every later turn
        shot = codex["input"] + [
            {"type": "function_call", "call_id": "v1", "name": "view_image", "arguments": "{\"path\": \"a.png\"}"},
            {"type": "function_call_output", "call_id": "v1", "output": [
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
                {"type": "input_text", "text": "a.png"}]}]
        codex_ok(dict(codex, input=shot), "a tool's image in a Codex CLI history")
        st, body = http_post(port, "/tokenize", {"messages": [
            {"role": "system", "content": "You are Codex."}, {"role": "system", "content": "Sandbox: none."},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "v1", "type": "function", "function": {
                "name": "view_image", "arguments": "{\"path\": \"a.png\"}"}}]},
            {"role": "tool", "tool_call_id": "v1",
             "content": "(an image, not shown: this model reads text only)\na.png"}]})
        st2, body2 = http_post(port, "/v1/responses", dict(codex, input=shot, stream=False, tools=[]))
        check(st == 200 and st2 == 200 and json.loads(body2)["usage"]["input_tokens"] == json.loads(body)["count"],
              "a tool's image read as the line that says so", (body[:100], body2[:300]))

        # a namespace of function tools (Codex's MCP servers): each function is chat's NAMESPACE__NAME, the
        # namespace's description before its own; a call of one goes out as a function_call of its own name and
        # the namespace (whole and streamed), and reads back from the input the same way
        ns_tool = {"type": "namespace", "name": "mcp__wx", "description": "Weather server.", "tools": [weather]}
        flat = {"type": "function", "function": dict(D.WEATHER["function"], name="mcp__wx__get_weather",
                                                     description="Weather server.\n\nWeather of a city")}
        script_of('x</think><tool_call>mcp__wx__get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>'
                  '</tool_call>')
        st, body = http_post(port, "/v1/responses", {"model": "fake-model", "input": "weather?", "tools": [ns_tool],
                                                     "max_output_tokens": 80})
        rj = json.loads(body) if st == 200 else {}
        calls = [it for it in rj.get("output", []) if it["type"] == "function_call"]
        st2, body2 = http_post(port, "/tokenize", {"messages": [{"role": "user", "content": "weather?"}],
                                                   "tools": [flat]})
        check(st2 == 200 and rj.get("usage", {}).get("input_tokens") == json.loads(body2)["count"],
              "a namespace's functions as chat's NAMESPACE__NAME", (body[:300], body2[:100]))
        check(len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0].get("namespace") == "mcp__wx" and
              json.loads(calls[0]["arguments"]) == {"city": "Oslo"} and rj["tools"] == [ns_tool],
              "a namespace's call as its name and namespace", body[:600])
        st, body = http_post(port, "/v1/responses", {"model": "fake-model", "input": "weather?", "tools": [ns_tool],
                                                     "max_output_tokens": 80, "stream": True})
        evs = [json.loads(ln[6:]) for ln in body.decode().splitlines() if ln.startswith("data: ")]
        done = [ev for ev in evs if ev["type"] == "response.output_item.done" and ev["item"]["type"] == "function_call"]
        args_done = [ev for ev in evs if ev["type"] == "response.function_call_arguments.done"]
        check(len(done) == 1 and done[0]["item"]["namespace"] == "mcp__wx" and done[0]["item"]["name"] ==
              "get_weather" and len(args_done) == 1 and args_done[0]["name"] == "get_weather",
              "a namespace's call streamed", body[-800:])
        st, body = http_post(port, "/v1/responses", {"model": "fake-model", "input": "weather?", "tools": [ns_tool],
                                                     "max_output_tokens": 80, "tool_choice": {
                                                         "type": "function", "name": "get_weather",
                                                         "namespace": "mcp__wx"}})
        calls = [it for it in json.loads(body).get("output", []) if it["type"] == "function_call"] if st == 200 else []
        check(len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0].get("namespace") == "mcp__wx",
              "tool_choice naming a namespace's function", body[:600])
        ns_items = [{"role": "user", "content": "weather?"},
                    {"type": "function_call", "call_id": "c1", "name": "get_weather", "namespace": "mcp__wx",
                     "arguments": "{\"city\": \"Paris\"}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
        st, body = http_post(port, "/v1/responses", {"model": "fake-model", "input": ns_items, "tools": [ns_tool],
                                                     "max_output_tokens": 20})
        st2, body2 = http_post(port, "/tokenize", {"messages": [as_chat[0], {
            "role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "mcp__wx__get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, as_chat[2]],
            "tools": [flat]})
        check(st == 200 and st2 == 200 and json.loads(body)["usage"]["input_tokens"] == json.loads(body2)["count"],
              "a namespace's call read back from the input", (body[:300], body2[:100]))

        # refusals, by name
        def refused(what, param, **kw):
            kw.setdefault("input", "q")
            try:
                kw.setdefault("max_output_tokens", 4)
                cl.responses.create(model="fake-model", **kw)
                check(False, what + ": refused")
            except openai.BadRequestError as e:
                body = e.body if isinstance(e.body, dict) else {}
                check(e.status_code == 400 and param in str(body.get("message", "")) + str(body.get("param", "")),
                      what + ": 400 naming " + param, body)

        refused("store true", "store", store=True)
        refused("previous_response_id", "previous_response_id", previous_response_id="resp_x")
        refused("include of logprobs", "include", include=["message.output_text.logprobs"])
        refused("reasoning summary of another kind", "reasoning.summary", reasoning={"summary": "brief"})
        refused("prompt_cache_key not a string", "prompt_cache_key", extra_body={"prompt_cache_key": 7})
        refused("an unknown parameter", "max_tool_calls", max_tool_calls=3)
        refused("background", "background", background=True)
        refused("truncation auto", "truncation", truncation="auto")
        refused("a web search tool", "web_search", tools=[{"type": "web_search", "external_web_access": False}])
        refused("a web search tool, as Codex CLI's config turns it off", 'web_search = "disabled"',
                tools=[{"type": "web_search", "external_web_access": False}])
        refused("client_metadata of another value", "client_metadata", extra_body={"client_metadata": {"a": 1}})
        refused("tool_choice required without tools", "tool_choice", tools=[], tool_choice="required")
        refused("a user's image", "input_image", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}])
        refused("an image part", "input_image", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x"}]}])
        refused("an unknown item", "item_reference", input=[{"type": "item_reference", "id": "x"}])
        refused("encrypted reasoning", "encrypted_content", input=[
            {"type": "reasoning", "summary": [], "encrypted_content": "zzz"}, {"role": "user", "content": "q"}])
        refused("an empty input", "input", input=[])
        refused("a chat parameter", "messages", extra_body={"messages": []})
        refused("max_output_tokens past the context", "max_output_tokens", max_output_tokens=10 ** 8)
        refused("reasoning effort the template does not read", "reasoning.effort", reasoning={"effort": "high"})
        refused("a tool of no name", "tools", tools=[{"type": "function", "parameters": {}}])
        refused("a namespace of another tool", "tools[0].tools[0]", tools=[
            {"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}])
        refused("a namespace of no tools list", "tools[0]", tools=[{"type": "namespace", "name": "n"}])
        refused("a deferred function in a namespace", "defer_loading", tools=[
            {"type": "namespace", "name": "n", "tools": [dict(weather, defer_loading=True)]}])
        refused("a call's namespace not a string", "namespace", input=[
            {"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c", "name": "f", "namespace": 5,
                                                 "arguments": "{}"}])
        # a namespace's functions counted, named and described in the request's own terms, before any copy
        refused("a namespace's functions past 128", "at most 128 tools", tools=[
            {"type": "namespace", "name": "n", "tools": [dict(weather, name="f%d" % k) for k in range(129)]}])
        refused("a namespace's description past 1 MiB as repeated", "descriptions", tools=[
            {"type": "namespace", "name": "n", "description": "d" * 20000,
             "tools": [dict(weather, name="f%d" % k) for k in range(60)]}])
        refused("two functions of one name in a namespace", "tools[0].tools[1].name 'n__get_weather' (its namespace's "
                "name, '__' and its own) is tools[0].tools[0]'s too", tools=[
                    {"type": "namespace", "name": "n", "tools": [weather, weather]}])
        refused("a tool named as a namespace's function", "tools[1].name 'mcp__wx__get_weather' is tools[0].tools[0]'s",
                tools=[ns_tool, dict(weather, name="mcp__wx__get_weather")])
        refused("a namespace's name and a function's past 256 bytes together", "tools[0].tools[0].name (its "
                "namespace's name, '__' and its own) is 402 bytes", tools=[
                    {"type": "namespace", "name": "n" * 200, "tools": [dict(weather, name="f" * 200)]}])
        refused("a namespace's function of an empty name", "tools[0].tools[0] needs a non-empty string name", tools=[
            {"type": "namespace", "name": "n", "tools": [dict(weather, name="")]}])
        refused("a call's namespace empty", "input[1].namespace must be a non-empty string", input=[
            {"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c", "name": "f", "namespace": "",
                                                 "arguments": "{}"}])
        refused("tool_choice of an empty namespace", "tool_choice", tools=[ns_tool], tool_choice={
            "type": "function", "name": "get_weather", "namespace": ""})
        refused("a tool's audio", "parts of type 'input_audio' are not supported (input_text; input_image and "
                "input_file", input=[{"role": "user", "content": "q"},
                                     {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                     {"type": "function_call_output", "call_id": "c",
                                      "output": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}])
        refused("client_metadata of a long value", "client_metadata", extra_body={"client_metadata": {"a": "x" * 513}})
        refused("metadata not strings", "metadata", metadata={"a": 1})
        refused("tool_choice without tools", "tool_choice", tool_choice="required")
        refused("a call's output naming no call", "names no function_call", input=[
            {"role": "user", "content": "q"}, {"type": "function_call_output", "call_id": "nope", "output": "x"}])
        # the message names the Responses member, not the chat body's
        try:
            cl.responses.create(model="fake-model", input="q", extra_body={"max_output_tokens": "5"})
            check(False, "max_output_tokens a string: refused")
        except openai.BadRequestError as e:
            m = str(e.body.get("message", "")) if isinstance(e.body, dict) else ""
            check("max_output_tokens" in m and "max_completion_tokens" not in m, "the message names max_output_tokens", m)
        # refused where the scheduler takes it (a request the whole cache cannot hold), whole and streamed
        _, small = client("glm-5.jinja", ("--n-blocks", "4", "--block-size", "16"))
        for stream in (False, True):
            try:
                small.responses.create(model="fake-model", input="q", max_output_tokens=500, stream=stream)
                check(False, "a request past the cache: refused (stream %s)" % stream)
            except openai.BadRequestError as e:
                check("KV cache" in str(e), "a request past the cache: 400 (stream %s)" % stream, e)
        # the server lives on: an answer after the refusals
        script_of("Weigh it.</think>Four.")
        r = cl.responses.create(model="fake-model", input="q", max_output_tokens=50, metadata={"k": "é" * 300})
        check(result_of(r)["content"] == "Four." and r.metadata == {"k": "é" * 300}, "answered after the refusals "
              "(metadata counted in characters)", r)
    finally:
        srv.stop_all()
    return summary("responses (openai %s): " % openai.__version__)


if __name__ == "__main__":
    sys.exit(main())
