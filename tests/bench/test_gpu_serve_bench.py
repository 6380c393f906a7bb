#!/usr/bin/env python3
"""scripts/gpu_serve_bench.sh, dry run without a GPU, and its two readers. No timing is asserted.

1. bench/ncu_step.py --families on a hand-written Nsight Compute CSV of two steps: the last
   complete step's kernels summed by family as computed here by hand (6 kernels, 3 families);
   with --stalls, the warp-state shares of a family weighted by duration, as computed by hand.
2. bench/plot_serve.py on a hand-written result: the better llama-server run of each point (FA on
   at c1, FA off at c8), the ratios mlaserve / llama-server (2.00x tok/s, 0.50x ITL p99), a failed
   point shown as failed.
3. The script itself on the CPU backend: a 2-layer GLM-4.7-Flash-shaped model (hidden 256, 20 heads),
   concurrency 1 and 2, two Poisson rates derived from the concurrency points, `mlaserve bench`
   batch 1; llama-server from a package folder (FlashAttention kernels in) whose llama-server is
   mlaserve on the CPU under llama-server's arguments, 400 ms slower a step with `-fa off`: the probe
   at concurrency 1 (none of 8 or more) tries on, then off, picks on and starts it again for the points. Checked: exit
   status 0, llama-server's arguments, the JSON (every point of both servers without error, the
   asked tokens streamed, mlaserve's split of its time to first token, rates below/above each
   other, FA on chosen, a decode row with a roofline share), the notes, the tables with a ratio
   at every point, the logs archive, the model deleted.
4. The same with a llama-server that exits at once (LLAMA_FA=on, one point): exit status 1, the note,
   mlaserve's point and the bench kept.
5. llama-server alone (SERVE=0, LLAMA_FA=on) at concurrency 2 and a given rate: its two points, no
   mlaserve point, the rate recorded, the note.
6. llama-server alone at rates derived from RATE_TOKS (40 output tok/s over SHAPE_R's 4 output
   tokens: 5 and 9 requests/s), no concurrency point; a RATE_TOKS that is not a rate above 0 refused.
usage: test_gpu_serve_bench.py MLASERVE WORKDIR"""
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(here, "..", ".."))
sys.path.insert(0, os.path.join(here, "..", "lib"))
import mlatest  # noqa: E402
from mlatest import check, finish  # noqa: E402

exe, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# ---- 1. ncu_step.py --families ----
kern = [  # (name, us): step 1 (left out: not the last complete one), step 2, then the start of step 3
    ("mlacu::get_rows_kernel<4>", 9.0), ("mlacu::gemvs_kernel<12, 1, false>", 50.0),
    ("mlacu::get_rows_kernel<4>", 2.0), ("rmsnorm_kernel", 3.0), ("mlacu::gemvs_kernel<12, 1, false>", 40.0),
    ("mlacu::gemvs_kernel<12, 1, true>", 30.0), ("mla_attn_kernel", 10.0), ("rmsnorm_kernel", 5.0),
    ("mlacu::get_rows_kernel<4>", 1.0), ("rmsnorm_kernel", 7.0)]


def ncu_csv(path, stall=None, dram=None):
    """Nsight Compute's CSV of kern (each launch's duration) at path, after a log line of its own;
    stall: {ID: (no_instruction %, long_scoreboard %)}, the two warp-state rows of each launch
    (1% each where not given); dram: {ID: (read, write, unit)}, its DRAM byte rows"""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(["ID", "Kernel Name", "Grid Size", "Block Size", "Metric Name", "Metric Unit", "Metric Value"])
    for i, (k, us) in enumerate(kern):
        row = [i, "void " + k + "(args)", "(1, 1, 1)", "(128, 1, 1)"]
        w.writerow(row + ["gpu__time_duration.sum", "nsecond", f"{us * 1000:.0f}"])
        if stall is not None:
            for reason, pct in zip(("no_instruction", "long_scoreboard"), stall.get(i, (1.0, 1.0))):
                w.writerow(row + [f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct", "%", f"{pct:.2f}"])
        if dram is not None and i in dram:
            rd, wr, unit = dram[i]
            w.writerow(row + ["dram__bytes_read.sum", unit, f"{rd:,}"])
            w.writerow(row + ["dram__bytes_write.sum", unit, f"{wr:,}"])
    with open(path, "w") as f:
        f.write("==PROF== Connected to process\n" + buf.getvalue())


ncsv, njson = os.path.join(work, "ncu.csv"), os.path.join(work, "ncu.json")
ncu_csv(ncsv)
r = subprocess.run([sys.executable, os.path.join(root, "bench", "ncu_step.py"), ncsv, "--families", "--json", njson],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 0, "ncu_step.py --families runs", r.stderr)
if r.returncode == 0:
    j = json.load(open(njson))
    fam = {f["family"]: (f["launches"], round(f["us"], 3)) for f in j["families"]}
    want = {"embedding and sampling": (1, 2.0), "norms": (2, 8.0), "matmul: dense weights": (1, 40.0),
            "matmul: experts (grouped)": (1, 30.0), "attention": (1, 10.0)}
    check(fam == want and abs(j["step_us"] - 90.0) < 1e-6 and j["launches"] == 6, "ncu families of the last step", fam)
    check(r.stdout.index("| family |") < r.stdout.index("| kernel |") and "| norms | 2 | 8.0 | 8.9% |" in r.stdout,
          "family table first, shares", r.stdout)

# the names as Nsight Compute prints them: a bool template argument as 1 or 0
sys.path.insert(0, os.path.join(root, "bench"))
import ncu_step  # noqa: E402
fams = {k: ncu_step.family_of(k) for k in ("gemvw_kernel<6, 1, 1>", "gemvw_kernel<12, 1, 0>", "gemvs_kernel<14, 2, 1>",
                                           "gemvm_grp_kernel<12, 2>", "gemvm_kernel<12, 1, 1>", "gemvq_grp_kernel<6, 0>")}
check(fams == {"gemvw_kernel<6, 1, 1>": "matmul: experts (grouped)", "gemvw_kernel<12, 1, 0>": "matmul: dense weights",
               "gemvs_kernel<14, 2, 1>": "matmul: experts (grouped)", "gemvm_grp_kernel<12, 2>": "matmul: experts (grouped)",
               "gemvm_kernel<12, 1, 1>": "matmul: dense weights", "gemvq_grp_kernel<6, 0>": "matmul: experts (grouped)"},
      "kernel families of grouped and dense GEMVs", fams)

# ---- 1b. ncu_step.py --stalls: the same step with warp-state rows (percent of active warp cycles) ----
stall = {3: (40.0, 30.0), 4: (10.0, 70.0), 5: (5.0, 80.0), 6: (20.0, 3.0), 7: (20.0, 60.0)}  # ID: no_instr, long_sb
scsv, sjson = os.path.join(work, "ncu-stalls.csv"), os.path.join(work, "ncu-stalls.json")
ncu_csv(scsv, stall)
r = subprocess.run([sys.executable, os.path.join(root, "bench", "ncu_step.py"), scsv, "--families", "--stalls",
                    "--json", sjson], capture_output=True, text=True, timeout=60)
check(r.returncode == 0, "ncu_step.py --stalls runs", r.stderr)
if r.returncode == 0:
    # norms: IDs 3 (3 us, 40%) and 7 (5 us, 20%): (3 x 40 + 5 x 20) / 8 = 27.5%, 2.2 us of fetch
    check("| norms | 8.0 | 27.5% | 2.2 | long_scoreboard 49% |" in r.stdout, "stalls of a family, duration-weighted",
          r.stdout)
    check("| mla_attn_kernel (1, 1, 1)x(128, 1, 1) | 10.0 | 20.0% | 2.0 |  |" in r.stdout,
          "a reason under 5% is left out", r.stdout)
    j = json.load(open(sjson))
    fam = {f["family"]: f["stalls"] for f in j["families"]}
    check(abs(fam["norms"]["no_instruction"] - 27.5) < 1e-9 and abs(fam["matmul: dense weights"]["long_scoreboard"]
                                                                        - 70.0) < 1e-9, "stalls in the JSON", fam)
r = subprocess.run([sys.executable, os.path.join(root, "bench", "ncu_step.py"), ncsv, "--stalls"], capture_output=True,
                   text=True, timeout=60)
check(r.returncode != 0 and "no smsp__warp_issue_stalled" in r.stderr, "--stalls without the metrics says so",
      r.stderr)
r = subprocess.run([sys.executable, os.path.join(root, "bench", "ncu_step.py"), "--stall-metrics"],
                   capture_output=True, text=True, timeout=60)
check(r.returncode == 0 and "smsp__warp_issue_stalled_no_instruction_per_warp_active.pct" in r.stdout.split(","),
      "--stall-metrics lists the metrics", r.stdout)

# ---- 1c. ncu_step.py --bytes: DRAM bytes by family and kernel, in the units ncu prints ----
dram = {4: (4.0, 0.0, "Mbyte"), 5: (2_400_000, 600_000, "byte"), 7: (16.0, 16.0, "Kbyte"), 8: (99.0, 0.0, "Gbyte")}
bcsv, bjson = os.path.join(work, "ncu-bytes.csv"), os.path.join(work, "ncu-bytes.json")
ncu_csv(bcsv, dram=dram)
r = subprocess.run([sys.executable, os.path.join(root, "bench", "ncu_step.py"), bcsv, "--families", "--bytes",
                    "--json", bjson], capture_output=True, text=True, timeout=60)
check(r.returncode == 0, "ncu_step.py --bytes runs", r.stderr)
if r.returncode == 0:
    # dense: 4 MB in 40 us = 100 GB/s; experts 3 MB in 30 us; norms 0.032 MB in 8 us; the next step's 99 GB not counted
    check("| matmul: dense weights | 1 | 40.0 | 44.4% | 4.0 | 100 |" in r.stdout and
          "| matmul: experts (grouped) | 1 | 30.0 | 33.3% | 3.0 | 100 |" in r.stdout and
          "| norms | 2 | 8.0 | 8.9% | 0.0 | 4 |" in r.stdout and "| total | 6 | 90.0 | 100% | 7.0 | 78 |" in r.stdout,
          "bytes and rates by family", r.stdout)
    j = json.load(open(bjson))
    mb = {f["family"]: round(f["mb"], 6) for f in j["families"]}
    check(mb["norms"] == 0.032 and mb["attention"] == 0.0, "bytes in the JSON", mb)
r = subprocess.run([sys.executable, os.path.join(root, "bench", "ncu_step.py"), ncsv, "--bytes"], capture_output=True,
                   text=True, timeout=60)
check(r.returncode != 0 and "no dram__bytes_read.sum" in r.stderr, "--bytes without the metrics says so", r.stderr)

# ---- 2. plot_serve.py ----
def pt(name, tok, itl99, ttft50, err=None):
    if err:
        return {"point": name, "error": err, "label": name}
    return {"point": name, "output_tok_per_s": tok, "requests_per_s": tok / 100, "errors": 0, "requests": 8,
            "ttft_ms": {"p50": ttft50, "p90": ttft50, "p99": ttft50}, "itl_ms": {"p50": itl99 / 2, "p90": itl99, "p99": itl99}}


res = {"model": "m", "family": "v2lite", "gpu": "g", "date": "d", "commit": "c", "rates": [1.5, 3.0],
       "shape_concurrency": "1k-256", "shape_rate": "chat", "seed": 1, "notes": ["n1"], "llama_fa_chosen": None,
       "servers": {"mlaserve": {"points": [pt("c1", 200.0, 10.0, 50.0), pt("c8", 900.0, 20.0, 80.0), pt("r1", 100.0, 8.0, 40.0)]},
                   "llama-faon": {"points": [pt("c1", 100.0, 20.0, 100.0), pt("c8", 300.0, 40.0, 90.0), pt("r1", 0, 0, 0, "timed out")]},
                   "llama-faoff": {"points": [pt("c1", 90.0, 25.0, 100.0), pt("c8", 450.0, 30.0, 60.0)]}}}
rj, rmd = os.path.join(work, "r.json"), os.path.join(work, "r.md")
json.dump(res, open(rj, "w"))
r = subprocess.run([sys.executable, os.path.join(root, "bench", "plot_serve.py"), rj, "--md", rmd, "--png",
                    os.path.join(work, "r.png")], capture_output=True, text=True, timeout=120)
check(r.returncode == 0 and os.path.exists(rmd), "plot_serve.py runs", r.stderr)
if os.path.exists(rmd):
    md = open(rmd).read()
    check("| c1 | llama-server FA on | 100.0 |" in md and "| c8 | llama-server FA off | 450.0 |" in md,
          "the better llama-server run at each point", md)
    check("| c1 | 2.00x | 0.50x | 0.50x |" in md and "| c8 | 2.00x | 0.67x | 1.33x |" in md, "ratios per point", md)
    check("| r1 (1.5/s) | llama-server FA on | failed: timed out |" in md and "| r1 | - | - | - |" in md,
          "a failed point is shown failed, no ratio", md)
    check("Notes: n1" in md, "notes", md)
try:
    import matplotlib  # noqa: F401
    check(os.path.getsize(os.path.join(work, "r.png")) > 1000, "plot written")
except ImportError:
    print("(no matplotlib: the plot is not checked)")

# ---- 3. the script, dry run ----
fake = os.path.join(work, "llama")
os.makedirs(fake)
with open(os.path.join(fake, "run-llama-bench.sh"), "w") as f:
    f.write('#!/bin/sh\nexec "$(dirname "$0")/$LLAMA_TOOL" "$@"\n')
# llama-server's arguments recorded (one line a start), then mlaserve serving its -m at --host/--port on
# the CPU (its /metrics too); `-fa off` 400 ms slower a step (a margin past a loaded machine's noise:
# with 50 ms a probe under the sanitizers beside other tests once picked off), so that the probe picks
# on and starts it again
with open(os.path.join(fake, "llama-server"), "w") as f:
    f.write('#!/bin/sh\necho "$@" >>"$(dirname "$0")/args"\n'
            'm=; host=; port=; fa=\n'
            'while [ $# -gt 0 ]; do case $1 in -m) m=$2; shift ;; --host) host=$2; shift ;; --port) port=$2; shift ;;'
            ' -fa) fa=$2; shift ;; esac; shift; done\n'
            '[ -n "$FAKE_LLAMA_FAIL" ] && { echo "llama-server: no GPU here" >&2; exit 1; }\n'
            '[ "$fa" = off ] && export MLA_WORKER_STEP_DELAY_MS=400\n'
            'exec "$MLASERVE" serve -m "$m" --backend cpu --host "$host" --port "$port" --no-prefix-cache '
            '--stats-interval 0 --drain-timeout 5 --heartbeat-timeout-ms 10000\n')
with open(os.path.join(fake, "README.txt"), "w") as f:
    f.write("cmake: -DGGML_CUDA_FA=ON\n")
for fn in ("run-llama-bench.sh", "llama-server"):
    os.chmod(os.path.join(fake, fn), 0o755)
out, bdir = os.path.join(work, "out"), os.path.join(work, "bench")
env = dict(os.environ, MLASERVE=exe, BACKEND="cpu", MKMODEL_ARGS="--small --hidden 256 --heads 20", MODELS="glm47flash:2",
           CONC="1 2", SHAPE_C="8-3", SHAPE_R="6-4", REQ_MIN="2", RATE_REQS="3", NCU="0", OUT=out, BENCH_DIR=bdir,
           LLAMA_DIR=fake, START_S="120", POINT_S="240", TOTAL_S="1200",
           BENCH_ARGS="--prefill 8 --batch 1 --ctx 16 --steps 2 --warmup 1 --repeat 1 --heartbeat-timeout-ms 10000",
           SERVE_ARGS="--heartbeat-timeout-ms 10000")  # sanitizer builds: long steps are not a dead worker
r = subprocess.run(["bash", os.path.join(root, "scripts", "gpu_serve_bench.sh")], env=env, capture_output=True,
                   text=True, timeout=1200)
print(r.stdout[-3000:])
check(r.returncode == 0, "script exit status 0", r.stderr[-2000:])
# llama-server with a cache a slot (not --kv-unified) of the longest request (8 + 3 tokens) rounded
# up to 256, 128 slots, batches of 2048; started with FA on (probe), off (probe), on again (points)
starts = open(os.path.join(fake, "args")).read().splitlines() if os.path.exists(os.path.join(fake, "args")) else []
check([a.split()[a.split().index("-fa") + 1] if "-fa" in a.split() else None for a in starts] == ["on", "off", "on"],
      "llama-server started FA on, off, then on again", starts)
for a in (x.split() for x in starts):
    check("--kv-unified" not in a and "-c" in a and a[a.index("-c") + 1] == "32768" and
          a[a.index("-ub") + 1] == "2048" and a[a.index("--parallel") + 1] == "128",
          "llama-server's slots, context and batch", a)
jf = os.path.join(out, "serve-glm47flash-2l.json")
check(os.path.exists(jf), "serve-glm47flash-2l.json written", os.listdir(out) if os.path.isdir(out) else None)
if os.path.exists(jf):
    j = json.load(open(jf))
    pts = {p["point"]: p for p in j["servers"].get("mlaserve", {}).get("points", [])}
    check(sorted(pts) == ["c1", "c2", "r1", "r2"], "mlaserve: 2 concurrency and 2 rate points", sorted(pts))
    lpts = {p["point"]: p for p in j["servers"].get("llama-faon", {}).get("points", [])}
    check(sorted(lpts) == ["c1", "c2", "r1", "r2"], "llama-server FA on: the same points", sorted(lpts))
    probes = {k: [p["point"] for p in v["points"]] for k, v in j["servers"].items() if k.startswith("probe")}
    check(probes == {"probe-llama-faon": ["c1"], "probe-llama-faoff": ["c1"]}, "the probe at concurrency 1, FA on and off",
          probes)
    check(j.get("llama_fa_chosen") == "on", "FA on chosen (off is 400 ms a step slower)", j.get("llama_fa_chosen"))
    h = j.get("host") or {}
    check(h.get("cores") == os.cpu_count() and isinstance(h.get("cpu"), str) and h["cpu"], "the host's CPU recorded", h)
    for name, p in lpts.items():
        want = p.get("requests", 0) * (3 if name.startswith("c") else 4)
        check("error" not in p and p["errors"] == 0 and p["output_tokens"] == want, f"llama-server {name}: no error, the asked tokens", p)
    for name, p in pts.items():
        # the tokens each request's usage reports (the chunks may hold fewer: a token whose bytes
        # complete only in the next chunk comes with it)
        want = p.get("requests", 0) * (3 if name.startswith("c") else 4)
        good = "error" not in p and p["errors"] == 0 and p["expected_output_tokens"] == want and \
            p["output_tokens"] == want and p["tokens_from_usage"] == p["requests"] and 0 < p["chunks"] <= want
        check(good, f"{name}: no error, the asked tokens streamed", p)
        sv = p.get("server") or {}
        check(sv.get("ttft") and sv.get("queue") is not None and sv.get("prefill") and sv.get("steps", 0) > 0,
              f"{name}: the server's split of the first token's time (/metrics)", p)
    if "c1" in pts and "error" not in pts["c1"]:
        check(pts["c1"]["requests"] == 2 and pts["c1"]["mode"] == "concurrency 1" and pts["c1"]["prompt_tokens"] == 16,
              "c1: REQ_MIN requests of 8 tokens", pts["c1"])
    if "r1" in pts and "error" not in pts["r1"]:
        check(pts["r1"]["requests"] == 3 and pts["r1"]["shape"] == "6-4", "r1: RATE_REQS requests of SHAPE_R", pts["r1"])
    rates = j.get("rates") or []
    check(len(rates) == 2 and 0 < rates[0] < rates[1], "two rates, the lower first", rates)
    check(pts.get("r2", {}).get("mode") == "rate %g/s" % rates[1] if len(rates) == 2 else False, "r2 at the higher rate")
    notes = " ".join(j["notes"])
    check("FlashAttention on for every point (the better at the concurrency-1 probe" in notes and "ncu not run" in notes,
          "notes: FA on chosen at the probe, ncu off", notes)
    rows = (j.get("bench") or {}).get("rows") or []
    dec = [x for x in rows if x["phase"] == "decode"]
    check(len(dec) == 1 and dec[0]["batch"] == 1 and dec[0]["ctx"] == 16 and dec[0]["bw_frac"] is not None
          and dec[0]["bw_frac"] > 0, "bench: the batch-1 row with its roofline share", rows)
    check([x["prompt"] for x in rows if x["phase"] == "prefill"] == [8], "bench: the prompt step of SHAPE_C's 8 tokens", rows)
    check(j.get("bw_source", "").startswith("assumed, the H200's") and j.get("bw_gbs") == 4208,
          "the roofline's copy rate said to be assumed (CPU backend: nothing measured)", (j.get("bw_source"), j.get("bw_gbs")))
    check(j["experts"] is None and j["layers"] == 2 and "20 heads" in (j.get("mkmodel") or ""), "model described", j.get("mkmodel"))
md = os.path.join(out, "serve-glm47flash-2l.md")
check(os.path.exists(md) and "| c2 | mlaserve |" in open(md).read() and "| c2 | llama-server FA on |" in open(md).read(),
      "table written", r.stdout[-500:])
ratio_md = open(md).read().split("mlaserve / llama-server", 1)[-1] if os.path.exists(md) else ""
check(all(re.search(r"\n\| %s( \([0-9.]+/s\))? \| [0-9.]+x \| [0-9.]+x \| [0-9.]+x \|" % k, ratio_md) for k in ("c1", "c2", "r1", "r2")),
      "a ratio at every point", ratio_md[:800])
split_hdr = "| point | client TTFT | server TTFT | queue | prefill | steps |"
split_md = open(md).read().split(split_hdr, 1)[1] if os.path.exists(md) and split_hdr in open(md).read() else ""
check("\n| c1 | " in split_md and "\n| r2 (" in split_md, "the server's split tabled", r.stdout[-500:])
check("Prompt step of 8 tokens, one sequence alone" in split_md, "the bench's prompt step below it", split_md[-800:])
check("% of 4208 GB/s (assumed, the H200's" in split_md, "the batch-1 step's roofline says where its rate came from",
      split_md[-800:])
tgz = os.path.join(out, "0-serve-logs.tgz")
if os.path.exists(tgz):
    names = tarfile.open(tgz).getnames()
    check(any(n.endswith("glm47flash-2l-mlaserve.log") for n in names) and any(n.endswith("glm47flash-2l-llama-faoff.log") for n in names)
          and any(n.endswith("glm47flash-2l-llama-faon.log") for n in names),
          "logs archived", names)
else:
    check(False, "0-serve-logs.tgz written")
check(not [f for f in os.listdir(bdir) if f.endswith(".gguf")], "the model file deleted", os.listdir(bdir))
if r.returncode != 0:
    print(r.stderr[-3000:])


def rerun(name, **kw):
    """the script again on the same model, env's settings but kw, output in work/name: (status, JSON or None)"""
    o = os.path.join(work, name)
    kw.setdefault("BENCH_ARGS", "--prefill none --batch 1 --ctx 16 --steps 2 --warmup 1 --repeat 1 --heartbeat-timeout-ms 10000")
    p = subprocess.run(["bash", os.path.join(root, "scripts", "gpu_serve_bench.sh")], env=dict(env, OUT=o, **kw),
                       capture_output=True, text=True, timeout=1200)
    f = os.path.join(o, "serve-glm47flash-2l.json")
    if not os.path.exists(f):
        print(p.stdout[-2000:], p.stderr[-2000:])
    return p.returncode, json.load(open(f)) if os.path.exists(f) else None


# ---- 4. a llama-server that exits at once: noted, the script goes on, exit status 1 ----
rc, j2 = rerun("out2", CONC="1", RATES=" ", LLAMA_FA="on", FAKE_LLAMA_FAIL="1")
check(rc == 1 and j2 is not None, "a llama-server that does not start: exit status 1, the JSON written", rc)
if j2:
    check(sorted(j2["servers"]) == ["mlaserve"] and [p["point"] for p in j2["servers"]["mlaserve"]["points"]] == ["c1"],
          "mlaserve's point kept, no llama-server points", j2["servers"].keys())
    check("llama-server -fa on did not start" in " ".join(j2["notes"]) and (j2.get("bench") or {}).get("rows"),
          "noted, and the bench still run", j2["notes"])

# ---- 5. llama-server alone (SERVE=0) at a concurrency and a fixed rate: its points, none of mlaserve's ----
rc, j3 = rerun("out3", CONC="2", RATES="4", SERVE="0", LLAMA_FA="on")
check(rc == 0 and j3 is not None, "llama-server alone: exit status 0, the JSON written", rc)
if j3:
    pts3 = {k: [p["point"] for p in v["points"]] for k, v in j3["servers"].items()}
    check(pts3 == {"llama-faon": ["c2", "r1"]} and j3["rates"] == [4.0], "llama-server's c2 and its point at 4/s alone",
          (pts3, j3["rates"]))
    check("mlaserve not run (SERVE=0)" in j3["notes"], "noted", j3["notes"])
# ---- 6. rates from a given saturation (RATE_TOKS), llama-server alone; a bad RATE_TOKS refused ----
rc, j4 = rerun("out4", CONC=" ", RATE_TOKS="40", SERVE="0", LLAMA_FA="on")
check(rc == 0 and j4 is not None, "llama-server alone at RATE_TOKS's rates: exit status 0, the JSON written", rc)
if j4:
    pts4 = {k: [(p["point"], p.get("mode")) for p in v["points"]] for k, v in j4["servers"].items()}
    check(j4["rates"] == [5.0, 9.0] and pts4 == {"llama-faon": [("r1", "rate 5/s"), ("r2", "rate 9/s")]},
          "0.5 and 0.9 of 40 tok/s over 4-token outputs: 5 and 9 requests/s", (j4["rates"], pts4))
for bad in ("0", "fast", "1e3"):
    p = subprocess.run(["bash", os.path.join(root, "scripts", "gpu_serve_bench.sh")],
                       env=dict(env, OUT=os.path.join(work, "out5"), RATE_TOKS=bad), capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and f"RATE_TOKS must be output tokens a second above 0, not '{bad}'" in p.stderr,
          f"RATE_TOKS={bad} refused by name", (p.returncode, p.stderr[-300:]))
if not mlatest.FAILS:
    shutil.rmtree(work, ignore_errors=True)
finish("gpu_serve_bench: ")
