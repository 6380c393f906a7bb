"""`mlaserve mkmodel --rank-of N`: what one rank of a TP-N deployment holds, as a TP-1 model.

For small V3 and GLM-5 files (2 and 4 layers: dense only, and with a MoE layer):
- the rank file's bytes equal what `mlaserve inspect --tp N` of the whole file (same options,
  no --rank-of) says rank 0 holds (common/shard_plan.c, our tensor parallelism), less the two
  documented differences: the router keeps only the rank's experts' rows, and the token
  embedding shrinks with the output head's vocabulary share;
- gguf-py (not our reader) sees the divided heads, experts, top-k and vocabulary;
- `mlaserve bench --backend cpu` serves it at TP 1: a finite batch-1 decode step;
- a rank count that does not divide the heads is refused (exit status 2).
At the real widths, the dry run's shapes are the published config's divided by 8.
usage: check_rank_of.py MLASERVE WORKDIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

from gguf import GGUFReader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
from mlatest import FAILS, check, finish  # noqa: E402

exe, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
N = 8


def run(args):
    return subprocess.run([exe] + args, capture_output=True, text=True, timeout=240)


def inspect(path, tp):
    q = run(['inspect', path, '--tp', str(tp), '--json'])
    check(q.returncode == 0, f'inspect {path} --tp {tp}: {q.stderr[-300:]}')
    return json.loads(q.stdout)


# the last case's shared expert (2048 wide) is divided (256 a rank, whole quant blocks): the file then
# says its width (expert_shared_feed_forward_length), which the loader must honour
for fam, layers, extra in (('v3', 2, []), ('v3', 4, []), ('glm5', 4, []), ('v3', 4, ['--ff-exp', '2048'])):
    name = f'{fam}-{layers}l' + ('-ffe' if extra else '')
    full, rank = f'{work}/{name}-full.gguf', f'{work}/{name}-rank.gguf'
    base = ['mkmodel', '--family', fam, '--small', '--layers', str(layers), '--split-size', '0', '--threads', '2'] + extra
    q = run(base + ['-o', full])
    check(q.returncode == 0, f'{name}: mkmodel whole: {q.stderr[-300:]}')
    q = run(base + ['--rank-of', str(N), '-o', rank])
    check(q.returncode == 0, f'{name}: mkmodel --rank-of: {q.stderr[-300:]}')
    if FAILS:
        break
    jf, jr = inspect(full, N), inspect(rank, 1)
    role = {r['role']: r['bytes'] for r in jf['tensors_by_role']}
    hp = jf['hyperparameters']
    X, V = hp.get('n_expert', 0), hp['n_vocab']
    Xr = (X + N - 1) // N
    Vr = V // N if V % N == 0 else V
    want = jf['tensor_parallel']['bytes_per_rank'][0]
    want -= (role.get('router', 0) + role.get('router bias', 0)) * (X - Xr) // max(X, 1)
    want -= role['token embedding'] * (V - Vr) // V
    got = jr['tensor_parallel']['bytes_per_rank'][0]
    print(f"{name}: rank file {got} B, rank 0 of TP {N} {want} B", flush=True)
    check(got == want, f'{name}: rank file {got} bytes, rank 0 of TP {N} holds {want} (router, embedding adjusted)')
    r = GGUFReader(rank)
    a = r.fields['general.architecture'].contents()
    f = lambda k: r.fields[f'{a}.{k}'].contents()
    check(f('attention.head_count') == 16 // N, f'{name}: heads {f("attention.head_count")}')
    check(f('expert_count') == Xr, f'{name}: experts {f("expert_count")}')
    check(f('expert_used_count') == 1, f'{name}: top-k {f("expert_used_count")}')
    check(f('vocab_size') == Vr, f'{name}: vocab {f("vocab_size")}')
    check(len(r.fields['tokenizer.ggml.tokens'].contents()) == Vr, f'{name}: tokens')
    shk = f'{a}.expert_shared_feed_forward_length'
    if extra:
        check(shk in r.fields and r.fields[shk].contents() == 2048 // N, f'{name}: shared expert width in the file')
    else:
        check(shk not in r.fields, f'{name}: shared expert whole, no width key')
    out = f'{work}/{name}-bench.json'
    q = run(['bench', '-m', rank, '--backend', 'cpu', '--threads', '2', '--prefill', 'none', '--batch', '1',
             '--ctx', '32', '--steps', '2', '--warmup', '1', '--repeat', '1', '--json', out])
    check(q.returncode == 0, f'{name}: bench rc {q.returncode}: {q.stderr[-500:]}')
    if q.returncode == 0:
        rows = [x for x in json.load(open(out))['rows'] if x['phase'] == 'decode']
        check(len(rows) == 1 and rows[0]['ms_mean'] and math.isfinite(rows[0]['ms_mean']) and rows[0]['ms_mean'] > 0
              and rows[0]['mb_per_step_rank'] > 0, f'{name}: bench decode row {rows}')
    for p in (full, rank, out):
        if os.path.exists(p):
            os.remove(p)

q = run(['mkmodel', '--family', 'v3', '--small', '--rank-of', '3', '-o', f'{work}/x.gguf'])
check(q.returncode == 2 and 'does not divide' in q.stderr, f'--rank-of 3: rc {q.returncode} {q.stderr[-200:]}')

# the real widths, divided by 8 (published configs: V3 128 heads, q_lora 1536, nope 128 + rope 64,
# v 128, FFN 18432, shared 2048, 256 experts top-8, vocab 129280; GLM-5 64 heads, q_lora 2048,
# nope 192 + rope 64, v 256, FFN 12288, shared 2048, vocab 154880)
for fam, hid, heads, qlora, hk, v, ff, vocab in (('v3', 7168, 128, 1536, 192, 128, 18432, 129280),
                                                 ('glm5', 6144, 64, 2048, 256, 256, 12288, 154880)):
    q = run(['mkmodel', '--family', fam, '--rank-of', str(N), '--dry-run'])
    check(q.returncode == 0, f'{fam} dry run: {q.stderr[-300:]}')
    shp = {}
    for line in q.stdout.splitlines():
        w = line.split()
        dims = line[line.index('[') + 1:line.index(']')].split(',')
        shp[w[0]] = tuple(int(d) for d in dims)
    h = heads // N
    want = {'blk.0.attn_q_b.weight': (qlora, h * hk, 1), 'blk.0.attn_output.weight': (h * v, hid, 1),
            'blk.0.attn_k_b.weight': (hk - 64, 512, h), 'blk.0.ffn_gate.weight': (hid, ff // N, 1),
            'blk.0.ffn_down.weight': (ff // N, hid, 1), 'blk.3.ffn_gate_exps.weight': (hid, 2048, 256 // N),
            'blk.3.ffn_gate_inp.weight': (hid, 256 // N, 1), 'blk.3.ffn_up_shexp.weight': (hid, 2048 // N, 1),
            'output.weight': (hid, vocab // N, 1), 'blk.0.attn_q_a.weight': (hid, qlora, 1)}
    for k, s in want.items():
        check(shp.get(k) == s, f'{fam} --rank-of {N}: {k} {shp.get(k)}, want {s}')

finish('check_rank_of: ')
