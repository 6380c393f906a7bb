#!/usr/bin/env python3
"""Writes a corpus of hand-made GGUF files into OUTDIR for the reader's tests:

  OUTDIR/bad/*.gguf    one distinct problem each (plus split sets under OUTDIR/bad/<case>/)
  OUTDIR/good/*.gguf   valid edge cases (zero tensors, every value type, nested arrays, v2, ...)
  OUTDIR/manifest.tsv  "bad<TAB>path<TAB>word...": opening path must fail with a one-line
                       message containing every word (gguf_open and gguf_open_memory alike);
                       "badsplit": the same through gguf_open only (split sets, names);
                       "good<TAB>path": must open.

Usage: make_broken.py OUTDIR
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_write import (ARR, BOOL, F32, F32_T, F64, F64_T, I8, I16, I32, I64, Q4_K_T, Q6_K_T, Q8_0_T,  # noqa: E402
                        STR, U8, U16, U32, U64, BF16_T, I8_T, build, gstr, kv, tinfo, u32, u64, value)

ARCH = kv('general.architecture', STR, 'test')


def base_kvs():
    return [ARCH, kv('test.block_count', U32, 4)]


def base_tensors():
    return [('a.weight', [8, 2], F32_T), ('b.weight', [32, 2], Q8_0_T)]


def valid(**kw):
    args = dict(kvs=base_kvs(), tensors=base_tensors())
    args.update(kw)
    return build(**args)


def nested(depth):
    """An array nested `depth` levels deep (depth 1 = plain array of u8)."""
    v = (U8, [1, 2])
    for _ in range(depth - 1):
        v = (ARR, [v])
    return v


def header(version=3, n_t=0, n_kv=0):
    return b'GGUF' + u32(version) + u64(n_t) + u64(n_kv)


def main():
    out = sys.argv[1]
    bad_dir, good_dir = os.path.join(out, 'bad'), os.path.join(out, 'good')
    os.makedirs(bad_dir, exist_ok=True)
    os.makedirs(good_dir, exist_ok=True)
    manifest = []

    def bad(name, data, *words):
        p = os.path.join(bad_dir, name + '.gguf')
        with open(p, 'wb') as f:
            f.write(data)
        manifest.append(['bad', p] + list(words))

    def bad_name(name, data, *words):
        """A problem only visible through the file name (gguf_open, not gguf_open_memory)."""
        bad(name, data, *words)
        manifest[-1][0] = 'badsplit'

    def good(name, data):
        p = os.path.join(good_dir, name + '.gguf')
        with open(p, 'wb') as f:
            f.write(data)
        manifest.append(['good', p])

    def bad_split(case, parts, open_no, *words, names=None):
        """parts: {file name: bytes}; opens the file named open_no."""
        d = os.path.join(bad_dir, case)
        os.makedirs(d, exist_ok=True)
        for fn, data in parts.items():
            with open(os.path.join(d, fn), 'wb') as f:
                f.write(data)
        manifest.append(['badsplit', os.path.join(d, open_no)] + list(words))

    v = valid()
    hdr_len = 24
    kv0_len = len(ARCH)

    # ---- header
    bad('empty', b'', 'offset 0:', 'truncated header')
    bad('truncated_header', v[:10], 'offset 10:', 'truncated header')
    bad('bad_magic', b'GGUX' + v[4:], 'offset 0:', 'bad magic')
    bad('version_1', header(version=1), 'offset 4:', 'version 1 is not supported')
    bad('version_99', header(version=99), 'offset 4:', 'unsupported GGUF version 99')
    bad('big_endian', b'GGUF' + struct.pack('>I', 3) + struct.pack('>QQ', 0, 0), 'offset 4:', 'big-endian')
    bad('huge_tensor_count', header(n_t=(1 << 64) - 1, n_kv=0) + bytes(64), 'offset 8:',
        'tensor count 18446744073709551615 exceeds')
    bad('huge_kv_count', header(n_t=0, n_kv=1 << 60) + bytes(64), 'offset 16:', 'kv count 1152921504606846976 exceeds')

    # ---- metadata
    bad('huge_key_length', header(n_kv=1) + u64(1 << 63) + b'abcd' + u32(U8) + b'\x01', 'offset 24:',
        'key length 9223372036854775808 exceeds')
    s_past = header(n_kv=1) + gstr('k') + u32(STR) + u64(100) + b'only a few bytes'
    bad('string_past_eof', s_past, 'offset 37:', 'string length 100 exceeds')
    bad('huge_string_length', header(n_kv=1) + gstr('k') + u32(STR) + u64((1 << 64) - 1) + b'xx',
        'string length 18446744073709551615 exceeds')
    bad('unknown_value_type', header(n_kv=1) + gstr('k') + u32(13) + bytes(16), 'offset 33:',
        'unknown metadata value type 13')
    bad('unknown_array_elem_type', header(n_kv=1) + gstr('k') + u32(ARR) + u32(77) + u64(1) + bytes(16),
        'unknown metadata value type 77')
    bad('array_too_deep', header(n_kv=1) + kv('deep', ARR, nested(9)), 'nested deeper than 8')
    bad('array_count_overflow', header(n_kv=1) + gstr('k') + u32(ARR) + u32(U32) + u64(1 << 62) + bytes(64),
        'array count 4611686018427387904 of uint32 exceeds')
    bad('array_of_strings_count', header(n_kv=1) + gstr('k') + u32(ARR) + u32(STR) + u64(1000) + gstr('a') * 10,
        'array count 1000 of string exceeds')
    bad('truncated_value', header(n_kv=1) + gstr('k') + u32(U32) + b'\x01\x02', 'offset 37:',
        'truncated metadata value')
    bad('empty_key', header(n_kv=1) + gstr('') + u32(U8) + b'\x01' + bytes(8), 'offset 24:', 'empty key')
    bad('key_with_nul', header(n_kv=1) + gstr(b'ab\0cd') + u32(U8) + b'\x01', "key 'ab\\x00cd' contains a NUL byte")
    bad('bool_not_0_1', header(n_kv=1) + gstr('flag') + u32(BOOL) + b'\x02', 'bool value 2 is neither 0 nor 1')
    bad('duplicate_key', valid(kvs=base_kvs() + [kv('test.block_count', U32, 5)]),
        "duplicate key 'test.block_count'", 'first at offset %d' % (hdr_len + kv0_len))
    bad('alignment_zero', valid(kvs=base_kvs() + [kv('general.alignment', U32, 0)]),
        'general.alignment 0 is not a nonzero power of two')
    bad('alignment_not_pow2', valid(kvs=base_kvs() + [kv('general.alignment', U32, 48)]),
        'general.alignment 48 is not a nonzero power of two')
    bad('alignment_wrong_type', valid(kvs=base_kvs() + [kv('general.alignment', U64, 32)]),
        'general.alignment has type uint64, expected uint32')

    # ---- tensor infos
    t_start = hdr_len + sum(len(k) for k in base_kvs())
    bad('unknown_tensor_type', valid(tensors=[('a.weight', [8, 2], 4)]), 'offset %d:' % t_start,
        "tensor 'a.weight': unknown tensor type 4")
    bad('n_dims_0', valid(tensors=[('a.weight', [], F32_T)]), "tensor 'a.weight': n_dims 0 is outside 1..4")
    bad('n_dims_5', valid(tensors=[('a.weight', [1, 1, 1, 1, 1], F32_T)]), 'n_dims 5 is outside 1..4')
    bad('ne_negative', valid(tensors=[('a.weight', [8, -2 & 0xffffffffffffffff], F32_T, 0, b'')]),
        'dimension 1 is negative')
    bad('ne_overflow', valid(tensors=[('a.weight', [1 << 32, 1 << 32], F32_T, 0, b'')]),
        'element count overflows')
    bad('nbytes_overflow', valid(tensors=[('a.weight', [1 << 31, 1 << 31], F64_T, 0, b'')]),
        'byte size overflows')
    bad('ne0_not_block_multiple', valid(tensors=[('q.weight', [33, 2], Q8_0_T, 0, bytes(68))]),
        'ne0 33 is not a multiple of the Q8_0 block size 32')
    bad('offset_misaligned', valid(tensors=[('a.weight', [8, 2], F32_T, 4)]),
        'data offset 4 is misaligned (not a multiple of the alignment 32)')
    bad('data_past_eof', valid(tensors=[('a.weight', [8, 2], F32_T, 0, bytes(64)),
                                        ('big.weight', [1024], F32_T, 1 << 20, b'')]),
        "tensor 'big.weight'", 'lies past the end of the file')
    bad('data_truncated', v[:-1], "tensor 'b.weight'", 'lies past the end of the file')
    bad('duplicate_tensor', valid(tensors=[('a.weight', [8, 2], F32_T), ('a.weight', [8], F32_T)]),
        "duplicate tensor 'a.weight'")
    bad('overlapping_data', valid(tensors=[('a.weight', [32, 2], F32_T, 0), ('c.weight', [8], F32_T, 192)]),
        "tensor 'c.weight' data overlaps tensor 'a.weight'")
    bad('empty_tensor_name', valid(tensors=[('', [8], F32_T)]), 'empty tensor name')
    ti = tinfo('a.weight', [8, 2], F32_T, 0)
    pre = header(n_t=1, n_kv=1) + ARCH
    bad('truncated_tensor_info', pre + ti[:-3] + bytes(0), 'truncated tensor data offset')
    bad('tensor_name_past_eof', pre + u64(500) + b'a.weight' + bytes(40), 'tensor name length 500 exceeds')
    bad('truncated_tensor_dims', pre + gstr('a.weight') + u32(4) + u64(8) + u64(2), 'truncated tensor dimension')

    # ---- split sets
    def part(no, count, tensors, n_total, kvs=None, extra=()):
        ks = list(kvs or []) + [kv('split.no', U16, no), kv('split.count', U16, count),
                                kv('split.tensors.count', I32, n_total)] + list(extra)
        return build(kvs=ks, tensors=tensors)

    t1, t2, t3 = [('a.weight', [8, 2], F32_T)], [('b.weight', [32, 2], Q8_0_T)], [('c.weight', [16], F32_T)]
    bad_split('split_missing_part',
              {'m-00001-of-00003.gguf': part(0, 3, t1, 3, base_kvs()), 'm-00003-of-00003.gguf': part(2, 3, t3, 3)},
              'm-00001-of-00003.gguf', 'm-00002-of-00003.gguf: offset 0:', 'cannot open split part 2 of 3')
    bad_split('split_count_mismatch',
              {'c-00001-of-00002.gguf': part(0, 3, t1, 2, base_kvs()), 'c-00002-of-00002.gguf': part(1, 3, t2, 2)},
              'c-00001-of-00002.gguf', 'split.count mismatch: split.count is 3 but the file name says 2 parts')
    bad_split('split_no_mismatch',
              {'n-00001-of-00002.gguf': part(0, 2, t1, 2, base_kvs()), 'n-00002-of-00002.gguf': part(0, 2, t2, 2)},
              'n-00001-of-00002.gguf', 'n-00002-of-00002.gguf: offset', 'split.no mismatch: split.no is 0 but this is part 2')
    bad_split('split_tensors_count_mismatch',
              {'t-00001-of-00002.gguf': part(0, 2, t1, 5, base_kvs()), 't-00002-of-00002.gguf': part(1, 2, t2, 5)},
              't-00001-of-00002.gguf', 'split.tensors.count mismatch: it says 5 tensors but the 2 part(s) hold 2')
    bad_split('split_duplicate_tensor',
              {'d-00001-of-00002.gguf': part(0, 2, t1, 2, base_kvs()), 'd-00002-of-00002.gguf': part(1, 2, t1, 2)},
              'd-00001-of-00002.gguf', "d-00002-of-00002.gguf: offset", "duplicate tensor 'a.weight' (also in part 1")
    bad_split('split_count_type',
              {'y-00001-of-00001.gguf': build(kvs=base_kvs() + [kv('split.count', STR, '1')], tensors=t1)},
              'y-00001-of-00001.gguf', 'split.count has type string, expected an integer')
    bad_name('split_count_without_split_name', part(0, 3, t1, 3, base_kvs()),
        'split.count is 3 but the file name does not follow the split naming scheme')
    bad_split('split_bad_second_part',
              {'b-00001-of-00002.gguf': part(0, 2, t1, 2, base_kvs()), 'b-00002-of-00002.gguf': b'GGUF' + u32(1)},
              'b-00001-of-00002.gguf', 'b-00002-of-00002.gguf: offset 8:', 'truncated header')

    # ---- valid edge files
    good('zero_tensors_zero_kv', header())
    good('zero_tensors', build(kvs=base_kvs()))
    all_types = [
        kv('t.u8', U8, 255), kv('t.i8', I8, -128), kv('t.u16', U16, 65535), kv('t.i16', I16, -32768),
        kv('t.u32', U32, 4294967295), kv('t.i32', I32, -2147483648), kv('t.f32', F32, 1.0e-6),
        kv('t.bool_t', BOOL, 1), kv('t.bool_f', BOOL, 0), kv('t.str', STR, 'h\u00e9llo "q" \\ ,[]'),
        kv('t.empty_str', STR, ''), kv('t.u64', U64, (1 << 64) - 1), kv('t.i64', I64, -(1 << 63)),
        kv('t.f64', F64, 3.141592653589793), kv('t.f32_neg', F32, -2.5e30),
        kv('t.arr_u8', ARR, (U8, [0, 1, 255])), kv('t.arr_i32', ARR, (I32, [-1, 0, 7])),
        kv('t.arr_f32', ARR, (F32, [0.5, -1.25, 3.0e-3])), kv('t.arr_bool', ARR, (BOOL, [1, 0, 1])),
        kv('t.arr_str', ARR, (STR, ['a', '', 'c,d', '\u4e2d'])), kv('t.arr_empty', ARR, (U32, [])),
        kv('t.arr_u64', ARR, (U64, [1 << 63])), kv('t.arr_f64', ARR, (F64, [1e300, -0.0])),
        kv('t.arr_i8', ARR, (I8, [-5])), kv('t.arr_u16', ARR, (U16, [9])), kv('t.arr_i16', ARR, (I16, [-9])),
        kv('t.arr_u32', ARR, (U32, [7, 8])), kv('t.arr_i64', ARR, (I64, [-7])),
        kv('t.nested2', ARR, (ARR, [(U8, [1, 2]), (STR, ['x', 'y']), (I32, [])])),
        kv('t.nested3', ARR, (ARR, [(ARR, [(F32, [1.5]), (U16, [3, 4])])])),
        kv('t.nested_max', ARR, nested(8)),
        kv('general.alignment', U32, 64),
    ]
    good('all_value_types', build(kvs=[ARCH] + all_types, alignment=64,
                                  tensors=[('a.weight', [8, 2], F32_T), ('k.weight', [256, 2], Q4_K_T),
                                           ('h.weight', [256], Q6_K_T), ('e.weight', [4, 0, 3], F32_T),
                                           ('d4.weight', [2, 3, 4, 5], BF16_T), ('i.weight', [3], I8_T),
                                           ('z.weight', [32, 1, 1, 2], Q8_0_T)]))
    good('version_2', valid(version=2))
    good('alignment_1', build(kvs=base_kvs() + [kv('general.alignment', U32, 1)], alignment=1,
                              tensors=[('a.weight', [3], I8_T), ('b.weight', [5], I8_T)]))
    good('no_tensors_with_split_keys_1_of_1', build(kvs=base_kvs() + [kv('split.no', U16, 0), kv('split.count', U16, 1)]))
    good('unpadded_tensor_order', valid(tensors=[('b.weight', [32, 2], Q8_0_T, 128), ('a.weight', [8, 2], F32_T, 0)]))

    with open(os.path.join(out, 'manifest.tsv'), 'w') as f:
        for row in manifest:
            f.write('\t'.join(row) + '\n')
    n_bad = sum(1 for r in manifest if r[0] != 'good')
    print('wrote %d broken and %d valid cases to %s' % (n_bad, len(manifest) - n_bad, out))


if __name__ == '__main__':
    main()
