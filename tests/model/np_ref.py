#!/usr/bin/env python3
"""Independent numpy forward pass of the tiny fixtures (debug aid, not a test oracle:
the oracle is ref_logits.f32 from HF).
Usage: np_ref.py MODEL.gguf REF.json [prompt_idx|all] [mla_rope] [idx_rope] [--rope-freq-bf16]
--rope-freq-bf16 rounds the RoPE inverse frequencies to bf16 after YaRN, as the HF reference did
(its inv_freq buffer was cast to bf16 together with the weights): with it both fixtures agree
with ref_logits.f32 to ~2e-5, the long glm5 prompt included."""
import json, math, sys
import numpy as np
import gguf
from gguf.quants import dequantize

def load(path):
    r = gguf.GGUFReader(path)
    kv = {}
    for k, f in r.fields.items():
        try: kv[k] = f.contents()
        except Exception: pass
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32)
        W[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    return kv, W

def rms(x, w, eps): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

def rope_inter(x, pos, inv):  # x [..., T, d] adjacent pairs
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    o = np.empty_like(x)
    o[..., 0::2] = x0 * c - x1 * s
    o[..., 1::2] = x0 * s + x1 * c
    return o

def rope_neox(x, pos, inv):
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)

def _score(qi, ki, w, ihd):
    sc = np.maximum(np.einsum('thd,sd->ths', qi, ki) * ihd ** -0.5, 0)
    return np.einsum('ths,th->ts', sc, w)
SCORE = _score
SELECT = lambda row, k, t: np.argsort(-row, kind='stable')[:k]
LNMODE = 'ln'
ROPE_BF16 = False

def bf16_round(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)

def forward(kv, W, toks, mla_rope='inter', idx_rope='inter'):
    a = kv['general.architecture']; g = lambda k, d=None: kv.get(a + '.' + k, d)
    nl, H = g('block_count'), g('attention.head_count')
    kvr, dk, dv, dr = g('attention.kv_lora_rank'), g('attention.key_length_mla'), g('attention.value_length_mla'), g('rope.dimension_count')
    dn = dk - dr; eps = g('attention.layer_norm_rms_epsilon'); base = g('rope.freq_base')
    T = len(toks); pos = np.arange(T, dtype=np.float64)
    inv = 1.0 / base ** (np.arange(0, dr, 2, dtype=np.float64) / dr)
    scale = 1 / math.sqrt(dk)
    if g('rope.scaling.type') == 'yarn':
        f = g('rope.scaling.factor'); orig = g('rope.scaling.original_context_length')
        bf, bs = g('rope.scaling.yarn_beta_fast'), g('rope.scaling.yarn_beta_slow')
        cd = lambda nr: dr * math.log(orig / (nr * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(math.floor(cd(bf)), 0), min(math.ceil(cd(bs)), dr - 1)
        if lo == hi: hi += 0.001
        ramp = np.clip((np.arange(dr // 2) - lo) / (hi - lo), 0, 1)
        extra = 1 - ramp
        inv = inv / f * (1 - extra) + inv * extra
        m = 1 + g('rope.scaling.yarn_log_multiplier') * math.log(f)
        scale *= m * m
    if ROPE_BF16: inv = bf16_round(inv)
    x = W['token_embd.weight'][toks]
    ndense = g('leading_dense_block_count', 0)
    for l in range(nl):
        p = f'blk.{l}.'
        h = rms(x, W[p + 'attn_norm.weight'], eps)
        if p + 'attn_q_a.weight' in W:
            cq = rms(h @ W[p + 'attn_q_a.weight'].T, W[p + 'attn_q_a_norm.weight'], eps)
            q = (cq @ W[p + 'attn_q_b.weight'].T).reshape(T, H, dk).transpose(1, 0, 2)
        else:  # no q-LoRA (DeepSeek-V2-Lite): HF q_proj, rows per head [nope | rope]
            q = (h @ W[p + 'attn_q.weight'].T).reshape(T, H, dk).transpose(1, 0, 2)
        qn, qp = q[..., :dn], q[..., dn:]
        ckv = h @ W[p + 'attn_kv_a_mqa.weight'].T
        c, kp = rms(ckv[:, :kvr], W[p + 'attn_kv_a_norm.weight'], eps), ckv[:, kvr:]
        rf = rope_inter if mla_rope == 'inter' else rope_neox
        qp = rf(qp, pos, inv); kp = rf(kp, pos, inv)
        kb = W[p + 'attn_k_b.weight']  # [H, kvr, dn]
        vb = W[p + 'attn_v_b.weight']  # [H, dv, kvr]
        qa = np.einsum('htd,hcd->htc', qn, kb)
        s = (np.einsum('htc,sc->hts', qa, c) + np.einsum('htd,sd->hts', qp, kp)) * scale
        mask = np.triu(np.ones((T, T), bool), 1)
        if p + 'indexer.attn_k.weight' in W:
            ihd = g('attention.indexer.key_length'); inh = g('attention.indexer.head_count'); topk = g('attention.indexer.top_k')
            qi = (cq @ W[p + 'indexer.attn_q_b.weight'].T).reshape(T, inh, ihd)
            ki = h @ W[p + 'indexer.attn_k.weight'].T
            mu = ki.mean(-1, keepdims=True); var = ((ki - mu) ** 2).mean(-1, keepdims=True)
            if LNMODE == 'ln': ki = (ki - mu) / np.sqrt(var + 1e-6) * W[p + 'indexer.k_norm.weight'] + W[p + 'indexer.k_norm.bias']
            elif LNMODE == 'rms': ki = ki / np.sqrt((ki * ki).mean(-1, keepdims=True) + 1e-6)
            irf = rope_neox if idx_rope.startswith('neox') else rope_inter
            if idx_rope == 'none': irf = lambda z, p, f: z
            if idx_rope.endswith('last'):
                qi = np.concatenate([qi[..., :ihd - dr], irf(qi[..., ihd - dr:].transpose(1, 0, 2), pos, inv).transpose(1, 0, 2)], -1)
                ki = np.concatenate([ki[:, :ihd - dr], irf(ki[:, ihd - dr:], pos, inv)], -1)
            else:
                qi = np.concatenate([irf(qi[..., :dr].transpose(1, 0, 2), pos, inv).transpose(1, 0, 2), qi[..., dr:]], -1)
                ki = np.concatenate([irf(ki[:, :dr], pos, inv), ki[:, dr:]], -1)
            w = h @ W[p + 'indexer.proj.weight'].T * inh ** -0.5
            isc = SCORE(qi, ki, w, ihd)
            isc[mask] = -np.inf
            sel = np.ones((T, T), bool)
            for t in range(T):
                if t + 1 > topk:
                    order = SELECT(isc[t, :t + 1], topk, t)
                    sel[t] = True; sel[t, :] = False; sel[t, order] = True
            mask = mask | ~sel
        s[:, mask] = -np.inf
        s = s - s.max(-1, keepdims=True); pr = np.exp(s); pr /= pr.sum(-1, keepdims=True)
        ol = np.einsum('hts,sc->htc', pr, c)
        o = np.einsum('htc,hvc->thv', ol, vb).reshape(T, H * dv)
        x = x + o @ W[p + 'attn_output.weight'].T
        h = rms(x, W[p + 'ffn_norm.weight'], eps)
        silu = lambda z: z / (1 + np.exp(-z))
        if l < ndense:
            y = (silu(h @ W[p + 'ffn_gate.weight'].T) * (h @ W[p + 'ffn_up.weight'].T)) @ W[p + 'ffn_down.weight'].T
        else:
            ne, nu = g('expert_count'), g('expert_used_count'); ng, gu = g('expert_group_count', 1), g('expert_group_used_count', 1)
            lg = h @ W[p + 'ffn_gate_inp.weight'].T
            sg = 1 / (1 + np.exp(-lg)) if g('expert_gating_func', 2) == 2 else np.exp(lg - lg.max(-1, keepdims=True)) / np.exp(lg - lg.max(-1, keepdims=True)).sum(-1, keepdims=True)
            ch = sg + W[p + 'exp_probs_b.bias'] if p + 'exp_probs_b.bias' in W else sg
            y = np.zeros_like(h)
            for t in range(T):
                # a group scores by its best two (sigmoid: V3's noaux_tc) or its best (softmax: V2's greedy groups)
                gs = np.sort(ch[t].reshape(ng, -1), -1)[:, -2 if g('expert_gating_func', 2) == 2 else -1:].sum(-1)
                keep = np.argsort(-gs, kind='stable')[:gu]
                cc = np.full(ne, -np.inf); 
                for gi in keep: cc[gi * (ne // ng):(gi + 1) * (ne // ng)] = ch[t, gi * (ne // ng):(gi + 1) * (ne // ng)]
                e = np.argsort(-cc, kind='stable')[:nu]
                wt = sg[t, e]
                if g('expert_weights_norm', False): wt = wt / (wt.sum() + 1e-20)
                wt = wt * g('expert_weights_scale', 1.0)
                for ei, we in zip(e, wt):
                    z = silu(W[p + 'ffn_gate_exps.weight'][ei] @ h[t]) * (W[p + 'ffn_up_exps.weight'][ei] @ h[t])
                    y[t] += we * (W[p + 'ffn_down_exps.weight'][ei] @ z)
            y += (silu(h @ W[p + 'ffn_gate_shexp.weight'].T) * (h @ W[p + 'ffn_up_shexp.weight'].T)) @ W[p + 'ffn_down_shexp.weight'].T
        x = x + y
    x = rms(x, W['output_norm.weight'], eps)
    return x @ W['output.weight'].T

def logsm(z): z = z - z.max(-1, keepdims=True); return z - np.log(np.exp(z).sum(-1, keepdims=True))

if __name__ == '__main__':
    if '--rope-freq-bf16' in sys.argv:
        sys.argv.remove('--rope-freq-bf16'); ROPE_BF16 = True
    kv, W = load(sys.argv[1]); ref = json.load(open(sys.argv[2]))
    allref = np.fromfile(sys.argv[2].replace('ref.json', 'ref_logits.f32'), dtype=np.float32).reshape(-1, 2048)
    mr = sys.argv[4] if len(sys.argv) > 4 else 'inter'; ir = sys.argv[5] if len(sys.argv) > 5 else 'inter'
    idxs = [int(sys.argv[3])] if len(sys.argv) > 3 and sys.argv[3] != 'all' else range(len(ref['prompts']))
    for i in idxs:
        pr = ref['prompts'][i]; toks = pr['tokens']; T = len(toks)
        lo = forward(kv, W, toks, mr, ir)
        rl = allref[pr['logits_offset'] // 2048: pr['logits_offset'] // 2048 + T]
        a, b = logsm(lo.astype(np.float64)), logsm(rl.astype(np.float64))
        nxt = toks[1:]
        dl = np.abs(a[np.arange(T - 1), nxt] - b[np.arange(T - 1), nxt])
        print(i, T, 'argmax agree', (lo.argmax(-1) == rl.argmax(-1)).mean(), 'max|dlogit|', np.abs(lo - rl).max(), 'worst dlogp', dl.max() if len(dl) else 0, 'first bad pos', (np.flatnonzero(np.abs(lo - rl).max(-1) > 0.05)[:1].tolist() or [-1])[0])
