#!/usr/bin/env python3
"""bench/kernel_code.py against this build's CUDA objects: the kernels of a decode layer are
listed with their code sizes, the 16-head attention kernel smaller than the 32-row one, --match
filters, and a directory without CUDA objects is refused by name.
usage: test_kernel_code.py KERNEL_CODE_PY BUILD_DIR"""
import re
import subprocess
import sys
import tempfile

tool, build = sys.argv[1], sys.argv[2]
fails = 0


def check(ok, what):
    global fails
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    fails += not ok


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)


r = run(build, "--match", r"mla_attn_tcn?_kernel<512, 64|rmsnorm_kernel<true, true, false>", "--top", "100")
check(r.returncode == 0, "runs on the build (%s)" % r.stderr.strip()[:200])
rows = [l for l in r.stdout.splitlines() if l.startswith("| ") and "`" in l]
size = {}
for l in rows:
    cells = [c.strip() for c in l.strip("|").split("|")]
    name = cells[4].strip("`")
    check(int(cells[0]) > 0 and int(cells[1]) == int(cells[0]) // 16 and re.match(r"sm_\d+", cells[2]),
          "a row: bytes, instructions, arch (%s)" % name[:60])
    size[re.sub(r"\(.*", "", name)] = int(cells[0])
check(all(re.search(r"mla_attn_tcn?_kernel|rmsnorm_kernel", n) for n in size), "--match keeps only what it names")
tcn = [v for k, v in size.items() if k.startswith("void mla_attn_tcn_kernel<512, 64>")]
tc = [v for k, v in size.items() if k.startswith("void mla_attn_tc_kernel<512, 64, __half, 32>")]
check(len(tcn) >= 1 and len(tc) >= 1 and max(tcn) < min(tc), "the 16-head kernel has less code than the 32-row one")
check(any(k.startswith("void rmsnorm_kernel<true, true, false>") for k in size), "the decode norm is listed")
with tempfile.TemporaryDirectory() as d:
    r = run(d)
    check(r.returncode != 0 and "no CUDA objects" in r.stderr, "a build without CUDA objects: %s" % r.stderr.strip())
sys.exit(1 if fails else 0)
