#!/usr/bin/env python3
"""Splits a GGUF file into N parts following llama.cpp's gguf-split layout (our own code):
files PREFIX-%05d-of-%05d.gguf; every part carries split.no (u16, 0-based), split.count (u16)
and split.tensors.count (i32, tensors in all parts); the first part also carries all original
metadata; every part has its own tensor infos with offsets relative to its own data section.
Tensors are spread evenly in file order. --first-empty puts no tensors in the first part
(gguf-split --no-tensor-first-split).

The source is read with gguf-py; kvs are copied as their raw bytes.
Usage: make_split.py SRC OUTDIR PREFIX N [--first-empty]
"""
import os
import sys

from gguf import GGUFReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_write import I32, U16, gstr, kv, pad, u32, u64  # noqa: E402


def main():
    src, outdir, prefix, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    first_empty = '--first-empty' in sys.argv[5:]
    r = GGUFReader(src, 'r')
    raw_kvs = [b''.join(p.tobytes() for p in f.parts) for f in r.fields.values() if not f.name.startswith('GGUF.')]
    version = int(r.fields['GGUF.version'].parts[0][0])
    tensors = []
    for t in r.tensors:
        off = int(t.data_offset)
        tensors.append((t.name, [int(d) for d in t.shape], int(t.tensor_type), r.data[off:off + int(t.n_bytes)].tobytes()))
    nt = len(tensors)
    groups = [[] for _ in range(n)]
    holders = list(range(1, n)) if first_empty else list(range(n))
    for i, t in enumerate(tensors):
        groups[holders[i * len(holders) // nt]].append(t)
    os.makedirs(outdir, exist_ok=True)
    for p in range(n):
        kvs = (raw_kvs if p == 0 else []) + [kv('split.no', U16, p), kv('split.count', U16, n),
                                             kv('split.tensors.count', I32, nt)]
        # later parts carry no general.alignment, so they use the default
        align = r.alignment if p == 0 else 32
        infos, data = [], bytearray()
        for name, dims, ttype, payload in groups[p]:
            data += b'\0' * pad(len(data), align)
            infos.append(gstr(name) + u32(len(dims)) + b''.join(u64(d) for d in dims) + u32(ttype) + u64(len(data)))
            data += payload
        meta = b'GGUF' + u32(version) + u64(len(groups[p])) + u64(len(kvs)) + b''.join(kvs) + b''.join(infos)
        path = os.path.join(outdir, '%s-%05d-of-%05d.gguf' % (prefix, p + 1, n))
        with open(path, 'wb') as f:
            f.write(meta)
            if groups[p]:
                f.write(b'\0' * pad(len(meta), align))
                f.write(data)
        print('%s: %d tensors' % (path, len(groups[p])))


if __name__ == '__main__':
    main()
