"""A long prompt beside short chats: one streamed completion of LONG prompt tokens (16 out), then
SHORT streamed chats of 200 prompt tokens (64 out each) sent 0.3 s later, 20 ms apart, while the
long one is still being prefilled. Prints one JSON line: each chat's time to its first token (ms,
sorted, and the median), the long prompt's, and the HTTP statuses. Token-id prompts from a seeded
generator, so any tokenizer takes them; greedy.
Usage: long_mix.py PORT LONG SHORT [VOCAB]   (an mlaserve or any OpenAI-compatible /v1/completions
on 127.0.0.1:PORT; token ids drawn below VOCAB, default 30000). Exits 1 when a request failed.
scripts/gpu_long_mix.sh runs it against --long-prefill-tokens 0 and the default."""
import http.client
import json
import random
import sys
import threading
import time


def stream(port, prompt, max_tokens, out, key, t_send):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                                                      "temperature": 0}), {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: {") and first is None:
            first = time.monotonic()
    out[key] = ((first - t_send) * 1e3 if first else None, r.status, (time.monotonic() - t_send) * 1e3)
    c.close()


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: long_mix.py PORT LONG SHORT [VOCAB]")
    port, n_long, n_short = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    vocab = int(sys.argv[4]) if len(sys.argv) == 5 else 30000
    rnd = random.Random(7)
    res = {}
    t0 = time.monotonic()
    lt = threading.Thread(target=stream, args=(port, [rnd.randrange(vocab // 30, vocab) for _ in range(n_long)], 16, res,
                                               "long", t0))
    lt.start()
    time.sleep(0.3)
    ths = []
    for i in range(n_short):
        p = [rnd.randrange(vocab // 30, vocab) for _ in range(200)]
        t = threading.Thread(target=stream, args=(port, p, 64, res, "chat%d" % i, time.monotonic()))
        t.start()
        ths.append(t)
        time.sleep(0.02)
    for t in ths + [lt]:
        t.join(300)
    chats = sorted(v[0] for k, v in res.items() if k.startswith("chat") and v[0] is not None)
    statuses = sorted(set(v[1] for v in res.values()))
    print(json.dumps({"long_ttft_ms": res.get("long", (None,))[0], "chat_ttft_ms": [round(x, 1) for x in chats],
                      "chat_ttft_p50_ms": chats[len(chats) // 2] if chats else None, "statuses": statuses}))
    sys.exit(0 if statuses == [200] and len(res) == n_short + 1 else 1)


if __name__ == "__main__":
    main()
