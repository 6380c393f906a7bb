#!/usr/bin/env python3
"""Compares our reader's canonical dump (C tool) with gguf-py's (gguf_dump.py) for each FILE,
through both gguf_open (mmap) and gguf_open_memory. Fails on the first difference.

Usage: compare_dump.py C_DUMP_TOOL [--memory-only] FILE... | --manifest MANIFEST | --glob DIR
  --manifest: the "good" rows of make_broken.py's manifest; --glob: every *.gguf in DIR.
  --memory-only: only gguf_open_memory (for split parts, which gguf_open opens as a set).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        sys.exit('FAIL: %s exited %d: %s' % (' '.join(cmd), p.returncode, p.stderr.decode(errors='replace')))
    return p.stdout.decode('utf-8', errors='strict').splitlines()


def main():
    tool = sys.argv[1]
    files = sys.argv[2:]
    modes = ([], ['--memory'])
    if files and files[0] == '--memory-only':
        modes = (['--memory'],)
        files = files[1:]
    if files and files[0] == '--manifest':
        with open(files[1]) as f:
            files = [ln.split('\t')[1].strip() for ln in f if ln.startswith('good\t')]
    elif files and files[0] == '--glob':
        files = sorted(os.path.join(files[1], n) for n in os.listdir(files[1]) if n.endswith('.gguf'))
    if not files:
        sys.exit('FAIL: no files to compare')
    for path in files:
        ref = run([sys.executable, os.path.join(HERE, 'gguf_dump.py'), path])
        if len(ref) < 5:
            sys.exit('FAIL: reference dump of %s is too short' % path)
        for mode in modes:
            got = run([tool] + mode + [path])
            for i, (a, b) in enumerate(zip(ref, got)):
                if a != b:
                    sys.exit('FAIL: %s %s line %d differs\n  gguf-py: %s\n  ours:    %s'
                             % (path, ' '.join(mode), i + 1, a[:400], b[:400]))
            if len(ref) != len(got):
                sys.exit('FAIL: %s %s: gguf-py has %d lines, ours %d' % (path, ' '.join(mode), len(ref), len(got)))
        n_t = sum(1 for ln in ref if ln.startswith('tensor '))
        n_kv = sum(1 for ln in ref if ln.startswith('kv '))
        print('ok %s: %d kv, %d tensors identical (%s)' % (path, n_kv, n_t, ', '.join(m[0] if m else 'mmap' for m in modes)))


if __name__ == '__main__':
    main()
