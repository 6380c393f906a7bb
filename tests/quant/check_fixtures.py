#!/usr/bin/env python3
"""kernels/quant against gguf-py on every tensor of every fixture GGUF file.

The tensor bytes are read with gguf-py's GGUFReader (not our C GGUF reader), dequantized by
gguf.quants.dequantize and by our C code (quant_tool dequant, all tensors of one type in one
call), and must agree bit-exactly or within 1 ulp. Then quant_dot_row on the first rows of every
tensor against a float64 dot of gguf-py's rows, within 1e-5 * sum|a_i x_i|.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf import quants


def ordered(a):
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def run_tool(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.fixtures, "*", "*.gguf")))
    if not files:
        print(f"FAIL: no .gguf files under {args.fixtures}")
        return 1
    rng = np.random.default_rng(7)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            reader = GGUFReader(path)
            by_type = {}
            for t in reader.tensors:
                by_type.setdefault(t.tensor_type, []).append(t)
            for qtype, tensors in sorted(by_type.items()):
                name = qtype.name
                bs, ts = GGML_QUANT_SIZES[qtype]
                raws = [np.ascontiguousarray(t.data).view(np.uint8).reshape(-1) for t in tensors]
                refs = [np.asarray(quants.dequantize(r, qtype), dtype=np.float32).reshape(-1) for r in raws]
                for t, r, f in zip(tensors, raws, refs):
                    assert f.size == int(np.prod(t.shape)), (t.name, f.size, t.shape)
                raw, ref = np.concatenate(raws), np.concatenate(refs)
                ip, op = os.path.join(tmp, "t.in"), os.path.join(tmp, "t.out")
                raw.tofile(ip)
                try:
                    run_tool(args.tool, "dequant", name, ip, op)
                    got = np.fromfile(op, dtype=np.float32)
                except RuntimeError as e:
                    print(f"FAIL {os.path.basename(path)} {name}: {e}")
                    fails += 1
                    continue
                tag = f"{os.path.basename(path)} {name} ({len(tensors)} tensors, {ref.size} elements)"
                if got.shape != ref.shape:
                    print(f"FAIL {tag}: got {got.size} values")
                    fails += 1
                    continue
                ulps = np.abs(ordered(got) - ordered(ref))
                bad = (np.isnan(got) != np.isnan(ref)) | (~np.isnan(ref) & (ulps > 1))
                if bad.any():
                    i = int(np.argmax(bad))
                    print(f"FAIL {tag}: {int(bad.sum())} elements > 1 ulp off; first at {i}: "
                          f"got {got[i]!r} expected {ref[i]!r}")
                    fails += 1
                    continue
                # dot products: up to 4 rows of each tensor (rows are ne0 = shape[0] long)
                dot_fail = 0
                for t, r, f in zip(tensors, raws, refs):
                    n = int(t.shape[0])
                    nrows = min(4, f.size // n)
                    a = f[:nrows * n].reshape(nrows, n).astype(np.float64)
                    x = rng.standard_normal(n).astype(np.float32)
                    rp, xp, dp = (os.path.join(tmp, e) for e in ("rows", "x", "dot"))
                    r[:nrows * (n // bs) * ts].tofile(rp)
                    x.tofile(xp)
                    run_tool(args.tool, "dot", name, rp, xp, dp)
                    gd = np.fromfile(dp, dtype=np.float32).astype(np.float64)
                    rd = a @ x.astype(np.float64)
                    scale = np.abs(a) @ np.abs(x.astype(np.float64))
                    if gd.shape != rd.shape or not np.all(np.abs(gd - rd) <= 1e-5 * scale + 1e-30):
                        print(f"FAIL {tag}: dot of {t.name}: got {gd} expected {rd}")
                        dot_fail = 1
                fails += dot_fail
                print(("FAIL " if dot_fail else "ok   ") + tag + ", " +
                      f"{int((ulps == 0).sum())} bit-exact, dots of {len(tensors)} tensors")
    print(f"{fails} failure(s)" if fails else "every fixture tensor agrees with gguf-py")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
