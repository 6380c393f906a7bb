"""Independent Python model of tests/serve/fake_backend.c and the fake tokenizer of
tests/serve/fake_server_main.c: what the server must answer."""
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import mlatest  # noqa: E402

ALPHA = "abcdefghijklmnopqrstuvwxyz "
EOS, BOS = 256, 257
M64 = (1 << 64) - 1


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fake_next(seq, eos_period=0, n_top=0):
    h = 1469598103934665603
    for t in seq:
        for b in struct.pack("<I", t & 0xFFFFFFFF):
            h ^= b
            h = (h * 1099511628211) & M64
    tok = EOS if (eos_period and h % eos_period == 0) else ord(ALPHA[h % 27])
    lp = f32(f32(-float((h >> 8) % 1000)) / f32(1000.0))
    lp = f32(lp - f32(0.001))
    tops = []
    for i in range(n_top):
        tid = tok if i == 0 else ord(ALPHA[(h + i) % 27])
        tops.append((tid, f32(lp - f32(0.5 * i))))
    return tok, lp, tops


def encode(text, add_special=True):
    b = text.encode()
    ids = [BOS] if add_special else []
    i = 0
    while i < len(b):
        if b[i:i + 7] == b"<|eos|>":
            ids.append(EOS); i += 7
        elif b[i:i + 7] == b"<|bos|>":
            ids.append(BOS); i += 7
        else:
            ids.append(b[i]); i += 1
    return ids


def chat_prompt(messages, add_gen=True):
    s = "<|bos|>"
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            c = "".join(p["text"] for p in c)
        s += "<|%s|>%s\n" % (m["role"], c or "")
    if add_gen:
        s += "<|assistant|>"
    return encode(s, add_special=False)


def generate(prompt_ids, max_tokens, eos_period=0, n_top=0, stop_ids=(), max_context=2048):
    """Returns (tokens, logprobs, tops, finish) of greedy generation, stop token included."""
    seq = list(prompt_ids)
    toks, lps, tops = [], [], []
    while True:
        t, lp, tp = fake_next(seq, eos_period, n_top)
        seq.append(t)
        toks.append(t); lps.append(lp); tops.append(tp)
        if t == EOS or t in stop_ids:
            return toks, lps, tops, "stop"
        if len(toks) >= max_tokens or len(seq) >= max_context:
            return toks, lps, tops, "length"


def text_of(toks):
    return bytes(t for t in toks if t < 256).decode("utf-8", "replace")


class Server(mlatest.ServeProcess):
    """Starts the fake server on a free port (it binds port 0 and writes the port to a file)."""

    def __init__(self, exe, *args, env=None):
        super().__init__([exe], args, env=env, timeout=20, poll=0.02, prefix="fake_server_", fail_tail=None)

    def logtext(self):
        return self.text()

    def stop(self):
        """SIGTERM, and the exit status (0 expected: a clean shutdown); -999 when it had to be killed."""
        return super().stop(timeout=20, killed_rc=-999)
