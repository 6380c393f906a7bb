"""A copy of a GGUF file, written by gguf-py (independent of our reader and writer), with its
key-values or tensors changed on the way: the tests' way to make a fixture look like a file
published elsewhere (another tensor type, another tokenizer) without storing that file.
copy(src, dst, kv=None, tensor=None): kv(name, value) returns the value to write (or the one
given); tensor(name, f32 array) returns (array, gguf type) for a tensor to change, None to copy
it as it is (only called for BF16 / F32 / F16 tensors)."""
import gguf
import numpy as np

VT, QT = gguf.GGUFValueType, gguf.GGMLQuantizationType


def _f32(t):
    if t.tensor_type == QT.BF16:
        return (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(t.data, dtype=np.float32)


def copy(src, dst, kv=None, tensor=None):
    rd = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, None)
    for f in rd.fields.values():
        if f.name.startswith('GGUF.'):
            continue
        t = f.types[0]
        if t == VT.ARRAY:
            et = f.types[1]
            val = ([bytes(f.parts[i]).decode('utf-8', 'surrogateescape') for i in f.data] if et == VT.STRING
                   else [f.parts[i].tolist()[0] for i in f.data])
        elif t == VT.STRING:
            et, val = None, bytes(f.parts[f.data[0]]).decode('utf-8')
        else:
            et, val = None, f.parts[f.data[0]].tolist()[0]
        if kv:
            val = kv(f.name, val)
        if et is not None:
            w.add_key_value(f.name, val, t, sub_type=et)
        else:
            w.add_key_value(f.name, val, t)
    for t in rd.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        new = tensor(t.name, _f32(t).reshape(shape)) if tensor and t.tensor_type in (QT.BF16, QT.F32, QT.F16) else None
        if new is not None:
            arr, ty = new
            w.add_tensor(t.name, gguf.quants.quantize(arr, ty) if ty not in (QT.F32, QT.F16) else arr, raw_dtype=ty)
        elif t.tensor_type in (QT.F32, QT.F16):
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape))
        else:  # the bytes as they are: gguf-py takes the shape from their rows
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
