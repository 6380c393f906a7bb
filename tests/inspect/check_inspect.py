"""`mlaserve inspect` against independent facts.

- Hyperparameters of both fixtures equal the Hugging Face config.json they were converted from
  (not our own reading of the GGUF), and the softmax scale equals the YaRN formula applied to
  that config.
- The tensor table counts and bytes equal gguf-py's reading of the file.
- Tensor parallelism: 1, 2, 4 valid with whole-head splits; 3 refused with the reason; per-rank
  memory adds up (no tensor lost, replicated ones counted on every rank); the quantized file's
  unaligned attn_output / FFN splits are reported as fallbacks.
- A file without hyperparameters is refused, naming the missing key.
- A weight of a type the CUDA backend has no kernels for (TQ2_0 here) is reported with its count and
  a tensor; the fixtures and a Q4_0 weight (kernels since 2026-12-05) report none.
usage: check_inspect.py MLASERVE FIXTURES WORKDIR
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'gguf'))
import gguf_write as gw  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
import gguf_copy  # noqa: E402
from mlatest import check, finish  # noqa: E402

exe, fixtures, work = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(work, exist_ok=True)


def inspect(path, tp, expect_rc=None, parse=True):
    r = subprocess.run([exe, 'inspect', path, '--tp', str(tp), '--json'], capture_output=True, text=True)
    if expect_rc is not None:
        check(r.returncode == expect_rc, f'{path} --tp {tp}: exit {r.returncode}, want {expect_rc}: {r.stderr[-500:]}')
    if not parse:
        return None, r
    try:
        return json.loads(r.stdout), r
    except json.JSONDecodeError:
        check(False, f'{path} --tp {tp}: output is not JSON: {r.stdout[:200]} {r.stderr[-300:]}')
        return None, r


for fx, fname in [('tiny-deepseek3', 'tiny-deepseek3-bf16.gguf'), ('tiny-glm5', 'tiny-glm5-bf16.gguf')]:
    cfg = json.load(open(os.path.join(fixtures, fx, 'config.json')))
    path = os.path.join(fixtures, fx, fname)
    j, _ = inspect(path, 1, 0)
    if j is None:
        continue
    h = j['hyperparameters']
    want = {
        'n_embd': cfg['hidden_size'], 'n_head': cfg['num_attention_heads'],
        'n_layer': cfg['num_hidden_layers'], 'n_vocab': cfg['vocab_size'],
        'q_lora_rank': cfg['q_lora_rank'], 'kv_lora_rank': cfg['kv_lora_rank'],
        'head_nope': cfg['qk_nope_head_dim'], 'head_rope': cfg['qk_rope_head_dim'],
        'head_v': cfg['v_head_dim'], 'n_ff': cfg['intermediate_size'],
        'n_ff_exp': cfg['moe_intermediate_size'], 'n_expert': cfg['n_routed_experts'],
        'n_expert_used': cfg['num_experts_per_tok'], 'n_expert_shared': cfg['n_shared_experts'],
        'n_leading_dense': cfg['first_k_dense_replace'],
        'expert_weights_scale': cfg['routed_scaling_factor'],
    }
    if 'n_group' in cfg:
        want['n_expert_groups'] = cfg['n_group']
        want['n_expert_groups_used'] = cfg['topk_group']
    for k, v in want.items():
        check(k in h and abs(h[k] - v) < 1e-6, f'{fx}: {k} = {h.get(k)}, HF config says {v}')
    check(h['expert_weights_norm'] == cfg['norm_topk_prob'], f'{fx}: expert_weights_norm')
    check(abs(h['rms_eps'] - cfg['rms_norm_eps']) < 1e-9, f'{fx}: rms_eps')
    rp = cfg.get('rope_parameters') or cfg.get('rope_scaling') or {}
    theta = rp.get('rope_theta', cfg.get('rope_theta'))
    check(abs(h['rope_base'] - theta) < 1e-3, f'{fx}: rope_base {h["rope_base"]} vs {theta}')
    scale = 1 / math.sqrt(cfg['qk_nope_head_dim'] + cfg['qk_rope_head_dim'])
    if rp.get('rope_type') == 'yarn':
        check(h['yarn'] and abs(h['yarn_factor'] - rp['factor']) < 1e-6, f'{fx}: yarn factor')
        check(h['yarn_orig_ctx'] == rp['original_max_position_embeddings'], f'{fx}: yarn original ctx')
        m = 0.1 * rp['mscale_all_dim'] * math.log(rp['factor']) + 1.0
        scale *= m * m
    check(abs(h['kq_scale'] - scale) < 1e-6 * scale, f'{fx}: kq_scale {h["kq_scale"]} vs {scale}')
    if 'index_topk' in cfg:
        check(h.get('indexer_top_k') == cfg['index_topk'], f'{fx}: indexer top_k')
        check(h.get('indexer_n_head') == cfg['index_n_heads'], f'{fx}: indexer heads')
        check(h.get('indexer_head_dim') == cfg['index_head_dim'], f'{fx}: indexer head dim')
    check(j['tokenizer'].get('n_tokens') == cfg['vocab_size'], f'{fx}: tokenizer size')
    check('chat_template' in j['tokenizer'], f'{fx}: chat template chosen')
    # tensor table against gguf-py
    rd = GGUFReader(path)
    total = sum(int(t.n_bytes) for t in rd.tensors)
    check(sum(r['count'] for r in j['tensors_by_role']) == len(rd.tensors), f'{fx}: tensor count')
    check(sum(r['bytes'] for r in j['tensors_by_role']) == total, f'{fx}: tensor bytes')
    check(j['tensor_parallel']['bytes_total'] == total, f'{fx}: plan total bytes')

    repl = sum(int(t.n_bytes) for t in rd.tensors
               if '.indexer.' in t.name or not any(s in t.name for s in ('attn_q_b', 'attn_k_b', 'attn_v_b', 'attn_output',
                                                 'ffn_gate', 'ffn_up', 'ffn_down', 'output.weight'))
               or 'ffn_gate_inp' in t.name)
    for tp in (2, 4):
        j2, _ = inspect(path, tp, 0)
        if j2 is None:
            continue
        t2 = j2['tensor_parallel']
        check(t2['valid'], f'{fx} tp {tp}: not valid: {t2.get("reason")}')
        per = t2['bytes_per_rank']
        check(len(per) == tp, f'{fx} tp {tp}: per-rank list')
        # every split tensor is held exactly once over the ranks, every replicated one T times
        check(sum(per) == total + (tp - 1) * repl, f'{fx} tp {tp}: per-rank bytes {per} vs total {total} repl {repl}')
    j3, r3 = inspect(path, 3, 3)
    if j3:
        check(not j3['tensor_parallel']['valid'], f'{fx} tp 3 valid?')
        reason = j3['tensor_parallel'].get('reason', '')
        check('does not divide' in reason and '4 attention heads' in reason, f'{fx} tp 3 reason: {reason}')

# quantized file: unaligned splits fall back, and say so
q = os.path.join(fixtures, 'tiny-deepseek3', 'tiny-deepseek3-q4_k_m.gguf')
j, _ = inspect(q, 2, 0)
if j:
    notes = '\n'.join(j['tensor_parallel']['notes'])
    check('attn_output' in notes and 'output rows' in notes, f'q4_k_m tp 2 notes: {notes}')

# the CUDA backend's weight types: the fixtures have kernels for every one; a copy of the bf16
# fixture whose layer-0 attn_output is TQ2_0 (no CUDA kernels) names it, one with it Q4_0 is fine
for fx, fname in [('tiny-deepseek3', 'tiny-deepseek3-bf16.gguf'), ('tiny-deepseek3', 'tiny-deepseek3-q4_k_m.gguf'),
                  ('tiny-glm5', 'tiny-glm5-bf16.gguf')]:
    j, _ = inspect(os.path.join(fixtures, fx, fname), 1, 0)
    if j:
        check(j.get('cuda_types_ok') is True, f'{fname}: CUDA kernels for every type: {j.get("cuda_types_error")}')


for qt, ok in [(gguf_copy.QT.TQ2_0, False), (gguf_copy.QT.Q4_0, True)]:
    path = os.path.join(work, f'ds3-{qt.name.lower()}-attn-output.gguf')
    gguf_copy.copy(os.path.join(fixtures, 'tiny-deepseek3', 'tiny-deepseek3-bf16.gguf'), path,
                   tensor=lambda n, a, qt=qt: (a, qt) if n == 'blk.0.attn_output.weight' else None)
    j, _ = inspect(path, 1, 0)
    if j:
        e = j.get('cuda_types_error', '')
        want = (j.get('cuda_types_ok') is True and not e) if ok else (
            j.get('cuda_types_ok') is False and f'{qt.name} (1 tensor, e.g. blk.0.attn_output.weight)' in e
            and '--backend cpu' in e)
        check(j.get('tensors_ok') is True and want, f'a {qt.name} weight: {j.get("tensors_error")} / {e}')

# a file without the architecture's hyperparameters is refused with the missing key named
# (the plan's own refusals on synthetic tensors are in tests/unit/test_shard_plan.c)
kvs = [gw.kv('general.architecture', gw.STR, 'deepseek2')]
tensors = [('blk.0.attn_q_b.weight', [256, 384], gw.BF16_T)]
bad = os.path.join(work, 'no-arch-keys.gguf')
with open(bad, 'wb') as f:
    f.write(gw.build(kvs=kvs, tensors=tensors))
_, r = inspect(bad, 1, parse=False)
check(r.returncode != 0 and 'deepseek2.' in r.stderr, f'inspect of a file without hyperparameters: {r.returncode} {r.stderr[-300:]}')

finish()
