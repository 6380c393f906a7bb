#!/usr/bin/env python3
"""Capacity measurements against a running OpenAI-compatible server (stdlib only).

  serve_capacity.py long  --port P --tokens 131072 [--vocab V] [--max-tokens 8]
      one prompt of that many random token ids (seeded), streamed: time to the first token, the
      tokens after it, the total; prints one JSON line
  serve_capacity.py chat  --port P [--turns 10] [--turn-tokens 1024] [--reply-tokens 16]
      a multi-turn conversation as token ids: turn k sends the whole history (every earlier turn's
      user tokens and a reply) plus its own user tokens, streamed; the time to the first token of
      every turn; prints one JSON line (run it against a server with and without --no-prefix-cache)

Prompts are token ids (the completions API takes a list of ints), so any vocabulary takes them.
Every number is measured here, from the request's send to the first streamed token."""
import argparse
import http.client
import json
import random
import sys
import time


def stream_completion(port, prompt, max_tokens, host="127.0.0.1", timeout=3600):
    """POSTs a streamed completion; returns (ttft_s, total_s, n_chunks, finish_reason, error)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        return None, time.perf_counter() - t0, 0, None, "%d %s" % (r.status, r.read()[:300])
    ttft, n, finish = None, 0, None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: "):
                continue
            data = ev[6:]
            if data == b"[DONE]":
                break
            j = json.loads(data)
            ch = j["choices"][0]
            if ch.get("text") is not None and ttft is None:
                ttft = time.perf_counter() - t0
            n += 1
            finish = ch.get("finish_reason") or finish
    c.close()
    return ttft, time.perf_counter() - t0, n, finish, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["long", "chat"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=100000, help="token ids are drawn from [256, vocab)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--turn-tokens", type=int, default=1024)
    ap.add_argument("--reply-tokens", type=int, default=16)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    ids = lambda n: [rnd.randrange(256, a.vocab) for _ in range(n)]  # noqa: E731
    if a.mode == "long":
        ttft, total, n, finish, err = stream_completion(a.port, ids(a.tokens), a.max_tokens)
        print(json.dumps({"mode": "long", "label": a.label, "prompt_tokens": a.tokens, "ttft_s": ttft,
                          "total_s": total, "chunks": n, "finish": finish, "error": err}))
        return 0 if err is None and ttft is not None else 1
    history, turns, rc = [], [], 0
    for k in range(a.turns):
        history += ids(a.turn_tokens)
        ttft, total, n, finish, err = stream_completion(a.port, history, a.reply_tokens)
        turns.append({"turn": k + 1, "prompt_tokens": len(history), "ttft_s": ttft, "total_s": total, "error": err})
        if err is not None:
            rc = 1
            break
        history += ids(a.reply_tokens)  # the reply as the next turn's history holds it
    print(json.dumps({"mode": "chat", "label": a.label, "turns": turns}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
