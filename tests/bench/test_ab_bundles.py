#!/usr/bin/env python3
"""scripts/gpu_ab_bundles.sh, dry run without a GPU: three release trees (bin/ holding this build's
mlaserve) given as TREES, a 2-layer V2-Lite-shaped model on the CPU backend, two rounds. Checked:
exit status 0; each round runs every tree, the second in reverse order; each round's table
compares B and C with A, with the decode rows of both sides; a TREES of one tree is refused by
name. Then SAME_BITS=1 with C's mlaserve a wrapper that changes one byte of the logits it writes:
B has A's bits, C differs, the script fails. No timing is asserted.
usage: test_ab_bundles.py MLASERVE WORKDIR"""
import os
import re
import shutil
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(here, "..", ".."))
sys.path.insert(0, os.path.join(here, "..", "lib"))
from mlatest import check, finish  # noqa: E402

exe, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
trees = []
for name in ("t0", "t1", "t2"):
    b = os.path.join(work, name, "bin")
    os.makedirs(b)
    os.symlink(exe, os.path.join(b, "mlaserve"))
    trees.append(os.path.join(work, name))
script = os.path.join(root, "scripts", "gpu_ab_bundles.sh")
env = dict(os.environ, TREES=" ".join(trees), BACKEND="cpu", MKMODEL_ARGS="--small --hidden 256", FAMILIES="v2lite:2",
           ROUNDS="2", OUT=os.path.join(work, "out"), BENCH_DIR=os.path.join(work, "models"), RUN_S="240",
           BENCH_ARGS="--prefill none --batch 1,2 --ctx 16 --steps 2 --heartbeat-timeout-ms 10000")
r = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=900)
check(r.returncode == 0, "runs (exit %d): %s %s" % (r.returncode, r.stdout[-600:], r.stderr[-600:]))
order = re.findall(r"v2lite-2l ([A-Z]) round (\d) done", r.stdout)
check(order == [("A", "1"), ("B", "1"), ("C", "1"), ("C", "2"), ("B", "2"), ("A", "2")],
      "every tree a round, the second round reversed: %r" % order)
md = os.path.join(work, "out", "ab-v2lite-2l.md")
text = open(md).read() if os.path.exists(md) else ""
heads = re.findall(r"v2lite-2l, round (\d), ([A-Z]) against A:", text)
check(heads == [("1", "B"), ("1", "C"), ("2", "B"), ("2", "C")], "a table a tree after A, a round: %r" % heads)
rows = re.findall(r"^\| decode b([12]) ctx 16 \| ([0-9.]+) \| ([0-9.]+) \|", text, re.M)
check(len(rows) == 8 and all(float(a) > 0 and float(b) > 0 for _, a, b in rows),
      "each table has both decode rows, timed on both sides (%d rows)" % len(rows))
r = subprocess.run(["bash", script], env=dict(env, TREES=trees[0]), capture_output=True, text=True, timeout=60)
check(r.returncode != 0 and "2 to 8 trees, not 1" in r.stdout, "one tree refused: %r" % r.stdout[-300:])
# SAME_BITS: C's logits one byte off
wrap = os.path.join(work, "t2", "bin", "mlaserve")
os.remove(wrap)
with open(wrap, "w") as f:
    f.write('#!/bin/sh\n"%s" "$@" || exit $?\nout=""; prev=""\nfor a in "$@"; do [ "$prev" = --out ] && out="$a"; '
            'prev="$a"; done\n[ -n "$out" ] && printf "\\001" | dd of="$out" bs=1 seek=5 conv=notrunc 2>/dev/null\n'
            'exit 0\n' % exe)
os.chmod(wrap, 0o755)
r = subprocess.run(["bash", script], env=dict(env, SAME_BITS="1", ROUNDS="1"), capture_output=True, text=True,
                   timeout=900)
text = open(md).read() if os.path.exists(md) else ""
check(r.returncode != 0 and re.search(r"v2lite-2l: B gives A's bits \(\d+ bytes of logits, the same greedy ids\)",
                                      text) and "v2lite-2l: C DIFFERS from A: logits byte 6" in text,
      "SAME_BITS: B the same, C differs, the run fails: %r %r" % (text[:400], r.stdout[-400:]))
finish()
