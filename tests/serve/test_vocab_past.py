"""A tokenizer that holds more tokens than the model has rows (some Kimi-K2 files: 163842 tokens,
163840 rows), on a copy of the tiny-deepseek3 fixture with two user-defined tokens appended:
`inspect` counts them, `serve` warns at start, and a prompt or chat message whose text tokenizes
to one is a 400 naming the id, while requests around it are answered as before (a step holding
the id would fail every request in it).
Usage: test_vocab_past.py SERVE_EXE WORKER_EXE MLASERVE FIXTURES_DIR. Exit 77 without the fixture."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import gguf_copy  # noqa: E402
from mlatest import ServeProcess, check, finish  # noqa: E402

exe, worker, mlaserve, fixtures = sys.argv[1:5]
src = os.path.join(fixtures, "tiny-deepseek3", "tiny-deepseek3-bf16.gguf")
if not os.path.exists(src):
    print("fixture missing: skipped")
    sys.exit(77)
EXTRA = ["<|past_a|>", "<|past_b|>"]


def more_tokens(name, val):
    if name == "tokenizer.ggml.tokens":
        return val + EXTRA
    if name == "tokenizer.ggml.token_type":
        return val + [4] * len(EXTRA)  # user-defined: matched in any text
    return val


with tempfile.TemporaryDirectory() as d:
    model = os.path.join(d, "past.gguf")
    gguf_copy.copy(src, model, kv=more_tokens)
    r = subprocess.run([mlaserve, "inspect", model, "--json"], capture_output=True, text=True, timeout=60)
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    tk = j.get("tokenizer", {})
    check(tk.get("n_tokens") == 2050 and tk.get("past_model_vocab") == 2, "inspect: 2 tokens past the model", tk)
    srv = ServeProcess([exe, "-m", model, "--tp", "1", "--port", "0"], ["--max-context", "256"], worker=worker,
                       timeout=120, prefix="vocab_past_")
    try:
        check("the tokenizer holds 2050 tokens, the model 2048" in srv.text(), "serve: warned at start")
        ok = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
        st, before = srv.post("/v1/completions", ok, timeout=60)
        check(st == 200, "a plain prompt is answered", before[:200])
        st, d1 = srv.post("/v1/completions", {"prompt": "Hi <|past_a|> there", "max_tokens": 3}, timeout=60)
        check(st == 400 and b"token id 2048" in d1 and b"prompt" in d1, "a prompt with a token past the model: 400",
              d1[:300])
        st, d2 = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x <|past_b|>"}],
                                                   "max_tokens": 3}, timeout=60)
        check(st == 400 and b"token id 2049" in d2 and b"messages" in d2, "a chat message with one: 400", d2[:300])
        st, after = srv.post("/v1/completions", ok, timeout=60)
        check(st == 200 and json.loads(after)["choices"][0]["text"] == json.loads(before)["choices"][0]["text"],
              "the server answers as before", after[:200])
    finally:
        srv.stop()
finish()
