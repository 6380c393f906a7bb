#!/usr/bin/env python3
"""Canonical dump of one GGUF file (one part) read by gguf-py (pip package `gguf`), the
independent reference for our C reader. tests/unit/test_gguf_dump.c prints the same format.

Format, one item per line:
  version V / tensor_count N / kv_count N / alignment A / data_offset D
  kv "KEY" TYPE VALUE          (pseudo-fields GGUF.* left out)
  tensor "NAME" type=T dims=ne0,ne1,.. elems=N bytes=B offset=ABS crc32=XXXXXXXX
Values: integers decimal; float32 '%.9g', float64 '%.17g'; bool true/false; strings quoted
with bytes outside printable ASCII (and '"', '\\') as \\xNN; arrays [TYPE: v,v,...] with the
element type, nested arrays recursively.

Usage: gguf_dump.py FILE
"""
import sys
import zlib

import numpy as np
from gguf import GGUFReader, GGUFValueType

NAMES = {0: 'uint8', 1: 'int8', 2: 'uint16', 3: 'int16', 4: 'uint32', 5: 'int32', 6: 'float32',
         7: 'bool', 8: 'string', 9: 'array', 10: 'uint64', 11: 'int64', 12: 'float64'}


def qstr(b):
    out = ['"']
    for c in bytes(b):
        if 0x20 <= c < 0x7f and c not in (0x22, 0x5c):
            out.append(chr(c))
        else:
            out.append('\\x%02x' % c)
    out.append('"')
    return ''.join(out)


def scalar(t, arr):
    x = arr.tolist()[0]
    if t == 6:
        return '%.9g' % float(np.float32(x))
    if t == 12:
        return '%.17g' % float(x)
    if t == 7:
        return 'true' if x else 'false'
    return str(int(x))


def walk(parts, i, t):
    """Renders the value of type t whose raw parts (as split by gguf-py) start at parts[i];
    returns (text, next index)."""
    if t == 8:  # string: [length, bytes]
        return qstr(parts[i + 1].tobytes()), i + 2
    if t == 9:  # array: [elem type, count, items...]
        et = int(parts[i][0])
        n = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(n):
            s, i = walk(parts, i, et)
            items.append(s)
        return '[%s: %s]' % (NAMES[et], ','.join(items)), i
    return scalar(t, parts[i]), i + 1


def main():
    r = GGUFReader(sys.argv[1], 'r')
    fields = r.fields
    print('version %d' % int(fields['GGUF.version'].parts[0][0]))
    print('tensor_count %d' % int(fields['GGUF.tensor_count'].parts[0][0]))
    print('kv_count %d' % int(fields['GGUF.kv_count'].parts[0][0]))
    print('alignment %d' % r.alignment)
    print('data_offset %d' % r.data_offset)
    for f in fields.values():
        if f.name.startswith('GGUF.'):
            continue
        # parts: key length, key bytes, value type, value parts...
        key = f.parts[1].tobytes()
        t = int(f.parts[2][0])
        text, end = walk(f.parts, 3, t)
        assert end == len(f.parts), (f.name, end, len(f.parts))
        print('kv %s %s %s' % (qstr(key), NAMES[t], text))
    for t in r.tensors:
        off = int(t.data_offset)
        nb = int(t.n_bytes)
        crc = zlib.crc32(r.data[off:off + nb].tobytes()) if nb else 0
        dims = ','.join(str(int(d)) for d in t.shape)
        print('tensor %s type=%d dims=%s elems=%d bytes=%d offset=%d crc32=%08x' % (
            qstr(t.name.encode()), int(t.tensor_type), dims, int(t.n_elements), nb, off, crc))


if __name__ == '__main__':
    main()
