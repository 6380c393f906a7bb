#!/usr/bin/env python3
"""kernels/quant against gguf-py on random blocks of every supported GGUF type.

For each type: random raw blocks (random bytes, with the scale fields replaced by finite fp16
values), dequantized by our C code (quant_tool dequant) and by gguf.quants.dequantize; every
element must agree bit-exactly or within 1 ulp of float32. Then quant_dot_row (quant_tool dot)
on rows of several lengths against a float64 dot of gguf-py's dequantized rows, within
1e-5 * sum|a_i x_i|. F16 and BF16 are checked on all 65536 bit patterns.
Q8_K has no dequantizer in gguf-py; its reference is the format's definition (f32 d * int8 q),
written out below in numpy.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf import quants

# fp16 scale fields (byte offsets inside the block) of each block type.
FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0],
    "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0], "TQ1_0": [52], "TQ2_0": [64],
    "IQ1_M": [], "MXFP4": [], "Q8_K": [],
}
BLOCK_TYPES = list(FP16_FIELDS)
PLAIN_TYPES = ["F32", "F16", "BF16"]


def random_fp16(rng, n):
    """Finite fp16 scales: log-uniform magnitudes 2^-20..2^1 (some subnormal), random signs,
    a few exact zeros."""
    mag = np.exp2(rng.uniform(-20, 1, n)).astype(np.float32)
    v = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    v[rng.random(n) < 0.01] = 0
    assert np.all(np.isfinite(v))
    return v


def make_blocks(rng, name, nblocks):
    bs, ts = GGML_QUANT_SIZES[T[name]]
    b = rng.integers(0, 256, (nblocks, ts), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        b[:, off:off + 2] = random_fp16(rng, nblocks).view(np.uint8).reshape(nblocks, 2)
    if name == "IQ1_M":  # fp16 d spread over the top nibbles of the 4 u16 scales at byte 48
        d = random_fp16(rng, nblocks).view(np.uint16).astype(np.uint32)
        sc = b[:, 48:56].copy().view(np.uint16).astype(np.uint32)  # (nblocks, 4)
        for i, sh in enumerate([0, 4, 8, 12]):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((d >> sh) & 0xF) << 12)
        b[:, 48:56] = sc.astype(np.uint16).view(np.uint8)
    if name == "MXFP4":  # e8m0 exponent: keep 12 * 2^(e-128) finite; include e = 0, 1
        b[:, 0] = rng.integers(0, 200, nblocks, dtype=np.uint8)
        b[:4, 0] = [0, 1, 2, 127]
    if name == "Q8_K":
        d = (rng.standard_normal(nblocks) * 1e-2).astype(np.float32)
        b[:, 0:4] = d.view(np.uint8).reshape(nblocks, 4)
    return b


def reference(name, raw):
    """gguf-py dequantization of the raw bytes (1-D uint8) as float32."""
    if name == "Q8_K":
        bs, ts = GGML_QUANT_SIZES[T.Q8_K]
        blk = raw.reshape(-1, ts)
        d = blk[:, 0:4].copy().view(np.float32)
        q = blk[:, 4:4 + bs].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    return np.asarray(quants.dequantize(raw, T[name]), dtype=np.float32).reshape(-1)


def ordered(a):
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def compare(name, got, ref):
    """Number of mismatches (more than 1 ulp apart; NaN matches NaN), with a report."""
    if got.shape != ref.shape:
        print(f"FAIL {name}: {got.size} values, expected {ref.size}")
        return max(1, ref.size)
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    ulps = np.abs(ordered(got) - ordered(ref))
    bad = (nan_g != nan_r) | (~nan_r & (ulps > 1))
    nbad = int(bad.sum())
    exact = int((~nan_r & (ulps == 0)).sum() + (nan_g & nan_r).sum())
    if nbad:
        i = int(np.argmax(bad))
        print(f"FAIL {name}: {nbad}/{ref.size} elements differ by > 1 ulp; first at {i}: "
              f"got {got[i]!r} expected {ref[i]!r}")
    else:
        print(f"ok   {name}: {ref.size} elements, {exact} bit-exact, {ref.size - exact} within 1 ulp")
    return nbad


def run_tool(tool, *args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")


def check_dots(tool, tmp, name, raw, deq, row_counts, rng):
    """quant_dot_row on rows of n elements for each n in row_counts."""
    bs, ts = GGML_QUANT_SIZES[T[name]]
    fails = 0
    for n in row_counts:
        nrows = min(24, deq.size // n)
        nbytes = n // bs * ts
        rows = raw[:nrows * nbytes]
        a = deq[:nrows * n].reshape(nrows, n).astype(np.float64)
        x = rng.standard_normal(n).astype(np.float32)
        rp, xp, op = (os.path.join(tmp, f"{name}_{n}.{e}") for e in ("rows", "x", "dot"))
        rows.tofile(rp)
        x.tofile(xp)
        run_tool(tool, "dot", name, rp, xp, op)
        got = np.fromfile(op, dtype=np.float32).astype(np.float64)
        ref = a @ x.astype(np.float64)
        scale = np.abs(a) @ np.abs(x.astype(np.float64))
        err = np.abs(got - ref) if got.shape == ref.shape else np.array([np.inf])
        bad = ~(err <= 1e-5 * scale + 1e-30)
        if bad.any():
            i = int(np.argmax(bad))
            print(f"FAIL {name} dot n={n}: row {i}: got {got[i] if got.size > i else None} "
                  f"expected {ref[i]} (sum|a x| = {scale[i]})")
            fails += 1
    print(f"ok   {name} dot: lengths {row_counts}" if not fails else f"FAIL {name} dot: {fails} lengths")
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--blocks", type=int, default=4096, help="random blocks per 32-element type")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in PLAIN_TYPES + BLOCK_TYPES:
            bs, ts = GGML_QUANT_SIZES[T[name]]
            if name == "F32":
                vals = (rng.standard_normal(65536) * np.exp2(rng.uniform(-30, 30, 65536))).astype(np.float32)
                raw = vals.view(np.uint8)
            elif name in ("F16", "BF16"):
                raw = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.uint8)
            else:
                nblocks = args.blocks if bs <= 32 else max(1, args.blocks // 2)
                raw = make_blocks(rng, name, nblocks).reshape(-1)
            ip, op = os.path.join(tmp, name + ".in"), os.path.join(tmp, name + ".out")
            raw.tofile(ip)
            try:
                run_tool(args.tool, "dequant", name, ip, op)
            except RuntimeError as e:
                print(f"FAIL {name}: {e}")
                fails += 1
                continue
            got = np.fromfile(op, dtype=np.float32)
            ref = reference(name, raw)
            fails += compare(name, got, ref) > 0

            # dot products on finite rows
            if name == "F16":
                v = (rng.standard_normal(8192) * 4).astype(np.float16)
                raw, ref = v.view(np.uint8), v.astype(np.float32)
            elif name == "BF16":
                v = rng.standard_normal(8192).astype(np.float32)
                raw = (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
                ref = reference(name, raw)
            assert np.all(np.isfinite(ref)), name
            counts = ([1, 5, 16, 17, 100, 1000, 4099] if bs == 1 else
                      [bs * k for k in ((1, 2, 3, 7, 16, 128) if bs == 32 else (1, 2, 3, 7, 16))])
            try:
                fails += check_dots(args.tool, tmp, name, raw, ref, counts, rng) > 0
            except RuntimeError as e:
                print(f"FAIL {name} dot: {e}")
                fails += 1
    print(f"{fails} type(s) failed" if fails else "all types agree with gguf-py")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
