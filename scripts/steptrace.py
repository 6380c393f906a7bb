#!/usr/bin/env python3
"""Where a step's time goes between the client and the engine: reads the files that
MLA_STEP_TRACE=DIR makes every process write (common/steptrace.h) and prints, per leg, the
median and 90th percentile over the steps that have every mark.

usage: scripts/steptrace.py DIR [--skip N] [--top K]
  --skip N: leave out the first N complete steps
  --top K: also list the K longest steps (A->H) leg by leg: a prompt's step among decode steps"""
import glob
import os
import statistics
import sys

LEGS = [
    ("A", "B", "coordinator: caller -> I/O thread"),
    ("B", "C", "wire: coordinator -> worker I/O thread (+ encode, decode)"),
    ("C", "D", "worker: I/O thread -> compute thread"),
    ("D", "E", "worker: the step (engine, sampling, encoding)"),
    ("E", "F", "worker: compute thread -> I/O thread"),
    ("F", "G", "wire: worker -> coordinator I/O thread (+ decode)"),
    ("G", "H", "coordinator: I/O thread -> caller"),
    ("H", "A+", "caller: result -> next plan"),
]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    skip = int(sys.argv[sys.argv.index("--skip") + 1]) if "--skip" in sys.argv else 0
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 0
    marks = {}
    for p in glob.glob(os.path.join(d, "steptrace-*.txt")):
        with open(p) as f:
            for line in f:
                s, m, ns = line.split()
                # a mark seen on several ranks: the earliest. Each process marks its own legs in
                # order, so every leg between earliest marks is >= 0 whatever the file order;
                # with the step ahead a rank can take a plan up after another rank has answered
                # it, and another choice (the first file read) gave negative legs. A leg may so
                # join two ranks' marks: it shows the first rank through, not the slowest
                st = marks.setdefault(int(s), {})
                st[m] = min(st.get(m, int(ns)), int(ns))
    steps = sorted(s for s, m in marks.items() if all(k in m for k in "ABCDEFGH"))
    steps = steps[skip:]
    if not steps:
        print("no step has every mark (A..H): was MLA_STEP_TRACE set for the coordinator and the workers?")
        return 1
    print(f"{len(steps)} steps with every mark ({d})")
    print(f"| leg | median us | p90 us |\n|---|---:|---:|")
    total = []
    for a, b, what in LEGS:
        v = []
        for s in steps:
            if b == "A+":
                nxt = marks.get(s + 1, {})
                if "A" in nxt:
                    v.append((nxt["A"] - marks[s]["H"]) / 1e3)
            else:
                v.append((marks[s][b] - marks[s][a]) / 1e3)
        if not v:
            continue
        v.sort()
        print(f"| {a}->{b} {what} | {statistics.median(v):.1f} | {v[int(0.9 * (len(v) - 1))]:.1f} |")
    for s in steps:
        total.append((marks[s]["H"] - marks[s]["A"]) / 1e3)
    eng = sorted((marks[s]["E"] - marks[s]["D"]) / 1e3 for s in steps)
    print(f"| A->H the step as the caller sees it | {statistics.median(total):.1f} | "
          f"{sorted(total)[int(0.9 * (len(total) - 1))]:.1f} |")
    print(f"serving path (A->H minus D->E), median: {statistics.median(total) - statistics.median(eng):.1f} us")
    if top > 0:
        legs = [(a, b) for a, b, _ in LEGS if b != "A+"]
        print(f"\nthe {top} longest steps, us a leg:")
        print("| step | A->H | " + " | ".join(f"{a}->{b}" for a, b in legs) + " | H->next A |")
        print("|---:|---:|" + "---:|" * (len(legs) + 1))
        for s in sorted(steps, key=lambda s: marks[s]["H"] - marks[s]["A"], reverse=True)[:top]:
            m = marks[s]
            nxt = marks.get(s + 1, {})
            after = f"{(nxt['A'] - m['H']) / 1e3:.1f}" if "A" in nxt else "-"
            print(f"| {s} | {(m['H'] - m['A']) / 1e3:.1f} | " +
                  " | ".join(f"{(m[b] - m[a]) / 1e3:.1f}" for a, b in legs) + f" | {after} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
