#!/usr/bin/env python3
"""Generate kernels/quant_grids.c: the lookup tables of the IQ*, IQ4_NL and MXFP4 GGUF formats.

The tables are format constants. They are not typed in or copied from any C source: this script
takes them from the installed gguf-py package (PyPI "gguf"), which stores each grid in a compact
hex form in gguf/quants.py and expands it with <class>.init_grid(). We use the expanded arrays.

Usage: python3 scripts/gen_quant_grids.py [OUT.c]   (default: kernels/quant_grids.c next to us)
"""
import os
import sys

import numpy as np
from gguf import quants as q


def grid_of(cls):
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32)
    return g.reshape(cls.grid_shape)


def c_table(ctype, name, arr, per_line):
    arr = np.asarray(arr)
    dims = "".join(f"[{d}]" for d in arr.shape)
    lines = [f"const {ctype} {name}{dims} = {{"]
    if arr.ndim == 1:
        vals = [str(int(v)) for v in arr]
        for i in range(0, len(vals), per_line):
            lines.append("    " + ", ".join(vals[i:i + per_line]) + ",")
    else:
        rows = ["{" + ", ".join(str(int(v)) for v in row) + "}" for row in arr]
        for i in range(0, len(rows), per_line):
            lines.append("    " + ", ".join(rows[i:i + per_line]) + ",")
    lines.append("};")
    return "\n".join(lines) + "\n"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "kernels", "quant_grids.c")

    tables = []
    for cls, name in [(q.IQ2_XXS, "quant_iq2xxs_grid"), (q.IQ2_XS, "quant_iq2xs_grid"),
                      (q.IQ2_S, "quant_iq2s_grid"), (q.IQ3_XXS, "quant_iq3xxs_grid"),
                      (q.IQ3_S, "quant_iq3s_grid")]:
        g = grid_of(cls)
        assert np.all(g == np.round(g)) and g.min() >= 0 and g.max() < 256, name
        tables.append(c_table("uint8_t", name, g.astype(np.int64), 4 if g.shape[1] == 8 else 6))
    g1 = grid_of(q.IQ1_S)
    assert np.array_equal(g1, grid_of(q.IQ1_M)), "IQ1_S and IQ1_M grids differ"
    assert set(np.unique(g1)) <= {-1.0, 0.0, 1.0}
    tables.append(c_table("int8_t", "quant_iq1s_grid", g1.astype(np.int64), 4))
    ks = np.frombuffer(q.IQ2_XXS.ksigns, dtype=np.uint8)
    assert ks.shape == (128,)
    tables.append(c_table("uint8_t", "quant_ksigns", ks, 16))
    tables.append(c_table("int8_t", "quant_kvalues_iq4nl", np.array(q.IQ4_NL.kvalues), 16))
    tables.append(c_table("int8_t", "quant_kvalues_mxfp4", np.array(q.MXFP4.kvalues), 16))


    try:
        from importlib.metadata import version
        ver = version("gguf")
    except Exception:  # pragma: no cover
        ver = "unknown"
    head = (
        "/* quant_grids: lookup tables of the GGUF IQ2/IQ3/IQ1 grids, the sign table, IQ4_NL and\n"
        " * MXFP4 value tables. GENERATED FILE, do not edit: made by scripts/gen_quant_grids.py from\n"
        f" * the installed gguf-py package (gguf {ver}): each grid is <class>.grid after\n"
        " * <class>.init_grid() in gguf/quants.py, written one row per grid entry (uint8 magnitudes;\n"
        " * int8 -1/0/+1 for IQ1_S/IQ1_M), ksigns from IQ2_XXS.ksigns, kvalues from IQ4_NL/MXFP4. */\n"
        '#include "quant_grids.h"\n\n')

    with open(out, "w") as f:
        f.write(head + "\n".join(tables))
    print("wrote", out)


if __name__ == "__main__":
    main()
