"""The official `openai` Python package against the fake server: completions and chat,
streaming and not, logprobs, errors. Usage: test_openai.py FAKE_SERVER_EXE.
Exits 77 (skipped) when the openai package is not installed (pip install openai)."""
import os
import sys

try:
    import openai
except ImportError:
    print("openai package not installed: skipped (pip install openai)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fakeref as R  # noqa: E402
from mlatest import check, summary  # noqa: E402


def main():
    srv = R.Server(sys.argv[1], "--api-key", "k-123")
    try:
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="k-123", timeout=30, max_retries=0)
        models = cl.models.list()
        check([m.id for m in models.data] == ["fake-model"], "models.list")
        m = cl.models.retrieve("fake-model")
        check(m.id == "fake-model" and m.object == "model", "models.retrieve")
        try:
            cl.models.retrieve("other-model")
            check(False, "models.retrieve of another model: 404")
        except openai.NotFoundError as e:
            check("other-model" in str(e), "models.retrieve of another model: 404 naming it")

        prompt = "The openai client"
        toks, lps, tops, fin = R.generate(R.encode(prompt), 12, n_top=2)
        r = cl.completions.create(model="fake-model", prompt=prompt, max_tokens=12, temperature=0, logprobs=2)
        c = r.choices[0]
        check(c.text == R.text_of(toks) and c.finish_reason == "length", "completions text")
        check(c.logprobs.tokens == [chr(t) for t in toks], "completions logprobs tokens")
        check([R.f32(x) for x in c.logprobs.token_logprobs] == lps, "completions token_logprobs")
        check(len(c.logprobs.top_logprobs) == 12 and all(len(d) == 2 for d in c.logprobs.top_logprobs), "completions top_logprobs")
        check(r.usage.completion_tokens == 12 and r.usage.prompt_tokens == len(R.encode(prompt)), "completions usage")

        # echo: the prompt's tokens first (the BOS without text), their logprobs the fake model's
        # over each prefix (fake_backend.h fake_plp), the first one null
        ids = R.encode(prompt)
        r = cl.completions.create(model="fake-model", prompt=prompt, max_tokens=12, temperature=0, logprobs=2, echo=True)
        c = r.choices[0]
        want_p = [None] + [R.fake_next(ids[:k], n_top=2)[1] for k in range(1, len(ids))]
        check(c.text == prompt + R.text_of(toks), "echo: the prompt's text, then the answer")
        check(c.logprobs.tokens[len(ids):] == [chr(t) for t in toks] and len(c.logprobs.tokens) == len(ids) + 12,
              "echo: a token entry for each prompt token, then the answer's")
        got_p = [None if x is None else R.f32(x) for x in c.logprobs.token_logprobs[:len(ids)]]
        check(got_p == want_p and c.logprobs.top_logprobs[0] is None, "echo: the prompt's logprobs", (got_p[:4], want_p[:4]))
        check(c.logprobs.text_offset[:3] == [0, 0, 1] and r.usage.prompt_tokens == len(ids), "echo: offsets and usage")

        text, last = "", None
        for ch in cl.completions.create(model="fake-model", prompt=prompt, max_tokens=12, stream=True,
                                        stream_options={"include_usage": True}):
            if ch.choices:
                text += ch.choices[0].text
                if ch.choices[0].finish_reason:
                    last = ch.choices[0].finish_reason
            elif ch.usage:
                check(ch.usage.completion_tokens == 12, "stream usage")
        check(text == R.text_of(toks) and last == "length", "completions stream")

        msgs = [{"role": "user", "content": "What is 7 plus 5?"}]
        ctoks, clps, ctops, cfin = R.generate(R.chat_prompt(msgs), 10, n_top=3)
        r = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=10, logprobs=True, top_logprobs=3)
        c = r.choices[0]
        check(c.message.role == "assistant" and c.message.content == R.text_of(ctoks), "chat content")
        check([x.token for x in c.logprobs.content] == [chr(t) for t in ctoks], "chat logprobs tokens")
        check([R.f32(x.logprob) for x in c.logprobs.content] == clps, "chat logprobs")
        check(all(len(x.top_logprobs) == 3 and x.bytes == [t] for x, t in zip(c.logprobs.content, ctoks)), "chat top_logprobs/bytes")

        text, fins, lpn = "", [], 0
        for ch in cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=10, stream=True, logprobs=True):
            d = ch.choices[0].delta
            text += d.content or ""
            if ch.choices[0].logprobs and ch.choices[0].logprobs.content:
                lpn += len(ch.choices[0].logprobs.content)
            if ch.choices[0].finish_reason:
                fins.append(ch.choices[0].finish_reason)
        check(text == R.text_of(ctoks) and fins == ["length"] and lpn == 10, "chat stream")

        full = R.text_of(ctoks)
        stop = full[4:6]
        r = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=10, stop=stop)
        check(r.choices[0].message.content == full[:full.index(stop)] and r.choices[0].finish_reason == "stop", "chat stop string")

        # n choices: each the model's answer (the fake model is greedy), indexed 0..n-1, one id,
        # the prompt counted once in the usage; streamed, each choice's chunks carry its index and
        # finish, the usage of all comes once at the end
        r = cl.completions.create(model="fake-model", prompt=prompt, max_tokens=12, temperature=0, n=3, best_of=3,
                                  logprobs=1)
        check([c.index for c in r.choices] == [0, 1, 2] and all(c.text == R.text_of(toks) for c in r.choices),
              "n=3: three choices, each the answer", [(c.index, c.text) for c in r.choices])
        check(all([R.f32(x) for x in c.logprobs.token_logprobs] == lps for c in r.choices), "n=3: each its logprobs")
        check(r.usage.prompt_tokens == len(R.encode(prompt)) and r.usage.completion_tokens == 36, "n=3: usage", r.usage)
        # a list of prompts: each its n choices in a row (prompt p's choice k at p * n + k), each prompt
        # counted once in the usage; echo renders each choice's own prompt
        prompts = ["first prompt", "second one"]
        want = [R.text_of(R.generate(R.encode(x), 5)[0]) for x in prompts]
        r = cl.completions.create(model="fake-model", prompt=prompts, max_tokens=5, n=2, echo=True)
        check([(c.index, c.text) for c in r.choices] == [(k, prompts[k // 2] + want[k // 2]) for k in range(4)],
              "two prompts, n=2: four choices in order", [(c.index, c.text) for c in r.choices])
        check(r.usage.prompt_tokens == sum(len(R.encode(x)) for x in prompts) and r.usage.completion_tokens == 20,
              "two prompts: usage", r.usage)
        ids2 = [R.encode(x) for x in prompts]
        got = {}
        for ch in cl.completions.create(model="fake-model", prompt=ids2, max_tokens=5, stream=True):
            for c in ch.choices:
                got[c.index] = got.get(c.index, "") + c.text
        check(got == {0: want[0], 1: want[1]}, "two token-id prompts streamed", got)
        # truncate_prompt_tokens (vLLM's): the prompt's last tokens; -1: what leaves one position
        ids_t = R.encode("a prompt to cut")
        r = cl.completions.create(model="fake-model", prompt=ids_t, max_tokens=4, extra_body={"truncate_prompt_tokens": 3})
        check(r.choices[0].text == R.text_of(R.generate(ids_t[-3:], 4)[0]) and r.usage.prompt_tokens == 3,
              "truncate_prompt_tokens 3: the answer to the last 3 tokens", (r.choices[0].text, r.usage))
        r = cl.completions.create(model="fake-model", prompt=[66] * 3000, max_tokens=1, extra_body={"truncate_prompt_tokens": -1})
        check(r.usage.prompt_tokens == 2047, "truncate_prompt_tokens -1: the context less one", r.usage)
        for bad in (0, -2):
            try:
                cl.completions.create(model="fake-model", prompt="x", max_tokens=1, extra_body={"truncate_prompt_tokens": bad})
                check(False, "truncate_prompt_tokens %d: 400" % bad)
            except openai.BadRequestError as e:
                check("truncate_prompt_tokens" in str(e), "truncate_prompt_tokens %d: 400 naming it" % bad)
        texts, fins, ids, usage = {}, {}, set(), []
        for ch in cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=10, n=2, stream=True,
                                             stream_options={"include_usage": True}):
            ids.add(ch.id)
            if not ch.choices:
                usage.append(ch.usage)
            for c in ch.choices:
                texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
                if c.finish_reason:
                    fins[c.index] = fins.get(c.index, []) + [c.finish_reason]
        check(texts == {0: R.text_of(ctoks), 1: R.text_of(ctoks)} and fins == {0: ["length"], 1: ["length"]},
              "n=2 chat stream: both choices whole, each finished once", (texts, fins))
        check(len(ids) == 1 and len(usage) == 1 and usage[0].completion_tokens == 20, "n=2 chat stream: one id, one usage",
              (ids, usage))
        r = cl.chat.completions.create(model="fake-model", messages=msgs, max_tokens=10, n=2, stop=stop)
        check([c.message.content for c in r.choices] == [full[:full.index(stop)]] * 2
              and [c.finish_reason for c in r.choices] == ["stop"] * 2, "n=2 chat: the stop string ends each choice")
        try:
            openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="wrong", max_retries=0).models.list()
            check(False, "wrong key should fail")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "wrong key AuthenticationError")
        try:
            cl.completions.create(model="nope", prompt="x", max_tokens=2)
            check(False, "unknown model should fail")
        except openai.NotFoundError as e:
            check(e.status_code == 404, "unknown model NotFoundError")
    finally:
        rc = srv.stop()
        check(rc == 0, "clean exit")
    return summary("openai %s: " % openai.__version__)


if __name__ == "__main__":
    sys.exit(main())
