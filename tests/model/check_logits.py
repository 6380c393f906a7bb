#!/usr/bin/env python3
"""Runs `mlaserve logits` on a fixture GGUF file and compares with the fixture references.

  check_logits.py --mlaserve BIN --fixture DIR --model FILE.gguf [--threads N]
      [--hf-argmax 0.99] [--hf-dlogp 0.01]           bounds against HF ref_logits.f32
      [--llamacpp FILE.f32 --lc-dlogp X]             bound against llama.cpp logits
      [--greedy]                                     greedy ids equal HF `greedy`
      [--incremental K --inc-rtol 1e-4]              decode from K == one pass
      [--chunk N --chunk-rtol 1e-4]                  prompts in steps of N tokens == one pass
      [--prefix-reuse R --reuse-rtol 1e-4]           the first R tokens' whole cache blocks computed by
                                                     another sequence and shared == one pass
      (--chunk and --prefix-reuse need worker processes: --extra=--processes, --tp > 1 or a backend)
      [--paths-vs-hf]                                each of those other paths held to the HF bounds
                                                     (--hf-argmax, --hf-dlogp) instead of its bound
                                                     against one pass (printed): for fp16 caches,
                                                     where paths round differently and near-tied
                                                     choices (DSA keys, experts) may go either way
      [--prompts 0,3,7]                              subset of prompts
      [--rope-freq-bf16] [--hf-dlogit X]             run with MLA_ROPE_FREQ_BF16=1 (RoPE inverse
                                                     frequencies rounded to bf16, as the HF reference
                                                     computed them); bound on max |logit - HF logit|
Prints the measured numbers; exits 1 when a bound fails."""
import argparse, json, os, subprocess, sys, tempfile
import numpy as np


def logsoftmax(z):
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


ROPE_BF16 = False


def run(bin_, model, prompts, threads, tmp, extra=()):
    tok = os.path.join(tmp, 'tokens.txt')
    with open(tok, 'w') as f:
        for p in prompts:
            f.write(' '.join(map(str, p['tokens'])) + '\n')
    out = os.path.join(tmp, 'out.f32')
    cmd = [bin_, 'logits', '-m', model, '--tokens', tok, '--out', out, '--threads', str(threads), *extra]
    env = dict(os.environ, MLA_ROPE_FREQ_BF16='1' if ROPE_BF16 else '0')
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f'mlaserve logits failed ({r.returncode})')
    for line in r.stderr.splitlines():  # mla-e2e's graph capture/launch counts: the evidence
        if 'CUDA graphs' in line:
            print(line)
    return np.fromfile(out, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--mlaserve', required=True)
    ap.add_argument('--fixture', required=True)
    ap.add_argument('--model', required=True)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--hf-argmax', type=float)
    ap.add_argument('--hf-dlogp', type=float)
    ap.add_argument('--hf-dlogit', type=float, help='bound on max |logit - HF logit|')
    ap.add_argument('--rope-freq-bf16', action='store_true',
                    help='run with MLA_ROPE_FREQ_BF16=1: the RoPE frequencies of the HF reference')
    ap.add_argument('--llamacpp')
    ap.add_argument('--lc-dlogp', type=float)
    ap.add_argument('--greedy', action='store_true')
    ap.add_argument('--incremental', type=int)
    ap.add_argument('--inc-rtol', type=float, default=1e-4)
    ap.add_argument('--chunk', type=int)
    ap.add_argument('--chunk-rtol', type=float, default=1e-4)
    ap.add_argument('--prefix-reuse', type=int)
    ap.add_argument('--reuse-rtol', type=float, default=1e-4)
    ap.add_argument('--paths-vs-hf', action='store_true',
                    help='incremental / chunks / prefix reuse each held to the HF bounds, not to one pass')
    ap.add_argument('--prompts')
    ap.add_argument('--tp', type=int, default=1, help='tensor-parallel ranks for the runs')
    ap.add_argument('--tp-rtol', type=float, help='also run with 1 rank; max |diff| / max|logit| bound')
    ap.add_argument('--extra', action='append', default=[],
                    help='one more argument for the logits command (repeatable; --extra=--batch)')
    a = ap.parse_args()
    global ROPE_BF16
    ROPE_BF16 = a.rope_freq_bf16

    ref = json.load(open(os.path.join(a.fixture, 'ref.json')))
    V = ref['vocab'] if isinstance(ref.get('vocab'), int) else 2048
    idx = [int(x) for x in a.prompts.split(',')] if a.prompts else list(range(len(ref['prompts'])))
    prompts = [ref['prompts'][i] for i in idx]
    hf_all = np.fromfile(os.path.join(a.fixture, 'ref_logits.f32'), dtype=np.float32)
    lc_all = np.fromfile(a.llamacpp, dtype=np.float32) if a.llamacpp else None
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        extra = ['--greedy', '24', '--ids-out', os.path.join(tmp, 'ids.txt')] if a.greedy else []
        tpx = ['--tp', str(a.tp)] if a.tp > 1 else []
        ours = run(a.mlaserve, a.model, prompts, a.threads, tmp, extra + tpx + a.extra)
        n_tot = sum(len(p['tokens']) for p in prompts)
        if ours.size != n_tot * V:
            raise SystemExit(f'expected {n_tot}x{V} logits, got {ours.size} floats')
        ours = ours.reshape(n_tot, V)
        gen = open(os.path.join(tmp, 'ids.txt')).read().splitlines() if a.greedy else None
        inc = None
        if a.incremental is not None:
            inc = run(a.mlaserve, a.model, prompts, a.threads, tmp, ['--decode-from', str(a.incremental)] + tpx).reshape(n_tot, V)
        others = []  # (name, logits, bound): other ways of running the prompts that must equal one pass
        if a.chunk is not None:
            others.append((f'chunks of {a.chunk}', run(a.mlaserve, a.model, prompts, a.threads, tmp,
                                                     ['--chunk', str(a.chunk)] + tpx + a.extra).reshape(n_tot, V),
                         a.chunk_rtol))
        if a.prefix_reuse is not None:
            others.append((f'prefix of {a.prefix_reuse} shared', run(a.mlaserve, a.model, prompts, a.threads, tmp,
                                                                 ['--prefix-reuse', str(a.prefix_reuse)] + tpx +
                                                                 a.extra).reshape(n_tot, V), a.reuse_rtol))
        one = None
        if a.tp_rtol is not None:
            one = run(a.mlaserve, a.model, prompts, a.threads, tmp).reshape(n_tot, V)

    def next_dlogp(o, ref, p):
        """|log p - reference log p| of each next token of prompt p (T - 1 values)"""
        T = len(p['tokens'])
        nxt = np.array(p['tokens'][1:], dtype=np.int64)
        return np.abs(logsoftmax(o)[np.arange(T - 1), nxt] - logsoftmax(ref)[np.arange(T - 1), nxt])

    def hf_of(p):
        return hf_all.reshape(-1, V)[p['logits_offset'] // V:][:len(p['tokens'])]

    def vs_hf(logits):
        """argmax agreement, positions and worst |dlogp| of the next token against HF"""
        ag = n = 0
        dw = 0.0
        o0 = 0
        for p in prompts:
            T = len(p['tokens'])
            o, h = logits[o0:o0 + T], hf_of(p)
            ag += int((o.argmax(-1) == h.argmax(-1)).sum())
            n += T
            if T > 1:
                dw = max(dw, float(next_dlogp(o, h, p).max()))
            o0 += T
        return ag, n, dw

    def other_path(name, other, bound):
        """a path that must equal one pass within bound, or with --paths-vs-hf meet the HF bounds"""
        d = np.abs(other - ours).max(-1) / max(1e-6, np.abs(ours).max())
        rel = float(d.max())
        far = np.nonzero(d > bound)[0]
        line = f'{name} vs one pass: max|dlogit|/max|logit| {rel:.2e}'
        if len(far):
            line += f' ({len(far)} of {len(d)} positions beyond {bound}: rows {far[:8].tolist()})'
        if not a.paths_vs_hf:
            print(line)
            if rel > bound:
                print(f'FAIL: {name} differs from one pass: {rel:.2e} > {bound}')
                return False
            return True
        ag, n, dw = vs_hf(other)
        print(f'{line}; vs HF: argmax {ag}/{n}, worst |dlogp| {dw:.2e}')
        good = True
        if a.hf_argmax is not None and ag / n < a.hf_argmax:
            print(f'FAIL: {name}: argmax agreement with HF {ag / n:.4f} < {a.hf_argmax}'); good = False
        if a.hf_dlogp is not None and dw > a.hf_dlogp:
            print(f'FAIL: {name}: worst |dlogp| vs HF {dw:.2e} > {a.hf_dlogp}'); good = False
        return good

    off = 0
    worst = dict(hf_dlogp=0.0, hf_dlogit=0.0, lc_dlogp=0.0, inc_rel=0.0)
    agree = total = 0
    for k, p in enumerate(prompts):
        T = len(p['tokens'])
        o = ours[off:off + T]
        base = p['logits_offset'] // V
        h = hf_of(p)
        d = next_dlogp(o, h, p) if T > 1 else np.zeros(0)
        ag = int((o.argmax(-1) == h.argmax(-1)).sum())
        agree += ag
        total += T
        line = (f'prompt {idx[k]:2d} T={T:3d}: argmax {ag}/{T}  worst|dlogp| {d.max() if d.size else 0:.2e}'
                f'  max|dlogit| {np.abs(o - h).max():.2e}')
        if d.size:
            worst['hf_dlogp'] = max(worst['hf_dlogp'], float(d.max()))
        worst['hf_dlogit'] = max(worst['hf_dlogit'], float(np.abs(o - h).max()))
        if lc_all is not None:
            dl = next_dlogp(o, lc_all.reshape(-1, V)[base:base + T], p) if T > 1 else np.zeros(0)
            line += f'  vs llama.cpp worst|dlogp| {dl.max() if dl.size else 0:.4f}'
            if dl.size:
                worst['lc_dlogp'] = max(worst['lc_dlogp'], float(dl.max()))
        if inc is not None:
            rel = np.abs(inc[off:off + T] - o).max() / max(1e-6, np.abs(o).max())
            worst['inc_rel'] = max(worst['inc_rel'], float(rel))
            line += f'  incremental rel {rel:.2e}'
        if gen is not None:
            g = [int(x) for x in gen[k].split()]
            same = g == p['greedy']
            line += f'  greedy {"==" if same else "!="} HF'
            if not same:
                ok = False
                line += f' (ours {g} HF {p["greedy"]})'
        print(line)
        off += T
    print(f'TOTAL argmax {agree}/{total} = {agree / total:.4f}; worst |dlogp| vs HF {worst["hf_dlogp"]:.2e};'
          f' max|dlogit| {worst["hf_dlogit"]:.2e}; vs llama.cpp {worst["lc_dlogp"]:.4f}; incremental rel {worst["inc_rel"]:.2e}')
    if inc is not None:
        others.insert(0, (f'decode from {a.incremental}', inc, a.inc_rtol))
    for name, other, bound in others:
        ok = other_path(name, other, bound) and ok
    if one is not None:
        rel = float(np.abs(one - ours).max() / max(1e-6, np.abs(one).max()))
        print(f'{a.tp} ranks vs 1 rank: max|dlogit|/max|logit| {rel:.2e}')
        if rel > a.tp_rtol:
            print(f'FAIL: tensor-parallel logits differ from 1 rank: {rel:.2e} > {a.tp_rtol}'); ok = False
    if a.hf_argmax is not None and agree / total < a.hf_argmax:
        print(f'FAIL: argmax agreement {agree / total:.4f} < {a.hf_argmax}'); ok = False
    if a.hf_dlogp is not None and worst['hf_dlogp'] > a.hf_dlogp:
        print(f'FAIL: worst |dlogp| vs HF {worst["hf_dlogp"]:.5f} > {a.hf_dlogp}'); ok = False
    if a.hf_dlogit is not None and worst['hf_dlogit'] > a.hf_dlogit:
        print(f'FAIL: max |dlogit| vs HF {worst["hf_dlogit"]:.2e} > {a.hf_dlogit}'); ok = False
    if a.lc_dlogp is not None and worst['lc_dlogp'] > a.lc_dlogp:
        print(f'FAIL: worst |dlogp| vs llama.cpp {worst["lc_dlogp"]:.4f} > {a.lc_dlogp}'); ok = False
    sys.exit(0 if ok else 1)


if __name__ == '__main__':
    main()
