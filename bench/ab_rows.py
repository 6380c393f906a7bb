#!/usr/bin/env python3
"""Two `mlaserve bench --json` files of the same model, row by row: B's mean step time over A's.
The rows are those of the 24-row table (prefill 512 / 4096; decode batch 1 at every context;
batch 8 and up at the smallest context); a row missing on either side is printed as missing.
usage: bench/ab_rows.py A.json B.json"""
import json
import sys


def rows(path):
    try:
        d = json.load(open(path))
    except (OSError, ValueError) as e:
        return None, str(e)
    out = {}
    ctxs = sorted({r["ctx"] for r in d.get("rows", []) if r["phase"] == "decode"})
    for r in d.get("rows", []):
        if r.get("tp") != 1 or r.get("ms_mean") is None:
            continue
        if r["phase"] == "prefill":
            key = "prefill %d" % r["prompt"]
        elif r["batch"] == 1:
            key = "decode b1 ctx %d" % r["ctx"]
        elif ctxs and r["ctx"] == ctxs[0]:
            key = "decode b%d ctx %d" % (r["batch"], r["ctx"])
        else:
            continue
        out[key] = r
    return out, None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, ea = rows(sys.argv[1])
    b, eb = rows(sys.argv[2])
    if a is None or b is None:
        print("| missing | %s |" % (ea or eb))
        return 1
    print("| row | A ms | B ms | B / A | B of the limit |")
    print("|---|---:|---:|---:|---:|")
    worst = 0.0
    for k in sorted(set(a) | set(b), key=lambda s: (s.split()[0], int(s.split()[1].lstrip("b")), s)):
        ra, rb = a.get(k), b.get(k)
        if not ra or not rb:
            print("| %s | %s | %s | missing | |" % (k, ra and "%.3f" % ra["ms_mean"], rb and "%.3f" % rb["ms_mean"]))
            continue
        q = rb["ms_mean"] / ra["ms_mean"]
        worst = max(worst, q)
        lim = rb.get("bw_frac") if rb["phase"] == "decode" else rb.get("flops_frac")
        print("| %s | %.3f | %.3f | %.3f | %s |" % (k, ra["ms_mean"], rb["ms_mean"], q,
                                                   "%.1f%%" % (100 * lim) if lim is not None else ""))
    print("\nslowest row of B against A: %.3f" % worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
