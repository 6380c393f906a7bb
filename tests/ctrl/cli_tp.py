#!/usr/bin/env python3
"""`mlaserve logits --processes --tp N` and `mlaserve generate --tp N` through worker processes.

- logits --processes --tp 2 / --tp 4 (prompt in one pass, and --decode-from 3) equal the single-process
  `mlaserve logits` within relative L2 1e-5, and the greedy continuations are identical;
- the greedy continuations equal the HF reference (ref.json `greedy`) for the plain-text prompts;
- `mlaserve generate --tp 2` prints the HF greedy text for "1 2 3 4 5 6 7 8 9 10".
usage: cli_tp.py MLASERVE FIXTURES_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd):
    # a generous heartbeat timeout: sanitizer builds on 2 busy cores
    cmd = cmd[:2] + ["--heartbeat-timeout-ms", "5000"] + cmd[2:]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"FAILED ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def main():
    exe, fixtures = sys.argv[1], sys.argv[2]
    fx = os.path.join(fixtures, "tiny-deepseek3")
    model = os.path.join(fx, "tiny-deepseek3-bf16.gguf")
    ref = json.load(open(os.path.join(fx, "ref.json")))
    prompts = [p for p in ref["prompts"] if "<" not in p["text"]][:4]
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        toks = os.path.join(d, "t.txt")
        with open(toks, "w") as f:
            for p in prompts:
                f.write(" ".join(map(str, p["tokens"])) + "\n")
        n = 12

        def logits(extra, tag):
            out, ids = os.path.join(d, tag + ".f32"), os.path.join(d, tag + ".ids")
            run([exe, "logits", "-m", model, "--tokens", toks, "--out", out, "--greedy", str(n),
                 "--ids-out", ids] + extra)
            return (np.fromfile(out, dtype=np.float32),
                    [list(map(int, l.split())) for l in open(ids).read().splitlines()])

        base, base_ids = logits([], "single")
        for extra in (["--processes", "--tp", "2"], ["--processes", "--tp", "4"],
                      ["--processes", "--tp", "2", "--decode-from", "3"]):
            got, ids = logits(extra, "tp")
            rel = float(np.linalg.norm(got - base) / np.linalg.norm(base)) if got.shape == base.shape else 1.0
            print(f"{' '.join(extra)}: relative L2 vs single process {rel:.3g}")
            if rel >= 1e-5:
                print("  FAIL: logits differ"); fails += 1
            if ids != base_ids:
                print("  FAIL: greedy ids differ", ids, base_ids); fails += 1
        for p, ids in zip(prompts, base_ids):
            want = p["greedy"][:len(ids)]
            if ids != want:
                print(f"  FAIL: greedy of {p['text']!r}: {ids} vs HF {want}"); fails += 1
        text = run([exe, "generate", "-m", model, "-p", prompts[0]["text"], "-n", "12", "--tp", "2"])
        want = ref["prompts"][0]["greedy_text"]
        print(f"generate --tp 2: {text.strip()!r}")
        if not want.startswith(text.rstrip("\n")) and not text.rstrip("\n").startswith(want):
            print(f"  FAIL: generate printed {text!r}, HF greedy {want!r}"); fails += 1
        # 0 is open in --repeat-penalty and --top-p (it would read as off): refused before any work
        for opt, hi in (("--repeat-penalty", 100), ("--top-p", 1)):
            r = subprocess.run([exe, "generate", "-m", model, "-p", "hi", opt, "0"], capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 2 or f"{opt}: '0' is not a number in (0, {hi}]" not in r.stderr:
                print(f"  FAIL: generate {opt} 0: exit {r.returncode}, {r.stderr[-200:]!r}"); fails += 1
    print("ok" if not fails else f"{fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
