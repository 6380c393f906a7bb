#!/usr/bin/env python3
"""The code size of each CUDA kernel of a build, from the device code embedded in its objects (no
GPU and no CUDA tools needed). A decode step runs its kernels cold: a layer's chain holds more code
than an SM keeps, so the code a kernel runs once a launch is latency of its own
(bench/results/cold-code-h200-2026-12-04.md). This lists where that code is.

usage: bench/kernel_code.py BUILD_DIR [--match REGEX] [--top N]
  BUILD_DIR  a CMake build with -DMLA_CUDA=ON (its kernels/ objects are read)
  --match    only kernels whose demangled name matches REGEX (e.g. 'rmsnorm|gemvw|attn_tc')
  --top      the N largest (default 40)
Prints bytes and instructions (16 bytes each on sm_70 and later) a kernel and architecture."""
import argparse
import glob
import os
import re
import shutil
import struct
import subprocess
import sys


def elf_texts(blob, start):
    """(name, size) of the .text.* sections of the ELF image at blob[start:], or None."""
    d = memoryview(blob)[start:]
    if len(d) < 64 or bytes(d[:4]) != b"\x7fELF" or d[4] != 2:  # 64-bit images only
        return None
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    if shentsize != 64 or not 0 < shnum < 65536 or shstrndx >= shnum or shoff + shnum * 64 > len(d):
        return None
    secs = [struct.unpack_from("<IIQQQQ", d, shoff + k * 64) for k in range(shnum)]
    stro = secs[shstrndx][4]
    out = []
    for name, _typ, _flags, _addr, _off, size in secs:
        end = bytes(d[stro + name:stro + name + 4096]).split(b"\0", 1)[0]
        n = end.decode(errors="replace")
        if n.startswith(".text."):
            out.append((n[6:], size))
    return out


def arch_of(blob, start):
    """the sm_XY an image was built for (EF_CUDA_SM in e_flags), or '?'"""
    flags = struct.unpack_from("<I", blob, start + 0x30)[0]
    for sm in (flags & 0xFF, (flags >> 8) & 0xFF):  # the field moved between toolkits
        if 30 <= sm <= 130:
            return "sm_%d" % sm
    return "?"


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return names
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.split("\n")
    return [o.replace("(anonymous namespace)::", "") for o in out[: len(names)]] if r.returncode == 0 else names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--match", default=None)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    objs = sorted(glob.glob(os.path.join(a.build, "kernels", "CMakeFiles", "*", "*.cu.o")))
    if not objs:
        sys.exit("kernel_code: no CUDA objects under %s/kernels (a -DMLA_CUDA=ON build?)" % a.build)
    rows = {}
    for o in objs:
        blob = open(o, "rb").read()
        i = blob.find(b"\x7fELF", 1)
        while i >= 0:
            texts = elf_texts(blob, i)
            if texts:
                arch = arch_of(blob, i)
                for n, size in texts:
                    rows[(n, arch)] = (size, os.path.basename(o)[: -len(".cu.o")])
            i = blob.find(b"\x7fELF", i + 1)
    keys = list(rows)
    names = demangle([k[0] for k in keys])
    table = []
    for (mangled, arch), dn in zip(keys, names):
        if a.match and not re.search(a.match, dn):
            continue
        size, src = rows[(mangled, arch)]
        table.append((size, arch, src, dn))
    table.sort(reverse=True)
    print("| bytes | instructions | arch | file | kernel |")
    print("|---:|---:|---|---|---|")
    for size, arch, src, dn in table[: a.top]:
        print("| %d | %d | %s | %s.cu | `%s` |" % (size, size // 16, arch, src, dn[:140]))
    print("\n%d kernels matched, %d bytes of code in all" % (len(table), sum(t[0] for t in table)))


if __name__ == "__main__":
    main()
