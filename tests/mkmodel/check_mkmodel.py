"""`mlaserve mkmodel`: synthetic models of the three families, checked by independent readers.

For each case: the file(s) are written, then
- gguf-py (not our reader) opens every part: tensor count = split.tensors.count, the shapes the
  family's published config implies, a few tensors of every quant type dequantize to finite
  values with a sane spread (std within 1/4..4 x 1/sqrt(row length));
- the tokenizer is a valid byte-level BPE: every byte has its token, tokens are unique, every
  merge joins two tokens into a third one, the vocabulary size equals vocab_size;
- the metadata keys llama.cpp reads for the architecture are present;
- `mlaserve inspect` accepts it for --tp 1, 2, 4, 8 (our reader, common/gguf.h, and the plan);
- `mlaserve logits` runs a forward pass with finite, non-constant logits.
Files are written under WORKDIR and deleted afterwards.
usage: check_mkmodel.py MLASERVE WORKDIR
"""
import glob
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as QT
from gguf.quants import dequantize

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
from mlatest import check, finish  # noqa: E402

exe, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# published dimensions (HF config.json of each model), independent of cmd_mkmodel.c
FAM = {
    'v3': dict(arch='deepseek2', heads=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v=128,
               experts=256, used=8, groups=8, groups_used=4, shared=1, dense=3, vocab=129280,
               hidden=7168, ff=18432, ff_exp=2048, pre='deepseek-v3'),
    'glm5': dict(arch='glm-dsa', heads=64, q_lora=2048, kv_lora=512, nope=192, rope=64, v=256,
                 experts=256, used=8, groups=1, groups_used=1, shared=1, dense=3, vocab=154880,
                 hidden=6144, ff=12288, ff_exp=2048, pre='glm4', idx_heads=32, idx_dim=128, idx_topk=2048),
    'v2lite': dict(arch='deepseek2', heads=16, q_lora=0, kv_lora=512, nope=128, rope=64, v=128,
                   experts=64, used=6, groups=1, groups_used=1, shared=2, dense=1, vocab=102400,
                   hidden=2048, ff=10944, ff_exp=1408, pre='deepseek-v3'),
    # GLM-4.7-Flash (zai-org/GLM-4.7-Flash config.json, glm4_moe_lite; its GGUF says deepseek2)
    'glm47flash': dict(arch='deepseek2', heads=20, q_lora=768, kv_lora=512, nope=192, rope=64, v=256,
                       experts=64, used=4, groups=1, groups_used=1, shared=1, dense=1, vocab=154880,
                       hidden=2048, ff=10240, ff_exp=1536, pre='glm4'),
}
SMALL = dict(hidden=1024, heads=16, vocab=4096, experts=16, ff=1024)
MIX_EXP = {'q4k': QT.Q4_K, 'iq2': QT.IQ2_XXS, 'iq3': QT.IQ3_XXS}

# (name, family, layers, mix, extra args, overrides of the published dims)
CASES = [
    ('v3', 'v3', 4, 'q4k', ['--small'], dict(SMALL, ff_exp=256)),
    ('glm5', 'glm5', 4, 'iq2', ['--small', '--split-size', '24M'], dict(SMALL, ff_exp=256)),
    ('v2lite', 'v2lite', 2, 'iq3', ['--small'], dict(SMALL, ff_exp=352)),
    # 20 heads kept: a head count that is not a power of two, with qk_nope 192 and v 256 under deepseek2
    ('glm47flash', 'glm47flash', 3, 'q4k', ['--small', '--heads', '20'], dict(SMALL, ff_exp=256, heads=20)),
    # the real vocabulary size with a narrow width: the tokenizer at full size
    ('v3vocab', 'v3', 1, 'q4k', ['--small', '--vocab', '129280', '--hidden', '256'],
     dict(SMALL, ff_exp=256, vocab=129280, hidden=256)),
]


def field(r, key):
    f = r.fields.get(key)
    return None if f is None else f.contents()


def byte_tokens():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c) for c in cs}


BYTES = byte_tokens()


def check_file(name, fam, layers, mix, dims, parts):
    readers = [GGUFReader(p) for p in parts]
    r0 = readers[0]
    a = fam['arch']
    if len(parts) > 1:
        check(field(r0, 'split.count') == len(parts), f'{name}: split.count')
        n_all = sum(len(r.tensors) for r in readers)
        check(field(r0, 'split.tensors.count') == n_all, f'{name}: split.tensors.count {n_all}')
        for i, r in enumerate(readers):
            check(field(r, 'split.no') == i, f'{name}: split.no of part {i + 1}')
    want = {
        'block_count': layers, 'embedding_length': dims['hidden'], 'attention.head_count': dims['heads'],
        'attention.kv_lora_rank': fam['kv_lora'], 'attention.q_lora_rank': fam['q_lora'],
        'attention.key_length_mla': fam['nope'] + fam['rope'], 'attention.value_length_mla': fam['v'],
        'rope.dimension_count': fam['rope'], 'expert_count': dims['experts'],
        'expert_used_count': fam['used'], 'expert_group_count': fam['groups'],
        'expert_group_used_count': fam['groups_used'], 'expert_shared_count': fam['shared'],
        'leading_dense_block_count': min(fam['dense'], layers), 'vocab_size': dims['vocab'],
        'feed_forward_length': dims['ff'], 'expert_feed_forward_length': dims['ff_exp'],
        'attention.layer_norm_rms_epsilon': None, 'expert_weights_scale': None,
        'expert_weights_norm': None, 'expert_gating_func': None,
    }
    if 'idx_heads' in fam:
        want.update({'attention.indexer.head_count': fam['idx_heads'],
                     'attention.indexer.key_length': fam['idx_dim'],
                     'attention.indexer.top_k': fam['idx_topk']})
    check(field(r0, 'general.architecture') == a, f'{name}: architecture')
    for k, v in want.items():
        got = field(r0, f'{a}.{k}')
        check(got is not None and (v is None or got == v), f'{name}: {a}.{k} = {got}, want {v}')

    # tokenizer
    toks = field(r0, 'tokenizer.ggml.tokens')
    merges = field(r0, 'tokenizer.ggml.merges')
    types = field(r0, 'tokenizer.ggml.token_type')
    check(field(r0, 'tokenizer.ggml.model') == 'gpt2', f'{name}: tokenizer model')
    check(field(r0, 'tokenizer.ggml.pre') == fam['pre'], f'{name}: pre-tokenizer')
    check(len(toks) == dims['vocab'] and len(types) == len(toks), f'{name}: {len(toks)} tokens')
    tset = set(toks)
    check(len(tset) == len(toks), f'{name}: tokens are unique')
    check(BYTES <= tset, f'{name}: every byte has a token')
    bad = [m for m in merges if len(m.split(' ')) != 2 or m.split(' ')[0] not in tset
           or m.split(' ')[1] not in tset or m.replace(' ', '') not in tset]
    check(not bad, f'{name}: merges join two tokens into a token ({bad[:3]})')
    check(len(merges) >= len(toks) - 300, f'{name}: {len(merges)} merges')
    for key in ('bos', 'eos'):
        i = field(r0, f'tokenizer.ggml.{key}_token_id')
        check(i is not None and 0 <= i < len(toks) and types[i] == 3, f'{name}: {key} token is a control token')
    check(isinstance(field(r0, 'tokenizer.chat_template'), str), f'{name}: chat template')

    # tensors: shapes from the published dims, every quant type dequantizes sanely
    tens = {t.name: t for r in readers for t in r.tensors}
    E, H = dims['hidden'], dims['heads']
    hk = fam['nope'] + fam['rope']
    shapes = {'token_embd.weight': (E, dims['vocab']), 'output.weight': (E, dims['vocab'])}
    for il in range(layers):
        b = f'blk.{il}.'
        if fam['q_lora']:
            shapes[b + 'attn_q_b.weight'] = (fam['q_lora'], H * hk)
        else:
            shapes[b + 'attn_q.weight'] = (E, H * hk)
        shapes[b + 'attn_kv_a_mqa.weight'] = (E, fam['kv_lora'] + fam['rope'])
        shapes[b + 'attn_k_b.weight'] = (fam['nope'], fam['kv_lora'], H)
        shapes[b + 'attn_v_b.weight'] = (fam['kv_lora'], fam['v'], H)
        shapes[b + 'attn_output.weight'] = (H * fam['v'], E)
        if il < fam['dense']:
            shapes[b + 'ffn_down.weight'] = (dims['ff'], E)
        else:
            shapes[b + 'ffn_down_exps.weight'] = (dims['ff_exp'], E, dims['experts'])
            shapes[b + 'ffn_up_shexp.weight'] = (E, dims['ff_exp'] * fam['shared'])
        if 'idx_heads' in fam:
            shapes[b + 'indexer.attn_q_b.weight'] = (fam['q_lora'], fam['idx_heads'] * fam['idx_dim'])
    for n, shp in shapes.items():
        t = tens.get(n)
        check(t is not None and tuple(int(x) for x in t.shape) == shp,
              f'{name}: {n} shape {None if t is None else list(t.shape)}, want {shp}')
    types_seen = {}
    for t in tens.values():
        types_seen.setdefault(t.tensor_type, t)
    check(tens['blk.0.attn_k_b.weight'].tensor_type == QT.Q8_0, f'{name}: attn_k_b is Q8_0')
    check(tens['token_embd.weight'].tensor_type == QT.Q6_K, f'{name}: token_embd is Q6_K')
    check(tens['blk.0.attn_norm.weight'].tensor_type == QT.F32, f'{name}: norms are F32')
    if layers > fam['dense']:
        b = f'blk.{fam["dense"]}.'
        check(tens[b + 'ffn_gate_exps.weight'].tensor_type == MIX_EXP[mix], f'{name}: experts are {mix}')
        check(tens[b + 'ffn_gate_inp.weight'].tensor_type == QT.F32, f'{name}: router is F32')
    for qt, t in types_seen.items():
        ne0 = int(t.shape[0])
        raw = np.asarray(t.data)
        if qt == QT.F32:
            x = raw.reshape(-1)[:65536].astype(np.float32)
            check(np.isfinite(x).all(), f'{name}: {t.name} F32 finite')
            continue
        row_bytes = raw.shape[-1] if raw.ndim > 1 else raw.size
        rows = raw.reshape(-1, row_bytes)[:64]
        x = dequantize(rows, qt)
        check(x.shape[-1] == ne0, f'{name}: {t.name} {qt.name} dequantizes to rows of {ne0}')
        ok = np.isfinite(x).all()
        check(ok, f'{name}: {t.name} {qt.name} finite')
        if ok:
            sd, ref = float(x.std()), 1.0 / np.sqrt(ne0)
            if t.name == 'token_embd.weight':
                ref = 1.0
            check(ref / 4 < sd < ref * 4, f'{name}: {t.name} {qt.name} std {sd:.4g} vs {ref:.4g}')
    print(f'{name}: types {sorted(q.name for q in types_seen)}', flush=True)


def run(args, **kw):
    return subprocess.run([exe] + args, capture_output=True, text=True, timeout=600, **kw)


for name, famkey, layers, mix, extra, dims in CASES:
    fam = FAM[famkey]
    out = os.path.join(work, name + '.gguf')
    p = run(['mkmodel', '--family', famkey, '--layers', str(layers), '--mix', mix, '-o', out] + extra)
    check(p.returncode == 0, f'{name}: mkmodel rc {p.returncode}: {p.stderr[-500:]}')
    if p.returncode:
        continue
    parts = sorted(glob.glob(os.path.join(work, name + '-0*-of-*.gguf'))) or [out]
    if '--split-size' in extra:
        check(len(parts) > 1, f'{name}: split into {len(parts)} parts')
    check_file(name, fam, layers, mix, dims, parts)
    for tp in ((1,) if name == 'v3vocab' else (1, 2, 4) if name == 'glm47flash' else (1, 2, 4, 8)):
        q = run(['inspect', parts[0], '--tp', str(tp)])
        check(q.returncode == 0, f'{name}: inspect --tp {tp} rc {q.returncode}: {q.stdout[-300:]} {q.stderr[-300:]}')
    if name == 'glm47flash':  # 20 heads do not split 8 ways: refused with the reason
        q = run(['inspect', parts[0], '--tp', '8'])
        check(q.returncode != 0 and 'does not divide the 20 attention heads' in q.stdout + q.stderr,
              f'{name}: --tp 8 refused: {q.stdout[-300:]}')
    ids = os.path.join(work, 'ids.txt')
    with open(ids, 'w') as f:
        f.write('0 300 301 302 1000\n')
    lo = os.path.join(work, name + '.f32')
    q = run(['logits', '-m', parts[0], '--tokens', ids, '--out', lo, '--threads', '2'])
    check(q.returncode == 0, f'{name}: logits rc {q.returncode}: {q.stderr[-500:]}')
    if q.returncode == 0:
        x = np.fromfile(lo, dtype=np.float32)
        check(x.size == 5 * dims['vocab'], f'{name}: {x.size} logits')
        check(np.isfinite(x).all(), f'{name}: logits finite')
        check(x.reshape(5, -1).std(axis=1).min() > 1e-3, f'{name}: logits not constant')
    if name == 'glm47flash':
        # end to end through the coordinator and a CPU worker: 6 greedy tokens from a text prompt
        q = run(['generate', '-m', parts[0], '-p', 'the quick brown fox', '-n', '6', '--backend', 'cpu'])
        check(q.returncode == 0 and q.stdout.strip() != '', f'{name}: generate rc {q.returncode}: {q.stderr[-500:]}')
    for fn in parts + [lo]:
        if os.path.exists(fn):
            os.remove(fn)

# the bytes depend on --seed, not on --threads
outs = []
for i, extra in enumerate((['--threads', '1'], ['--threads', '3'], ['--threads', '2', '--seed', '9'])):
    out = os.path.join(work, f'det{i}.gguf')
    p = run(['mkmodel', '--family', 'v2lite', '--layers', '2', '--small', '-o', out] + extra)
    check(p.returncode == 0, f'determinism run {i}: rc {p.returncode}')
    outs.append(open(out, 'rb').read() if p.returncode == 0 else b'')
    if os.path.exists(out):
        os.remove(out)
check(outs[0] == outs[1] and len(outs[0]) > 0, 'same bytes with 1 and 3 threads')
check(outs[0] != outs[2], 'another seed gives other bytes')

# bad input is refused with a message
p = run(['mkmodel', '--family', 'v4', '-o', os.path.join(work, 'x.gguf')])
check(p.returncode == 2 and 'unknown family' in p.stderr, 'unknown family refused')
p = run(['mkmodel', '--family', 'v3', '--hidden', '1000', '-o', os.path.join(work, 'x.gguf')])
check(p.returncode == 2 and 'multiple of 256' in p.stderr, 'unaligned hidden size refused')
p = run(['mkmodel', '--family', 'v3', '--dry-run'])
check(p.returncode == 0 and '61 layers' in p.stderr and 'vocab 129280' in p.stderr, 'real V3 shapes by default')
p = run(['mkmodel', '--family', 'glm5', '--dry-run'])
check(p.returncode == 0 and '78 layers' in p.stderr and 'hidden 6144' in p.stderr, 'real GLM-5 shapes by default')

p = run(['mkmodel', '--family', 'glm47flash', '--dry-run'])
check(p.returncode == 0 and all(w in p.stderr for w in ('deepseek2', '47 layers (1 dense)', 'hidden 2048', '20 heads',
                                                        'vocab 154880', '64 experts top-4')),
      f'real GLM-4.7-Flash shapes by default: {p.stderr[-300:]}')


def gib(args):
    q = run(['mkmodel', '--dry-run'] + args)
    try:
        return q.returncode, float(q.stderr.split(' GiB in ')[0].rsplit(' ', 1)[1]), q.stderr
    except (IndexError, ValueError):
        return q.returncode, None, q.stderr


# --experts cuts the routed experts at full depth: the file shrinks by the experts' share
for famkey, n_exp, layers, moe_layers, hidden, ff_exp in (('v3', 16, 61, 58, 7168, 2048),
                                                           ('glm5', 16, 78, 75, 6144, 2048)):
    rc0, full, _ = gib(['--family', famkey])
    rc1, cut, err = gib(['--family', famkey, '--experts', str(n_exp)])
    check(rc0 == 0 and rc1 == 0 and f'{layers} layers' in err and f'{n_exp} experts' in err,
          f'{famkey} --experts {n_exp}: {err[-300:]}')
    if full and cut:
        # Q4_K: 144 bytes a 256 weights; 3 matrices of hidden x ff_exp an expert and MoE layer
        dropped = (256 - n_exp) * moe_layers * 3 * hidden * ff_exp * 144 / 256 / 2 ** 30
        check(abs((full - cut) - dropped) < 0.02 * dropped, f'{famkey}: {full:.2f} - {cut:.2f} GiB, want {dropped:.2f} less')
p = run(['mkmodel', '--family', 'v3', '--experts', '8', '--dry-run'])
check(p.returncode == 2 and 'cannot serve top-8' in p.stderr, 'V3 with 8 experts refused (8 groups, 4 used, top-8)')

# the output is written whole or not at all: a run that fails keeps the file that was there; a
# path that is not a regular file (a link to /dev/full) is written in place and never removed
old = os.path.join(work, 'old.gguf')
with open(old, 'wb') as f:
    f.write(b'the previous file')
full = os.path.join(work, 'full.gguf')
os.symlink('/dev/full', full)
p = run(['mkmodel', '--family', 'v3', '--small', '--layers', '2', '-o', full])
check(p.returncode == 1 and 'write failed' in p.stderr and os.path.islink(full) and os.path.exists('/dev/full'),
      'a write that fails on a device: refused, the device and the link kept', p.stderr[-300:])
q = subprocess.Popen([exe, 'mkmodel', '--family', 'v3', '--small', '-o', old, '--threads', '1'],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
part = lambda: glob.glob(old + '.partial-*')  # noqa: E731
for _ in range(200):  # until its temporary file holds data
    if part() and os.path.getsize(part()[0]) > 0:
        break
    time.sleep(0.02)
q.terminate()
q.wait()
check(open(old, 'rb').read() == b'the previous file' and not part(),
      'a run ended by SIGTERM: the previous file kept, no partial file left', (q.returncode, part()))

shutil.rmtree(work, ignore_errors=True)
finish()
