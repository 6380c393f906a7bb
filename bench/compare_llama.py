#!/usr/bin/env python3
"""Ours against llama.cpp, row by row, from the files one scripts/gpu_bench.sh call leaves:
`mlaserve bench --json` and the llama-bench / llama-batched-bench outputs of
scripts/llama_side_by_side.sh. Prints a markdown table: the row, our tok/s, theirs, the ratio, and
our fraction of the limit (decode: the HBM roofline; prefill: the tensor-core rate).

usage: bench/compare_llama.py BENCH.json LLAMA_DIR LLAMA_BATCHED_DIR
  LLAMA_DIR: llama-bench-pp{512,4096}-fa{0,1}.json, llama-bench-tg32-d{1024,16384}-fa{0,1}.json
  LLAMA_BATCHED_DIR: batched-ctx1024-fa{0,1}.jsonl (speed_tg per parallel sequence count)
Where a row was run both with FlashAttention (fa1) and without (fa0), llama.cpp's faster figure
is the one compared (on the H200 its FA build decoded faster at every row and prefilled slower
at four of six)."""
import glob
import json
import os
import sys


def llama_bench(pattern):
    """the best avg_ts of the llama-bench outputs matching pattern (fa0 / fa1), or None"""
    best = None
    for path in glob.glob(pattern):
        try:
            v = json.load(open(path))[0]["avg_ts"]
        except (OSError, ValueError, IndexError, KeyError):
            continue
        best = v if best is None else max(best, v)
    return best


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    ours = json.load(open(sys.argv[1]))["rows"]
    ld, bd = sys.argv[2], sys.argv[3]
    batched = {}
    for p in glob.glob(os.path.join(bd, "batched-ctx*-fa*.jsonl")):
        for line in open(p):
            try:
                j = json.loads(line)
                batched[int(j["pl"])] = max(batched.get(int(j["pl"]), 0.0), j["speed_tg"])
            except (ValueError, KeyError):
                pass

    def row(phase, batch, prompt=None, ctx=None):
        for r in ours:
            if r["tp"] == 1 and r["phase"] == phase and r["batch"] == batch and \
                    (prompt is None or r["prompt"] == prompt) and (ctx is None or r["ctx"] == ctx):
                return r
        return None

    lines = []
    for p in (512, 4096):
        r = row("prefill", 1, prompt=p)
        lines.append((f"prefill {p}", r and r["tok_s"], llama_bench(os.path.join(ld, f"llama-bench-pp{p}-fa[01].json")),
                      r and r.get("flops_frac")))
    for c in (1024, 16384):
        r = row("decode", 1, ctx=c)
        lines.append((f"decode b1, ctx {c}", r and r["tok_s"],
                      llama_bench(os.path.join(ld, f"llama-bench-tg32-d{c}-fa[01].json")), r and r.get("bw_frac")))
    for b in (8, 32, 128, 256):
        r = row("decode", b, ctx=1024)
        lines.append((f"decode b{b}, ctx 1024", r and r["tok_s"], batched.get(b), r and r.get("bw_frac")))
    print("| row | ours tok/s | llama.cpp tok/s | ours / llama.cpp | ours of its limit |")
    print("|---|---:|---:|---:|---:|")
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for name, o, t, frac in lines:
        ratio = o / t if o and t else None
        print(f"| {name} | {num(o, '.1f')} | {num(t, '.1f')} | {num(ratio, '.2f')} | "
              f"{num(frac * 100 if frac is not None else None, '.1f')}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
