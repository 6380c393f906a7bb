#!/usr/bin/env python3
"""The no-q-LoRA layout (DeepSeek-V2-Lite: blk.N.attn_q.weight instead of attn_q_a / attn_q_a_norm /
attn_q_b; softmax routing, one expert group, 2 shared experts, routed scale 1) against the
independent numpy forward pass np_ref.py (gguf-py dequantization, HF DeepseekV2 semantics).

A small synthetic V2-Lite file is written with `mlaserve mkmodel --family v2lite --small`, then
`mlaserve logits` runs on a few short token lines with 1 rank and with --tp 2 (attn_q rows split
by heads); each run must give max|dlogit| / max|logit| <= RTOL against np_ref.
usage: check_v2lite.py MLASERVE WORKDIR [--rtol 1e-3] [--tp 2]
"""
import argparse
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import np_ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('mlaserve')
    ap.add_argument('work')
    ap.add_argument('--rtol', type=float, default=1e-3)
    ap.add_argument('--tp', type=int, default=2)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    model = os.path.join(a.work, 'v2lite.gguf')
    r = subprocess.run([a.mlaserve, 'mkmodel', '--family', 'v2lite', '--small', '--layers', '2',
                        '--threads', '2', '-o', model], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f'mkmodel failed ({r.returncode})')

    kv, W = np_ref.load(model)
    a_ = kv['general.architecture']
    if any(k.endswith('attn_q_a.weight') for k in W) or 'blk.0.attn_q.weight' not in W:
        raise SystemExit('FAIL: the generated file does not have the plain attn_q layout')
    V = W['output.weight'].shape[0]
    print(f"arch {a_}, vocab {V}, heads {kv[a_ + '.attention.head_count']}, "
          f"gating {kv.get(a_ + '.expert_gating_func')}, shared {kv.get(a_ + '.expert_shared_count')}, "
          f"scale {kv.get(a_ + '.expert_weights_scale')}, groups {kv.get(a_ + '.expert_group_count')}")

    rng = np.random.default_rng(7)
    lines = [rng.integers(0, V, size=n).tolist() for n in (6, 11, 3)]
    tok = os.path.join(a.work, 'tokens.txt')
    with open(tok, 'w') as f:
        for t in lines:
            f.write(' '.join(map(str, t)) + '\n')
    ref = np.concatenate([np_ref.forward(kv, W, t) for t in lines]).astype(np.float64)
    n_tot = sum(map(len, lines))

    ok = True
    for tp in (1, a.tp):
        out = os.path.join(a.work, f'out_tp{tp}.f32')
        cmd = [a.mlaserve, 'logits', '-m', model, '--tokens', tok, '--out', out, '--threads', '2']
        if tp > 1:
            cmd += ['--tp', str(tp)]
        r = subprocess.run(cmd, capture_output=True, text=True,
                           env=dict(os.environ, MLA_ROPE_FREQ_BF16='0'))
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            print(f'FAIL: mlaserve logits --tp {tp} exited {r.returncode}')
            ok = False
            continue
        ours = np.fromfile(out, dtype=np.float32)
        if ours.size != n_tot * V:
            print(f'FAIL: --tp {tp}: expected {n_tot}x{V} logits, got {ours.size} floats')
            ok = False
            continue
        ours = ours.reshape(n_tot, V).astype(np.float64)
        rel = float(np.abs(ours - ref).max() / max(1e-6, np.abs(ref).max()))
        agree = float((ours.argmax(-1) == ref.argmax(-1)).mean())
        print(f'--tp {tp}: max|dlogit|/max|logit| {rel:.2e} (max|logit| {np.abs(ref).max():.3f}), '
              f'argmax agree {agree:.3f}')
        if not np.isfinite(ours).all() or rel > a.rtol:
            print(f'FAIL: --tp {tp}: {rel:.2e} > {a.rtol}')
            ok = False
    shutil.rmtree(a.work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == '__main__':
    main()
