#!/usr/bin/env python3
"""Where one decode step's time goes, from Nsight Compute's CSV of kernel durations
(ncu --csv --metrics gpu__time_duration.sum ... mla-e2e logits ... --greedy N, graphs off).
A step starts at the embedding gather (get_rows_kernel); the last complete step is summed by
kernel name (and launch shape).
Usage: ncu_step.py NCU.csv [--step K] [--families] [--stalls] [--json OUT.json]
       ncu_step.py --stall-metrics   (prints the metrics --stalls reads, for ncu's --metrics)
  --step K     the K-th step from the end (default 1)
  --to-end     the run's last step ends with the CSV (a run of one prompt step, no decode after it)
  --families   a table by kernel family first (see FAMILIES), then the one by kernel
  --stalls     also what the warps waited on, from the CSV's warp-state metrics
               (smsp__warp_issue_stalled_REASON_per_warp_active.pct; STALL_METRICS lists the ones
               asked for): by family and by kernel, each reason's share of the active warp cycles
               (weighted by duration), and "fetch us", the duration times the no_instruction share
               (waiting on an instruction fetch: code run cold)
  --bytes      also the DRAM bytes each family and kernel moved and their rate (MB, GB/s: over
               its own time), from the CSV's dram__bytes_read.sum and dram__bytes_write.sum rows
  --json F     also write {"step_us", "kernels": [...], "families": [...]} to F (with --stalls
               each entry has "stalls": {reason: percent}; with --bytes "mb")
Kernel names are matched against FAMILIES in order, the first match wins; a kernel no pattern
matches is counted under "other" and listed in the JSON's "unmatched"."""
import collections
import csv
import json
import re
import sys

# (family, regex on the kernel name without namespace and template arguments). The weight
# products come first: the quantized GEMV / tensor-core matmuls of the dense weights, the grouped
# ones of the routed experts (the streamed GEMVs' last template argument GRP = true, which Nsight
# Compute may print as 1; gemvm_grp_kernel the tensor-core one's), the per-head
# products of the absorbed k_b / v_b. The names are matched with their template arguments
# ("gemvs_kernel<12, 1, true>"); wg_mm (the wgmma path, dense and experts alike) counts as dense.
FAMILIES = [
    ("matmul: experts (grouped)", r"(_grp_kernel(<.*>)?$|^gemv[sw]_kernel<.*(true|\(bool\)1|, 1)>$)"),
    ("matmul: absorbed k_b/v_b (per head)", r"^(head_(gemv|matmul|mma)|hwg_kernel)"),
    ("matmul: dense weights", r"^(gemv|gemvq|gemvf|gemvm|gemvs|gemvw|gemv2|mma|mmaq|mmh|mh_sum|wg_mm|narrow)_kernel|gemm|cublas|cutlass|sm90_xmma"),
    ("activation quantization", r"^q8x"),
    # pf_: the prompt attention, its K/V decompression (pf_up_kernel, uwg_kernel: per-head matmuls) included
    ("attention", r"^(mla_attn|mla_kv_rows|attn|awg|pf_|pwg|uwg|dsa_|dsw|flash)"),
    ("norms", r"(rmsnorm|layernorm|qnorm)"),
    ("MoE routing", r"^(route|moe_plan|moe_combine|top_k|topk)"),
    ("all-reduce", r"(nccl|allreduce|all_reduce|reduce_scatter|allgather)"),
    ("embedding and sampling", r"^(get_rows|argmax|sample|samp)"),
    ("elementwise (rope, activation, add)", r"^(rope|swiglu|act_h|add|scale|scatter_rows|dequant)"),
]


# the warp-state metrics that --stalls reads (pass them to ncu's --metrics; the reasons of the
# WarpStateStats section that a latency-bound kernel of this code spends its cycles in)
STALL_REASONS = ["no_instruction", "long_scoreboard", "barrier", "membar", "wait", "sleeping", "short_scoreboard",
                 "math_pipe_throttle", "lg_throttle", "mio_throttle", "branch_resolving", "dispatch_stall",
                 "drain", "not_selected", "selected"]
STALL_METRICS = ",".join(f"smsp__warp_issue_stalled_{r}_per_warp_active.pct" for r in STALL_REASONS)
STALL_RX = re.compile(r"^smsp__warp_issue_stalled_(\w+)_per_warp_active\.pct$")
# the DRAM traffic that --bytes reads
BYTE_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def family_of(name):
    for fam, rx in FAMILIES:
        if re.search(rx, name):
            return fam
    return "other"


def load(path):
    """[(ID, kernel with launch shape, short name, us)] in launch order, {ID: {reason: percent}}
    and {ID: DRAM bytes}"""
    rows, stalls, nbytes = [], collections.defaultdict(dict), collections.Counter()
    with open(path, newline='') as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own log lines before the CSV
    for r in csv.DictReader(lines):
        m = STALL_RX.match(r.get('Metric Name') or '')
        if m:
            stalls[int(r['ID'])][m.group(1)] = float(r['Metric Value'].replace(',', ''))
            continue
        if r.get('Metric Name') in BYTE_METRICS:
            unit = r.get('Metric Unit', 'byte')
            if unit not in BYTE_UNITS:
                sys.exit(f'ncu_step: unknown unit {unit!r} of {r["Metric Name"]}')
            nbytes[int(r['ID'])] += float(r['Metric Value'].replace(',', '')) * BYTE_UNITS[unit]
            continue
        if r.get('Metric Name') != 'gpu__time_duration.sum':
            continue
        unit = r.get('Metric Unit', 'nsecond')
        v = float(r['Metric Value'].replace(',', ''))
        v *= {'nsecond': 1e-3, 'usecond': 1.0, 'msecond': 1e3, 'second': 1e6}.get(unit, 1e-3)
        full = r['Kernel Name'].replace('(anonymous namespace)::', '').replace('<unnamed>::', '').replace('void ', '')
        base = full.split('(')[0].split('<')[0].strip()
        short = full.split('(')[0].strip().split('::', 1)[-1] if full.split('(')[0].count('<') else base.split('::')[-1]
        short = re.sub(r'^[A-Za-z_0-9]+::', '', short)
        rows.append((int(r['ID']), base + f" {r.get('Grid Size', '')}x{r.get('Block Size', '')}", short, v))
    rows.sort()
    return rows, stalls, nbytes


def stall_mean(launches, stalls):
    """the duration-weighted mean percent of each reason over launches [(ID, us)]"""
    tot, acc = 0.0, collections.Counter()
    for i, us in launches:
        if i in stalls:
            tot += us
            for k, v in stalls[i].items():
                acc[k] += v * us
    return {k: v / tot for k, v in acc.items()} if tot > 0 else {}


def stall_table(title, groups, stalls):
    """groups: [(name, [(ID, us)])], largest first"""
    print(f'| {title} | us | no_instruction | fetch us | other reasons over 5% |\n|---|---|---|---|---|')
    for name, ls in groups:
        m = stall_mean(ls, stalls)
        if not m:
            continue
        us = sum(u for _, u in ls)
        ni = m.get('no_instruction', 0.0)
        rest = ', '.join(f'{k} {v:.0f}%' for k, v in sorted(m.items(), key=lambda kv: -kv[1])
                         if k != 'no_instruction' and v >= 5)
        print(f'| {name} | {us:.1f} | {ni:.1f}% | {us * ni / 100:.1f} | {rest} |')
    print()


def main():
    args = sys.argv[1:]
    if args == ['--stall-metrics']:
        print(STALL_METRICS)
        return
    if not args or args[0].startswith('-'):
        sys.exit(__doc__)
    path = args[0]
    back = int(args[args.index('--step') + 1]) if '--step' in args else 1
    out_json = args[args.index('--json') + 1] if '--json' in args else None
    rows, stalls, nbytes = load(path)
    want_stalls, want_bytes = '--stalls' in args, '--bytes' in args
    if want_bytes and not nbytes:
        sys.exit(f'ncu_step: --bytes: no {" / ".join(BYTE_METRICS)} rows in {path}')
    if want_stalls and not stalls:
        sys.exit(f'ncu_step: --stalls: no smsp__warp_issue_stalled_*_per_warp_active.pct rows in {path}')
    starts = [i for i, (_, k, _s, _) in enumerate(rows) if _s.startswith('get_rows')]
    if '--to-end' in args and starts:
        starts.append(len(rows))
    if len(starts) < back + 1:
        sys.exit(f'ncu_step: {len(starts)} steps found in {path}, need {back + 1}')
    a, b = starts[-back - 1], starts[-back]
    step = rows[a:b]
    tot, cnt, kby = collections.Counter(), collections.Counter(), collections.Counter()
    ftot, fcnt, fby = collections.Counter(), collections.Counter(), collections.Counter()
    kl, fl = collections.defaultdict(list), collections.defaultdict(list)  # (ID, us) of each launch
    unmatched = set()
    for i, k, short, us in step:
        tot[k] += us
        cnt[k] += 1
        fam = family_of(short)
        ftot[fam] += us
        fcnt[fam] += 1
        kby[k] += nbytes.get(i, 0.0)
        fby[fam] += nbytes.get(i, 0.0)
        kl[k].append((i, us))
        fl[fam].append((i, us))
        if fam == "other":
            unmatched.add(short)
    s = sum(tot.values())

    def by(nb, us):  # the --bytes columns of nb bytes over us: MB moved, GB/s
        if not want_bytes:
            return ''
        return f' {nb / 1e6:.1f} | {1e-3 * nb / us if us > 0 else 0:.0f} |'
    bh, bd = (' MB | GB/s |', '---|---|') if want_bytes else ('', '')
    if '--families' in args:
        print(f'| family | launches | us | share |{bh}\n|---|---|---|---|{bd}')
        for fam, us in ftot.most_common():
            print(f'| {fam} | {fcnt[fam]} | {us:.1f} | {100 * us / s:.1f}% |{by(fby[fam], us)}')
        print(f'| total | {b - a} | {s:.1f} | 100% |{by(sum(fby.values()), s)}\n')
    if want_stalls:
        if '--families' in args:
            stall_table('family', [(f, fl[f]) for f, _ in ftot.most_common()], stalls)
        stall_table('kernel', [(k, kl[k]) for k, _ in tot.most_common()], stalls)
    print(f'| kernel | launches | us | share |{bh}\n|---|---|---|---|{bd}')
    for k, us in tot.most_common():
        print(f'| {k} | {cnt[k]} | {us:.1f} | {100 * us / s:.1f}% |{by(kby[k], us)}')
    print(f'| total (kernels {a}..{b - 1}) | {b - a} | {s:.1f} | 100% |{by(sum(kby.values()), s)}')
    if out_json:
        with open(out_json, 'w') as f:
            def entry(d, ls):
                if want_stalls:
                    d["stalls"] = stall_mean(ls, stalls)
                if want_bytes:
                    d["mb"] = sum(nbytes.get(i, 0.0) for i, _ in ls) / 1e6
                return d
            json.dump({"csv": path, "step_from_end": back, "first_kernel": a, "launches": b - a, "step_us": s,
                       "families": [entry({"family": k, "launches": fcnt[k], "us": v, "share": v / s}, fl[k])
                                    for k, v in ftot.most_common()],
                       "kernels": [entry({"kernel": k, "launches": cnt[k], "us": v, "share": v / s}, kl[k])
                                   for k, v in tot.most_common()],
                       "unmatched": sorted(unmatched)}, f, indent=1)


if __name__ == '__main__':
    main()
