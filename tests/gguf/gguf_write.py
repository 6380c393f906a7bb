"""Minimal GGUF byte writer for tests (our own code, written from the format description).

Everything is explicit so that tests can also write *broken* files: counts, versions, types
and offsets can be overridden, and raw bytes can be spliced in anywhere.

Layout: "GGUF" u32 version, u64 n_tensors, u64 n_kv, kvs, tensor infos, padding to the
alignment, tensor data. Integers little-endian.
"""
import struct

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_SCALAR = {U8: '<B', I8: '<b', U16: '<H', I16: '<h', U32: '<I', I32: '<i', F32: '<f',
           BOOL: '<B', U64: '<Q', I64: '<q', F64: '<d'}

# ggml tensor types used by the tests: id -> (block elems, block bytes)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 12: (256, 144), 14: (256, 210),
        28: (1, 8), 30: (1, 2), 24: (1, 1)}
F32_T, F16_T, Q4_0_T, Q8_0_T, Q4_K_T, Q6_K_T, F64_T, BF16_T, I8_T = 0, 1, 2, 8, 12, 14, 28, 30, 24


def u32(x):
    return struct.pack('<I', x & 0xffffffff)


def u64(x):
    return struct.pack('<Q', x & 0xffffffffffffffff)


def gstr(s):
    b = s.encode() if isinstance(s, str) else bytes(s)
    return u64(len(b)) + b


def value(t, v):
    """Encodes a value of type t. Arrays: v = (elem_type, [items]); nested arrays use
    (ARR, [(elem, items), ...])."""
    if t in _SCALAR:
        return struct.pack(_SCALAR[t], v)
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return u32(et) + u64(len(items)) + b''.join(value(et, x) for x in items)
    raise ValueError(t)


def kv(key, t, v):
    return gstr(key) + u32(t) + value(t, v)


def tinfo(name, dims, ttype, offset):
    return gstr(name) + u32(len(dims)) + b''.join(u64(d) for d in dims) + u32(ttype) + u64(offset)


def nbytes(dims, ttype):
    be, bb = GGML[ttype]
    n = 1
    for d in dims:
        n *= d
    return n // be * bb


def pad(n, a):
    return (a - n % a) % a


def build(kvs=(), tensors=(), version=3, alignment=32, n_tensors=None, n_kv=None, magic=b'GGUF',
          data_fill=None):
    """kvs: list of encoded kv bytes (see kv()). tensors: list of (name, dims, type) or
    (name, dims, type, offset, data). Offsets/data default to packed, aligned, deterministic
    contents. Returns the file bytes."""
    infos = []
    data = bytearray()
    for i, t in enumerate(tensors):
        name, dims, ttype = t[0], t[1], t[2]
        size = nbytes(dims, ttype) if ttype in GGML else 0
        if len(t) > 3 and t[3] is not None:
            off = t[3]
        else:
            data += b'\0' * pad(len(data), alignment)
            off = len(data)
        payload = t[4] if len(t) > 4 and t[4] is not None else bytes(((off + k) * 7 + i) & 0xff for k in range(size))
        if payload and len(data) < off + len(payload):
            data += b'\0' * (off + len(payload) - len(data))
        data[off:off + len(payload)] = payload
        infos.append(tinfo(name, dims, ttype, off))
    head = magic + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors) + \
        u64(len(kvs) if n_kv is None else n_kv)
    meta = head + b''.join(kvs) + b''.join(infos)
    if not tensors:
        return meta
    return meta + b'\0' * pad(len(meta), alignment) + bytes(data)
