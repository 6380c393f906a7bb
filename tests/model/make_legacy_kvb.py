#!/usr/bin/env python3
"""Rewrites a GGUF file with split MLA up-projections into the legacy fused `attn_kv_b` layout.

  make_legacy_kvb.py IN.gguf OUT.gguf [--keep-mla-keys]
  make_legacy_kvb.py IN.gguf OUT.gguf --kvb-type Q8_0  (kv_b quantized by gguf-py, as released
                                                       legacy files often carry it)
  make_legacy_kvb.py IN.gguf OUT.gguf --bad-rows      (a broken file: kv_b with one head too many rows)

The relation (llama.cpp convert_hf_to_gguf.py, DeepseekV2Model.modify_tensors, "MLA with the
absorption optimization, needs these two split and k_b_proj transposed"): HF's kv_b_proj weight W
has torch shape [H*(nope+v), kv_lora] (per head h the rows [nope rows of W_k | v rows of W_v]); the
converter views it as [H, nope+v, kv_lora], splits dim 1 into k_b [H, nope, kv_lora] and
v_b [H, v, kv_lora], and transposes k_b to [H, kv_lora, nope]. In GGUF order (ne0 innermost):
  attn_k_b  ne {nope, kv_lora, H}:  k_b[h][l][d] = W[h*(nope+v) + d,        l]
  attn_v_b  ne {kv_lora, v, H}:     v_b[h][j][l] = W[h*(nope+v) + nope + j, l]
  attn_kv_b ne {kv_lora, H*(nope+v)}: W itself (the pre-split converters wrote kv_b_proj unchanged).
So per head: W[h, :nope, :] = k_b[h].T and W[h, nope:, :] = v_b[h]. This is a pure permutation of
elements, exact for F32/F16/BF16 (raw 16-bit words are moved, nothing is rounded); a quantized
k_b cannot be transposed without requantizing, so those files are refused (--kvb-type quantizes
the exact fused matrix instead, with gguf-py's reference quantizer).

Metadata: the pre-split converters wrote the per-head sizes under the plain keys,
attention.key_length = nope + rope and attention.value_length = v, and no *_mla keys; llama.cpp's
deepseek2 loader then takes is_mla() false and loads attn_kv_b {kv_lora, H*(nope+v)}. We write
that: key_length := key_length_mla, value_length := value_length_mla, the *_mla keys dropped
(--keep-mla-keys leaves the keys as they are). Everything else (other metadata in order, other
tensors, their types and bytes, the alignment) is copied unchanged.
"""
import argparse
import sys

import numpy as np
import gguf
from gguf import GGUFReader, GGUFValueType, GGUFWriter, GGMLQuantizationType as QT

FLOAT_TYPES = {QT.F32: np.uint32, QT.F16: np.uint16, QT.BF16: np.uint16}


def field_value(f):
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        if len(f.types) > 2:
            raise SystemExit(f'{f.name}: nested arrays are not supported')
        return f.contents(), t, f.types[1]
    return f.contents(), t, None


def words(t):
    """The tensor's elements as raw integer words in numpy order (outermost dim first)."""
    w = FLOAT_TYPES.get(t.tensor_type)
    if w is None:
        raise SystemExit(f'{t.name}: type {t.tensor_type.name} cannot be transposed exactly')
    shape = [int(x) for x in reversed(t.shape)]
    return np.ascontiguousarray(t.data).view(w).reshape(shape)


def to_f32(wd, tt):
    if tt == QT.BF16:
        return (wd.astype(np.uint32) << 16).view(np.float32)
    if tt == QT.F16:
        return wd.view(np.float16).astype(np.float32)
    return wd.view(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('src')
    ap.add_argument('dst')
    ap.add_argument('--keep-mla-keys', action='store_true')
    ap.add_argument('--kvb-type', help='quantize attn_kv_b to this ggml type (gguf-py quantizer), e.g. Q8_0')
    ap.add_argument('--bad-rows', action='store_true', help='write kv_b of layer 0 with one head too many rows')
    a = ap.parse_args()

    r = GGUFReader(a.src)
    arch = r.fields['general.architecture'].contents()
    kl = f'{arch}.attention.key_length'
    vl = f'{arch}.attention.value_length'
    klm, vlm = kl + '_mla', vl + '_mla'
    if klm not in r.fields or vlm not in r.fields:
        raise SystemExit(f'{a.src}: no {klm}/{vlm}: not a split-layout file')
    dk = int(r.fields[klm].contents())
    dv = int(r.fields[vlm].contents())
    n_rope = int(r.fields[f'{arch}.rope.dimension_count'].contents())
    dn = dk - n_rope

    w = GGUFWriter(a.dst, arch)
    if 'general.alignment' in r.fields:
        w.data_alignment = int(r.fields['general.alignment'].contents())
    for name, f in r.fields.items():
        if name.startswith('GGUF.') or name == 'general.architecture':
            continue
        if not a.keep_mla_keys:
            if name in (klm, vlm):
                continue
            if name == kl:
                w.add_key_value(name, dk, f.types[0])
                continue
            if name == vl:
                w.add_key_value(name, dv, f.types[0])
                continue
        val, t, sub = field_value(f)
        w.add_key_value(name, val, t, sub_type=sub)

    by_name = {t.name: t for t in r.tensors}
    n_kvb = 0
    for t in r.tensors:
        if t.name.endswith('.attn_v_b.weight'):
            continue
        if t.name.endswith('.attn_k_b.weight'):
            vt = by_name[t.name.replace('attn_k_b', 'attn_v_b')]
            if vt.tensor_type != t.tensor_type:
                raise SystemExit(f'{t.name} and {vt.name} have different types')
            kb = words(t)            # [H, kv_lora, nope]
            vb = words(vt)           # [H, v, kv_lora]
            H, L, n = kb.shape
            if n != dn or vb.shape != (H, dv, L):
                raise SystemExit(f'{t.name} {kb.shape} / {vt.name} {vb.shape} do not match nope {dn}, v {dv}')
            kv = np.empty((H, dn + dv, L), dtype=kb.dtype)
            kv[:, :dn, :] = kb.transpose(0, 2, 1)
            kv[:, dn:, :] = vb
            kv = kv.reshape(H * (dn + dv), L)
            if a.bad_rows and n_kvb == 0:
                kv = np.concatenate([kv, kv[:dn + dv]], axis=0)
            name = t.name.replace('attn_k_b', 'attn_kv_b')
            if a.kvb_type:
                qt = QT[a.kvb_type.upper()]
                w.add_tensor(name, gguf.quants.quantize(to_f32(kv, t.tensor_type), qt), raw_dtype=qt)
            else:
                w.add_tensor(name, kv.view(np.uint8), raw_dtype=t.tensor_type)
            n_kvb += 1
            continue
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    if n_kvb == 0:
        raise SystemExit(f'{a.src}: no attn_k_b tensors')

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f'{a.dst}: {n_kvb} layers with attn_kv_b {{{L}, {H * (dn + dv)}}} (nope {dn}, v {dv})')


if __name__ == '__main__':
    sys.exit(main())
