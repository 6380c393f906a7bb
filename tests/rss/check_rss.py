"""Each worker of a tensor-parallel group holds in its own memory only its shard of the model.

With N > 1 ranks a worker copies its bytes of every split tensor into private (anonymous)
memory and keeps the replicated tensors (norms, q_a, kv_a, router, embeddings, indexer) as
views into the shared mapping of the file; one rank alone keeps views of everything. So the
private memory a TP-N worker holds beyond a TP-1 worker of the same model (same runtime, same
cache pool) is its copies: at most its shard less the replicated tensors, plus page rounding.

The test starts `mlaserve serve --tp 1`, then `--tp N`, runs one completion on each (so every
layer of every rank has run) and reads each worker's anonymous memory (/proc/PID/smaps_rollup,
Anonymous: private pages, whatever the page cache holds). Each TP-N worker must hold at most its
copies beyond the TP-1 worker, and at least half of them (the copies are really made).

Pages of the file mapping are printed for the record, not checked: how many the kernel maps
around each fault depends on the page cache (the folio sizes it holds the file in: a file just
written in large writes is mapped a whole large folio at a time), and they are shared page
cache, not the worker's memory. usage: check_rss.py MLASERVE MODEL TP
"""
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
from mlatest import ServeProcess, check, finish  # noqa: E402

exe, model, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
real = os.path.realpath(model)
page = os.sysconf('SC_PAGE_SIZE')

info = json.loads(subprocess.run([exe, 'inspect', model, '--tp', str(tp), '--json'],
                                 capture_output=True, text=True, check=True).stdout)
per_rank = info['tensor_parallel']['bytes_per_rank']
file_bytes = info['file_bytes']
from gguf import GGUFReader  # noqa: E402
rd = GGUFReader(model)
SPLIT = ('attn_q_b', 'attn_k_b', 'attn_v_b', 'attn_kv_b', 'attn_output', 'ffn_gate', 'ffn_up', 'ffn_down',
         'output.weight', 'attn_q.weight')
replicated = sum(int(t.n_bytes) for t in rd.tensors
                 if '.indexer.' in t.name or 'ffn_gate_inp' in t.name or not any(x in t.name for x in SPLIT))
n_split = sum(1 for t in rd.tensors if int(t.n_bytes) and not (
    '.indexer.' in t.name or 'ffn_gate_inp' in t.name or not any(x in t.name for x in SPLIT)))
MIB = 2**20


def anonymous(pid):
    for line in open(f'/proc/{pid}/smaps_rollup'):
        if line.startswith('Anonymous:'):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f'no Anonymous in /proc/{pid}/smaps_rollup')


def file_resident(pid):
    """Rss of the mappings of the model file (for the record)."""
    total, on = 0, False
    with open(f'/proc/{pid}/smaps') as f:
        for line in f:
            parts = line.split()
            if parts and '-' in parts[0] and len(parts) >= 5 and all(c in '0123456789abcdef-' for c in parts[0]):
                on = len(parts) >= 6 and os.path.realpath(parts[-1]) == real
            elif on and line.startswith('Rss:'):
                total += int(parts[1]) * 1024
    return total


def workers(n):
    """{rank: (anonymous bytes, file resident bytes)} of the workers of `serve --tp n`, after a completion."""
    srv = ServeProcess([exe, 'serve', '-m', model, '--tp', str(n), '--port', '0'], timeout=60, poll=0.1,
                       prefix='rss_', fail_tail=2000)
    try:
        req = urllib.request.Request(f'http://127.0.0.1:{srv.port}/v1/completions',
                                     data=json.dumps({'prompt': '1 2 3 4 5 6', 'max_tokens': 4}).encode(),
                                     headers={'Content-Type': 'application/json'})
        body = json.load(urllib.request.urlopen(req, timeout=120))
        check(bool(body['choices'][0]['text']), f'tp {n}: the completion has text', body)
        out = {}
        for p in subprocess.run(['pgrep', '-P', str(srv.proc.pid)], capture_output=True, text=True).stdout.split():
            cmd = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\0')
            if not any(b'mlaserve-worker' in c for c in cmd):
                continue
            rank = int(cmd[cmd.index(b'--rank') + 1]) if b'--rank' in cmd else 0
            out[rank] = (anonymous(p), file_resident(p))
        check(sorted(out) == list(range(n)), f'tp {n}: one worker per rank', sorted(out))
        return out
    finally:
        srv.stop(timeout=20)


base = workers(1)
group = workers(tp)
base_anon = base[0][0] if 0 in base else 0
print(f'tp 1 worker: anonymous {base_anon / MIB:.2f} MiB, model file mapped {base.get(0, (0, 0))[1] / MIB:.2f} MiB')
slack = 2 * page * n_split + page  # each private copy rounded to pages at both ends
for rank in sorted(group):
    anon, mapped = group[rank]
    copies = per_rank[rank] - replicated  # what this rank copies: its shard less the replicated tensors
    extra = anon - base_anon
    print(f'tp {tp} rank {rank}: anonymous {anon / MIB:.2f} MiB, {extra / MIB:.2f} MiB beyond tp 1 '
          f'(its copies {copies / MIB:.2f} MiB; shard {per_rank[rank] / MIB:.2f} MiB, replicated '
          f'{replicated / MIB:.2f} MiB, file {file_bytes / MIB:.2f} MiB); model file mapped {mapped / MIB:.2f} MiB')
    check(extra <= copies + slack, f'rank {rank}: private memory beyond tp 1 at most its copies',
          f'{extra / MIB:.2f} MiB > {(copies + slack) / MIB:.2f} MiB')
    check(extra >= copies / 2, f'rank {rank}: its copies are in private memory',
          f'{extra / MIB:.2f} MiB < half of {copies / MIB:.2f} MiB')
finish()
