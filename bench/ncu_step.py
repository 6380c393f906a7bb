#!/usr/bin/env python3
"""Where one decode step's time goes, from Nsight Compute's CSV of kernel durations
(ncu --csv --metrics gpu__time_duration.sum ... mla-e2e logits ... --greedy N, graphs off).
A step starts at the embedding gather (get_rows_kernel); the last complete step is summed by
kernel name. Usage: ncu_step.py NCU.csv [--step K] (K-th step from the end, default 1)."""
import csv, sys, collections


def main():
    path = sys.argv[1]
    back = int(sys.argv[sys.argv.index('--step') + 1]) if '--step' in sys.argv else 1
    rows = []
    with open(path, newline='') as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own log lines before the CSV
    for r in csv.DictReader(lines):
        if r.get('Metric Name') != 'gpu__time_duration.sum':
            continue
        unit = r.get('Metric Unit', 'nsecond')
        v = float(r['Metric Value'].replace(',', ''))
        v *= {'nsecond': 1e-3, 'usecond': 1.0, 'msecond': 1e3, 'second': 1e6}.get(unit, 1e-3)
        name = r['Kernel Name'].replace('(anonymous namespace)::', '').replace('<unnamed>::', '').replace('void ', '')
        name = name.split('(')[0].split('<')[0].strip() + f" {r.get('Grid Size', '')}x{r.get('Block Size', '')}"
        rows.append((int(r['ID']), name, v))
    rows.sort()
    starts = [i for i, (_, k, _) in enumerate(rows) if k.startswith('mlacu::get_rows')]
    if len(starts) < back + 1:
        sys.exit(f'ncu_step: {len(starts)} steps found in {path}, need {back + 1}')
    a, b = starts[-back - 1], starts[-back]
    step = rows[a:b]
    tot = collections.Counter()
    cnt = collections.Counter()
    for _, k, us in step:
        tot[k] += us
        cnt[k] += 1
    s = sum(tot.values())
    print(f'| kernel | launches | us | share |\n|---|---|---|---|')
    for k, us in tot.most_common():
        print(f'| {k} | {cnt[k]} | {us:.1f} | {100 * us / s:.1f}% |')
    print(f'| total (kernels {a}..{b - 1}) | {b - a} | {s:.1f} | 100% |')


if __name__ == '__main__':
    main()
