#!/usr/bin/env python3
"""Where a decode step's time goes in the running chain of kernels, from the step trace of a
diagnostic build (cmake -DMLA_CUDA_STEPTRACE=ON; run with MLA_CUDA_STEPTRACE=PREFIX and
MLA_CUDA_GRAPHS=0, so that every launch goes through mlacu_launch and is logged).

PREFIX.host.csv lists the launches in order; PREFIX.dev.csv has a record a block: its launch
(%gridid), the global clock as it entered the wait on the kernel before and as that wait returned.
Launches are matched to grids in the order of their ids, and every launch's record count must
equal its block count; where the device buffer filled (MLA_CUDA_STEPTRACE_RECORDS, 2M records by
default: a long prompt's step takes many), the launches before the first one stamped in part are
read. A kernel's share of the step is the time from its wait's release to the
release of the next kernel's on the same stream (its own work and the boundary after it). Marks
(MLACU_TRACE_MARK, tag > 0, with the SM clock): 1 a block's thread 0 is done (the streamed GEMV,
the norm, the attention), 3 the attention's queries staged, 4 one of its key tiles done.

Each record costs its thread an atomic's round trip (about a microsecond) on the kernel's path:
the trace shows where time goes and in what order, not what a step takes untraced; a kernel's
in-chain cost is what the step loses with it (ablations of 2026-11-30).

Usage: steptrace.py PREFIX [--step K] (K-th complete step from the end, default 1) [--list]"""
import collections
import csv
import re
import sys


def short(name):
    """the innermost identifier of a mangled name (_ZN...<len><id>I... -> id), else the name"""
    if not name.startswith('_Z'):
        return name
    s = name[3:] if name.startswith('_ZN') else name[2:]
    parts, i = [], 0
    while i < len(s) and s[i].isdigit():
        j = i
        while s[j].isdigit():
            j += 1
        parts.append(s[j:j + int(s[i:j])])
        i = j + int(s[i:j])
    return parts[-1] if parts else name


def clock_ghz(blocks):
    """the SM clock rate over each block's marks (cycles / ns), median over blocks; None if none"""
    v = []
    for ms in blocks.values():
        ms.sort()
        if len(ms) > 1 and ms[-1][0] > ms[0][0] and ms[-1][1] > ms[0][1]:
            v.append((ms[-1][1] - ms[0][1]) / (ms[-1][0] - ms[0][0]))
    v.sort()
    return v[len(v) // 2] if v else None


def main():
    pre = sys.argv[1]
    back = int(sys.argv[sys.argv.index('--step') + 1]) if '--step' in sys.argv else 1
    with open(pre + '.host.csv', newline='') as f:
        host = list(csv.DictReader(f))
    recs = collections.defaultdict(list)
    marks = collections.defaultdict(lambda: collections.defaultdict(list))  # grid -> tag -> [(block, t)]
    clk = collections.defaultdict(dict)  # grid -> block -> [(time, SM clock)] of its marks
    with open(pre + '.dev.csv', newline='') as f:
        for r in csv.DictReader(f):
            tag = int(r.get('tag', 0))
            if tag:
                marks[int(r['grid'])][tag].append((int(r['block']), int(r['t_out'])))
                clk[int(r['grid'])].setdefault(int(r['block']), []).append((int(r['t_out']), int(r['t_in'])))
            else:
                recs[int(r['grid'])].append((int(r['t_in']), int(r['t_out']), int(r['block'])))
    grids = sorted(recs)
    if len(grids) > len(host):
        sys.exit(f'steptrace: {len(host)} launches logged, {len(grids)} grids stamped')
    bad = [i for i, (h, g) in enumerate(zip(host, grids)) if int(h['grid']) != len(recs[g])]
    if len(grids) < len(host):  # the buffer filled (MLA_CUDA_STEPTRACE_RECORDS): the launches stamped whole
        keep = bad[0] if bad else len(grids)
        print(f'steptrace: {len(host)} launches logged, {len(grids)} grids stamped (the buffer filled): '
              f'reading the first {keep}', file=sys.stderr)
        host, grids, bad = host[:keep], grids[:keep], []
    if bad:
        sys.exit(f'steptrace: {len(bad)} launches whose block count differs from their records, first {bad[0]}')
    rows = []
    for h, g in zip(host, grids):
        r = recs[g]
        rows.append(dict(name=short(h['name']), grid=int(h['grid']), st=h['stream'], t_in=min(x[0] for x in r),
                         rel=min(x[1] for x in r), rel_max=max(x[1] for x in r), marks=marks.get(g, {}), clk=clock_ghz(clk.get(g, {})),
                         blk_rel={x[2]: x[1] for x in r}))
    starts = [i for i, r in enumerate(rows) if 'get_rows' in r['name']]
    if len(starts) < back + 1:
        sys.exit(f'steptrace: {len(starts)} steps found, need {back + 1}')
    a, b = starts[-back - 1], starts[-back]
    step = rows[a:b + 1]
    t0 = step[0]['rel']
    span = []
    for i, r in enumerate(step[:-1]):
        nxt = next((x for x in step[i + 1:] if x['st'] == r['st']), step[-1])
        span.append(nxt['rel'] - r['rel'])
    if '--list' in sys.argv:
        print('| # | kernel | blocks | first block in | wait released (first / last) | thread 0 done (median / last) '
              '| to the next release | span |\n|---|---|---:|---:|---:|---:|---:|---:|')
        for i, r in enumerate(step[:-1]):
            done, gap = '', ''
            if 1 in r['marks']:
                ts = sorted(t for _, t in r['marks'][1])
                done = f"{(ts[len(ts) // 2] - t0) / 1e3:.1f} / {(ts[-1] - t0) / 1e3:.1f}"
                gap = f"{(r['rel'] + span[i] - ts[-1]) / 1e3:.1f}"
            print(f"| {i} | {r['name']} | {r['grid']} | {(r['t_in'] - t0) / 1e3:.1f} | "
                  f"{(r['rel'] - t0) / 1e3:.1f} / {(r['rel_max'] - t0) / 1e3:.1f} | {done} | {gap} | {span[i] / 1e3:.1f} |")
        # the attention's blocks: queries staged (tag 3), each key tile done (tag 4), done (tag 1),
        # us after the block's own wait returned, medians over blocks
        for i, r in enumerate(step[:-1]):
            m = r['marks']
            if 3 not in m or 1 not in m:
                continue
            by = collections.defaultdict(list)
            for blk, t in m.get(4, []):
                by[blk].append(t)
            q = sorted((t - r['blk_rel'][blk]) / 1e3 for blk, t in m[3] if blk in r['blk_rel'])
            e = sorted((t - r['blk_rel'][blk]) / 1e3 for blk, t in m[1] if blk in r['blk_rel'])
            tiles = sorted(len(v) for v in by.values())
            per = sorted((max(v) - min(v)) / 1e3 / (len(v) - 1) for v in by.values() if len(v) > 1)
            med = lambda v: v[len(v) // 2] if v else float('nan')
            print(f"\n{r['name']} #{i}: after its wait, queries staged {med(q):.1f} us, done {med(e):.1f} "
                  f"(last {max(e):.1f}); tiles a block {med(tiles)}, {med(per):.2f} us a tile after the first")
            ck = r['clk']
            if ck is not None:
                print(f"  SM clock between the first and the last mark: {ck:.2f} GHz")
    tot, cnt = collections.Counter(), collections.Counter()
    main_st = step[0]['st']
    for r, s in zip(step[:-1], span):
        if r['st'] == main_st:
            tot[r['name']] += s / 1e3
            cnt[r['name']] += 1
    whole = (step[-1]['rel'] - t0) / 1e3
    print(f'\n| kernel (main stream) | launches | us | share |\n|---|---:|---:|---:|')
    for k, us in tot.most_common():
        print(f'| {k} | {cnt[k]} | {us:.1f} | {100 * us / whole:.1f}% |')
    side = sum(1 for r in step[:-1] if r['st'] != main_st)
    print(f'| the step, release to release ({b - a} launches, {side} on other streams) | | {whole:.1f} | 100% |')


if __name__ == '__main__':
    main()
