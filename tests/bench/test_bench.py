#!/usr/bin/env python3
"""`mlaserve bench` end to end on the bundled tiny model (CPU workers). No timing is asserted: the
numbers only have to exist, be positive and finite, and be where the options say.

- --tp 1,2 --prefill 16 --batch 1,4 --ctx 32 --steps 3 (+ --bw-gbs, --tflops, --json, --md): exit 0;
  the JSON has exactly the expected rows (tp x {prefill 16, decode 1 and 4 at ctx 32}) with positive
  finite times and throughputs; scaling efficiency on every row (TP 1 ran); the all-reduce cost on the
  TP 2 decode rows and not on the TP 1 ones; the roofline fraction on decode rows, the compute fraction
  on prefill rows; the markdown on stdout and in --md has the header lines and one row per point.
- the fill goes through the cache pool (--kv-memory): a pool of exactly the blocks the decode point
  needs runs, one block less fails naming both counts, a pool without a block fails at load.
- bad arguments fail with a message and a nonzero status: an unknown option, --tp 3 (does not divide
  the 4 heads), --batch 0, a bad list, a missing model.
usage: test_bench.py MLASERVE MODEL WORKDIR
"""
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from mlatest import check, finish  # noqa: E402


def run(cmd, env=None, timeout=180):
    e = dict(os.environ)
    e.update(env or {})
    if cmd[1:2] == ["bench"]:  # a generous heartbeat timeout: sanitizer builds on 2 busy cores
        cmd = cmd[:2] + ["--heartbeat-timeout-ms", "10000"] + cmd[2:]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)


def pos_finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def main():
    exe, model, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    js, md = os.path.join(work, "bench.json"), os.path.join(work, "bench.md")
    for p in (js, md):
        if os.path.exists(p):
            os.remove(p)

    # ---- the main run
    r = run([exe, "bench", "-m", model, "--tp", "1,2", "--prefill", "16", "--batch", "1,4", "--ctx", "32",
             "--steps", "3", "--repeat", "2", "--coll-iters", "5", "--bw-gbs", "20", "--tflops", "0.5",
             "--json", js, "--md", md])
    if not check(r.returncode == 0, "bench --tp 1,2 exits 0", r.stderr[-3000:]):
        finish("bench: ")
    d = json.load(open(js))
    check(d.get("error") is None, "no error in the JSON", d.get("error"))
    check(d["model"] == model and d["family"] == "deepseek2" and d["backend"] == "cpu" and d["tp"] == [1, 2],
          "JSON header: model, family, backend, tp", {k: d.get(k) for k in ("model", "family", "backend", "tp")})
    check(d["shapes"]["n_layer"] == 4 and d["shapes"]["n_embd"] == 256 and d["shapes"]["n_head"] == 4,
          "JSON shapes", d["shapes"])
    check(bool(d.get("date")) and bool(d.get("host")), "JSON date and host")
    rows = d["rows"]
    keys = sorted((x["tp"], x["phase"], x["batch"], x["prompt"] or 0, x["ctx"] or 0) for x in rows)
    want = sorted([(tp, "prefill", 1, 16, 0) for tp in (1, 2)] +
                  [(tp, "decode", b, 0, 32) for tp in (1, 2) for b in (1, 4)])
    check(keys == want, "one row per (tp, phase, size)", keys)
    for x in rows:
        tag = "tp %d %s batch %d" % (x["tp"], x["phase"], x["batch"])
        for k in ("ms_best", "ms_mean", "tok_s", "scaling"):
            check(pos_finite(x[k]), "%s: %s positive and finite" % (tag, k), x[k])
        check(x["ms_best"] <= x["ms_mean"] * (1 + 1e-9), tag + ": best <= mean", (x["ms_best"], x["ms_mean"]))
        if x["tp"] == 1:
            check(abs(x["scaling"] - 1) < 1e-9, tag + ": scaling 1 at TP 1", x["scaling"])
        if x["phase"] == "prefill":
            check(x["runs"] == 2, tag + ": 2 repeats", x["runs"])
            check(abs(x["tok_s"] - 16 / (x["ms_best"] / 1e3)) < 1e-6 * x["tok_s"], tag + ": tok/s = 16 / best")
            check(pos_finite(x["tflops"]) and pos_finite(x["flops_frac"]), tag + ": compute fraction",
                  (x["tflops"], x["flops_frac"]))
            check(x["allreduce_ms_per_step"] is None and x["bw_frac"] is None, tag + ": no decode-only columns")
        else:
            b = x["batch"]
            check(x["runs"] == 3, tag + ": 3 timed steps", x["runs"])
            check(pos_finite(x["tok_s_per_seq"]) and abs(x["tok_s"] - b * x["tok_s_per_seq"]) < 1e-6 * x["tok_s"],
                  tag + ": tok/s = batch x tok/s per sequence", (x["tok_s"], x["tok_s_per_seq"]))
            check(abs(x["tok_s"] - b * 1e3 / x["ms_mean"]) < 1e-6 * x["tok_s"], tag + ": tok/s = batch / mean step")
            for k in ("mb_per_step_rank", "gb_s", "bw_frac"):
                check(pos_finite(x[k]), "%s: %s positive and finite" % (tag, k), x[k])
            check(x["flops_frac"] is None, tag + ": no compute fraction")
            if x["tp"] == 2:
                for k in ("allreduce_us_per_op", "allreduce_ms_per_step", "allreduce_frac"):
                    check(pos_finite(x[k]), "%s: %s positive and finite" % (tag, k), x[k])
                check(abs(x["allreduce_ms_per_step"] - 2 * 4 * x["allreduce_us_per_op"] / 1e3) <
                      1e-6 * x["allreduce_ms_per_step"], tag + ": all-reduce per step = 2 x 4 layers x one")
            else:
                check(x["allreduce_ms_per_step"] is None, tag + ": no all-reduce at TP 1", x["allreduce_ms_per_step"])
    # bytes per step: more with a bigger batch (more experts touched, more KV); less per rank at TP 2
    mb = {(x["tp"], x["batch"]): x["mb_per_step_rank"] for x in rows if x["phase"] == "decode"}
    check(mb[(1, 4)] > mb[(1, 1)] and mb[(2, 1)] < mb[(1, 1)], "bytes per step grow with the batch, shrink with TP",
          mb)
    # the markdown: stdout and --md
    text = open(md).read()
    check(text == r.stdout, "--md holds what stdout printed")
    for h in ("- model: " + model, "- family: deepseek2", "- backend: cpu", "- tp: 1,2", "- date: ", "- host: "):
        check(h in text, "markdown header line %r" % h)
    table = [l for l in text.splitlines() if l.startswith("| ") and not l.startswith("| tp ")]
    check(len(table) == 6, "markdown: 6 rows", table)
    check(all(l.count("|") == 18 for l in table), "markdown: 17 columns per row")

    # ---- the fill goes through the pool: 2 sequences of 32 + 2 warm-up + 3 steps (+1) positions take 2 x 3
    # blocks of 16; a block of the tiny model is 4 layers x 16 x 288 floats = 72 KiB. Six blocks run, five
    # fail naming what was needed and what the pool holds.
    base = [exe, "bench", "-m", model, "--tp", "1", "--prefill", "none", "--batch", "2", "--ctx", "32", "--steps",
            "3", "--warmup", "2"]
    r = run(base + ["--kv-memory", "432K"])
    check(r.returncode == 0, "2 x 38 positions in a pool of 6 blocks", r.stderr[-2000:])
    r = run(base + ["--kv-memory", "360K"])
    check(r.returncode != 0 and "filling 2 sequences to 32 positions" in r.stderr and
          "need 6 cache blocks of 16 positions; the pool holds 5" in r.stderr, "one block less fails, naming it",
          r.stderr[-2000:])
    r = run(base + ["--kv-memory", "1K"])
    check(r.returncode != 0 and "holds no cache block" in r.stderr, "a pool without a block fails at load",
          r.stderr[-2000:])

    # ---- MLA_STEP_TRACE: every process of a TP 2 run marks each decode step; scripts/steptrace.py
    # finds all 8 marks of each of the 5 steps (2 warm-up + 3 timed), in causal order
    tdir = os.path.join(work, "trace")
    os.makedirs(tdir, exist_ok=True)
    for p in os.listdir(tdir):
        os.remove(os.path.join(tdir, p))
    r = run([exe, "bench", "-m", model, "--tp", "2", "--prefill", "none", "--batch", "1", "--ctx", "8", "--steps", "3",
             "--coll-iters", "1"], env={"MLA_STEP_TRACE": tdir})
    check(r.returncode == 0, "bench with MLA_STEP_TRACE exits 0", r.stderr[-2000:])
    files = sorted(os.listdir(tdir))
    check(len(files) == 3 and all(f.startswith("steptrace-") for f in files),
          "one trace file for the coordinator and each of 2 workers", files)
    st = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "steptrace.py")
    r = subprocess.run([sys.executable, st, tdir], capture_output=True, text=True, timeout=60)
    legs = [l for l in r.stdout.splitlines() if l.startswith("| ") and "->" in l]
    check(r.returncode == 0 and r.stdout.startswith("5 steps with every mark"), "steptrace.py: 5 complete steps",
          r.stdout + r.stderr)
    check(len(legs) == 9 and all(float(l.split("|")[2]) >= 0 for l in legs), "steptrace.py: 9 legs, none negative",
          legs)
    # --top 2: the two longest steps, longest first, each leg of a row within its A->H
    r = subprocess.run([sys.executable, st, tdir, "--top", "2"], capture_output=True, text=True, timeout=60)
    rows = [l.split("|")[1:-1] for l in r.stdout.split("longest steps")[-1].splitlines() if l[2:3].isdigit()]
    rows = [[float(x) if x.strip() != "-" else None for x in row] for row in rows]
    check(r.returncode == 0 and len(rows) == 2 and rows[0][1] >= rows[1][1] and
          all(sum(row[2:9]) <= row[1] + 0.2 for row in rows), "steptrace.py --top 2: two steps, longest first",
          r.stdout + r.stderr)

    # ---- bad arguments
    bad = [
        (["--tp", "1", "--frobnicate"], "unknown option '--frobnicate'"),
        (["--tp", "3"], "does not divide the 4 attention heads"),
        (["--tp", "1,3"], "--tp 3"),
        (["--batch", "0"], "--batch: '0' is not an integer"),
        (["--batch", "1,,2"], "--batch: '1,,2' is not a comma-separated list"),
        (["--ctx", "x"], "--ctx: 'x'"),
        (["--steps", "0"], "--steps: '0'"),
        (["--bw-gbs", "-1"], "--bw-gbs: '-1' is not a positive number"),
        (["--env", "NOEQUALS"], "--env: 'NOEQUALS' is not NAME=VALUE"),
        (["--prefill", "none", "--batch", "none"], "nothing to measure"),
        # output paths that cannot be written: refused before the run, not after it
        (["--prefill", "8", "--batch", "none", "--json", os.path.join(work, "no-dir", "x.json")],
         "no-dir/x.json: cannot create a file beside it: No such file or directory"),
        (["--prefill", "8", "--batch", "none", "--md", work], work + ": Is a directory"),
    ]
    for args, needle in bad:
        r = run([exe, "bench", "-m", model] + args)
        check(r.returncode != 0 and needle in r.stderr and "Traceback" not in r.stderr,
              "bench %s fails with %r" % (" ".join(args), needle), (r.returncode, r.stderr[-800:]))
    missing = os.path.join(work, "no-such-model.gguf")
    r = run([exe, "bench", "-m", missing])
    check(r.returncode != 0 and missing in r.stderr and "No such file" in r.stderr, "a missing model is named",
          r.stderr[-800:])
    # a run that fails before its tables leaves an output that was there as it was, and nothing beside it
    keep = os.path.join(work, "keep.json")
    with open(keep, "w") as f:
        f.write("earlier\n")
    r = run([exe, "bench", "-m", missing, "--json", keep, "--md", keep + ".md"])
    left = sorted(x for x in os.listdir(work) if x.startswith("keep"))
    check(r.returncode != 0 and open(keep).read() == "earlier\n" and left == ["keep.json"],
          "a failed run: its outputs untouched, no partial file", (r.returncode, left))
    r = run([exe, "bench", "--tp", "1"])
    check(r.returncode == 2 and "no model" in r.stderr, "no -m: usage", r.stderr[-800:])
    # points past the model's context (4096 positions) are refused before any worker starts
    for args, says in ((["--prefill", "4096", "--batch", "none"], "--prefill 4096 and its first token pass the model's "
                        "context length 4096"),
                       (["--prefill", "none", "--ctx", "4090", "--warmup", "2", "--steps", "4"],
                        "--ctx 4090 + 2 warm-up + 4 steps pass the model's context length 4096")):
        r = run([exe, "bench", "-m", model, "--backend", "cpu"] + args)
        check(r.returncode == 2 and says in r.stderr and "worker" not in r.stderr, "refused: %s" % says, r.stderr[-400:])
    finish("bench: ")


if __name__ == "__main__":
    main()
