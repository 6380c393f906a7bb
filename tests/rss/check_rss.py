"""Each worker touches only its shard of the GGUF file (issue: "Each worker reads only its slice").

Starts `mlaserve serve --tp N` on a fixture, runs one completion (so every layer of every rank
has run), then reads, for every mlaserve-worker process, the resident set of its mapping of the
model file (/proc/PID/smaps, Rss of the mappings of that path). With N > 1 a worker copies its
bytes of every split tensor into private memory and drops their pages, so what stays resident of
the file is at most the replicated tensors (norms, q_a, kv_a, router, embeddings, indexer) plus
page rounding and the metadata pages; and it must stay under what `mlaserve inspect --tp N
--json` says the rank holds. Prints VmRSS too, for the record (not checked: sanitizers inflate it).
usage: check_rss.py MLASERVE MODEL TP
"""
import json
import os
import subprocess
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'lib'))
from mlatest import ServeProcess  # noqa: E402

exe, model, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
real = os.path.realpath(model)
page = os.sysconf('SC_PAGE_SIZE')

info = json.loads(subprocess.run([exe, 'inspect', model, '--tp', str(tp), '--json'],
                                 capture_output=True, text=True, check=True).stdout)
per_rank = info['tensor_parallel']['bytes_per_rank']
n_tensors = sum(r['count'] for r in info['tensors_by_role'])
file_bytes = info['file_bytes']
# The data section starts after the metadata; those pages are read by every process.
from gguf import GGUFReader  # noqa: E402
rd = GGUFReader(model)
meta_bytes = int(rd.data_offset)
SPLIT = ('attn_q_b', 'attn_k_b', 'attn_v_b', 'attn_kv_b', 'attn_output', 'ffn_gate', 'ffn_up', 'ffn_down',
         'output.weight', 'attn_q.weight')
replicated = sum(int(t.n_bytes) for t in rd.tensors
                 if '.indexer.' in t.name or 'ffn_gate_inp' in t.name or not any(x in t.name for x in SPLIT))

def rss_of_mapping(pid):
    total, on = 0, False
    with open(f'/proc/{pid}/smaps') as f:
        for line in f:
            parts = line.split()
            if parts and '-' in parts[0] and len(parts) >= 5 and all(c in '0123456789abcdef-' for c in parts[0]):
                on = len(parts) >= 6 and os.path.realpath(parts[-1]) == real
            elif on and line.startswith('Rss:'):
                total += int(parts[1]) * 1024
    return total

def worker_pids(parent):
    out = subprocess.run(['pgrep', '-P', str(parent)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if 'mlaserve-worker' in open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace')]

srv = ServeProcess([exe, 'serve', '-m', model, '--tp', str(tp), '--port', '0'], timeout=30, poll=0.1,
                   prefix='rss_', fail_tail=2000)
try:
    port = srv.port
    req = urllib.request.Request(f'http://127.0.0.1:{port}/v1/completions',
                                 data=json.dumps({'prompt': '1 2 3 4 5 6', 'max_tokens': 4}).encode(),
                                 headers={'Content-Type': 'application/json'})
    body = json.load(urllib.request.urlopen(req, timeout=120))
    assert body['choices'][0]['text'], body
    pids = worker_pids(srv.proc.pid)
    failures = 0
    if len(pids) != tp:
        print(f'FAIL: found {len(pids)} worker processes, want {tp}')
        failures += 1
    slack = 2 * page * n_tensors + meta_bytes + page
    for pid in pids:
        rss = rss_of_mapping(pid)
        rank = None
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\0')
        if b'--rank' in cmd:
            rank = int(cmd[cmd.index(b'--rank') + 1])
        want = per_rank[rank if rank is not None else 0]
        vmrss = [int(x.split()[1]) * 1024 for x in open(f'/proc/{pid}/status') if x.startswith('VmRSS:')][0]
        ok = rss <= min(want, replicated) + slack
        print(f'worker pid {pid} rank {rank}: model file resident {rss / 2**20:.2f} MiB '
              f'(replicated tensors {replicated / 2**20:.2f} MiB, rank shard {want / 2**20:.2f} MiB, '
              f'file {file_bytes / 2**20:.2f} MiB), VmRSS {vmrss / 2**20:.1f} MiB: {"ok" if ok else "FAIL"}')
        failures += not ok
finally:
    srv.stop(timeout=20)
print(f'{tp - failures if failures <= tp else 0} passed, {failures} failed')
sys.exit(1 if failures else 0)
