#!/usr/bin/env python3
"""Two logits files of the same prompt (float32 [rows][vocab], as `mlaserve logits` and mla-e2e
write them) side by side: the largest |difference|, the relative L2 distance, the logits' spread,
and the share of rows whose argmax agrees. Optional bounds make it a check (exit 1 past them).
Usage: compare_logits.py A.f32 B.f32 --rows N [--label TEXT] [--max-rel-l2 X] [--min-argmax Y]"""
import argparse
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rows", type=int, required=True, help="positions in each file")
    ap.add_argument("--label", default="")
    ap.add_argument("--max-rel-l2", type=float)
    ap.add_argument("--min-argmax", type=float)
    o = ap.parse_args()
    x, y = np.fromfile(o.a, dtype=np.float32), np.fromfile(o.b, dtype=np.float32)
    if x.size != y.size or x.size == 0 or x.size % o.rows:
        sys.exit(f"compare_logits: {o.a} holds {x.size} floats, {o.b} {y.size}: not {o.rows} rows of one vocabulary")
    x, y = x.reshape(o.rows, -1), y.reshape(o.rows, -1)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        print(f"{o.label}: not finite")
        sys.exit(1)
    rel = float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))
    agree = float((x.argmax(1) == y.argmax(1)).mean())
    print(f"{o.label}: {o.rows} rows x {x.shape[1]}, max |d| {np.abs(x - y).max():.4g}, rel L2 {rel:.3g}, "
          f"logit std {y.std():.3g}, argmax agree {agree:.4f}")
    bad = (o.max_rel_l2 is not None and rel > o.max_rel_l2) or (o.min_argmax is not None and agree < o.min_argmax)
    sys.exit(1 if bad else 0)


main()
