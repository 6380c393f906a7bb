#!/usr/bin/env bash
# llama_side_by_side.sh - run llama.cpp's own benchmarks on a GPU host, next to
# `mlaserve bench`, with the CUDA build carried in .llama-cuda/ (made by
# scripts/build_llama_cuda.sh; unpacked from .llama-cuda.tar.xz in the repo root if missing).
#
#   scripts/llama_side_by_side.sh [--dry-run] -m MODEL.gguf -o OUTDIR
#        [-p PREFILL_LIST] [-b BATCH_LIST] [-c CTX_LIST] [--tg N] [--fa LIST]
#        [--reps N] [--timeout S] [--per-batch] [--no-batched] [--mlaserve BENCH.json]
#        [-- EXTRA llama-bench ARGS]
#
#   -p   prefill sizes        (default 512,2048,8192)   llama-bench -p P -n 0
#   -c   decode contexts      (default 0,4096)          llama-bench -p 0 -n TG -d C  (batch 1)
#   -b   decode batches       (default 1,2,4,8,16,32,64) llama-batched-bench -npp C -ntg TG -npl B,..
#   --tg decode tokens        (default 128)
#   --fa flash attention      (default 0; "0,1" runs both).  The default package is built
#        with GGML_CUDA_FA=OFF (size): there -fa 1 would run the attention on the CPU, so keep
#        0 (see .llama-cuda/README.txt).  Only with a FA=1 build (f16 K/V kernels) use 1.
#        Caveat: llama.cpp's non-FA MLA path transposes the whole latent cache every layer
#        and step, so its long-context decode is slower than an FA build would be.
#   --reps     llama-bench repetitions (default 3)
#   --timeout  seconds per invocation (default 120): a slow run cannot eat the device budget;
#              results written before a timeout are kept (outputs are flushed per row).
#   --per-batch  one llama-batched-bench invocation per (ctx, batch) instead of per ctx
#   --no-batched skip llama-batched-bench (llama-bench only: batch 1)
#   --mlaserve F  also draw bench/plot_decode.py with this `mlaserve bench --json` file
#   --dry-run  print the commands only (works without a GPU or .llama-cuda/)
#
# Outputs in OUTDIR: llama-bench-pp<P>-fa<F>.json, llama-bench-tg<TG>-d<C>-fa<F>.json
# (llama-bench -o json), batched-ctx<C>-fa<F>[-b<B>].jsonl (llama-batched-bench
# --output-format jsonl; stderr in *.log), commands.txt, summary.md, decode.png (if
# matplotlib is there).  Batched decode uses -pps (the C-token prompt is computed once
# and copied into each sequence's own KV stream), so every sequence decodes at depth C
# like llama-bench -d C; -c is maxB * roundup256(C+TG+1) (one KV stream per sequence).
# EXTRA args after -- go to llama-bench only.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PKG=${LLAMA_CUDA_DIR:-$ROOT/.llama-cuda}
RUN="$PKG/run-llama-bench.sh"

MODEL="" OUT="" DRY=0 PER_BATCH=0 BATCHED=1 MLA_JSON=""
PP_LIST=512,2048,8192 CTX_LIST=0,4096 B_LIST=1,2,4,8,16,32,64 TG=128 FA_LIST=0 REPS=3 TMO=120
EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    -m|--model) MODEL=$2; shift ;;
    -o|--out) OUT=$2; shift ;;
    -p|--prefill) PP_LIST=$2; shift ;;
    -c|--ctx) CTX_LIST=$2; shift ;;
    -b|--batches) B_LIST=$2; shift ;;
    --tg) TG=$2; shift ;;
    --fa) FA_LIST=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --timeout) TMO=$2; shift ;;
    --per-batch) PER_BATCH=1 ;;
    --no-batched) BATCHED=0 ;;
    --mlaserve) MLA_JSON=$2; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$MODEL" ] && [ -n "$OUT" ] || { echo "usage: $0 [--dry-run] -m MODEL.gguf -o OUTDIR [...]" >&2; exit 2; }
if [ $DRY = 0 ] && [ ! -x "$RUN" ] && [ -f "$ROOT/.llama-cuda.tar.xz" ] && [ -z "${LLAMA_CUDA_DIR:-}" ]; then
  echo "== unpacking $ROOT/.llama-cuda.tar.xz" >&2
  (cd "$ROOT" && tar xJf .llama-cuda.tar.xz)
fi
if [ $DRY = 0 ]; then
  [ -x "$RUN" ] || { echo "missing $RUN: unpack .llama-cuda.tar.xz in $ROOT" >&2; exit 1; }
  [ -f "$MODEL" ] || { echo "no model file $MODEL" >&2; exit 1; }
fi
mkdir -p "$OUT"
: > "$OUT/commands.txt"

split() { tr ',' ' ' <<< "$1"; }
q() {  # shell-quote only where needed (readable command log)
  local a out=()
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./,=+:@%-]+$ ]]; then out+=("$a"); else out+=("$(printf '%q' "$a")"); fi
  done
  echo "${out[*]}"
}
max_of() { local m=0 x; for x in $(split "$1"); do [ "$x" -gt "$m" ] && m=$x; done; echo "$m"; }

# run OUTFILE ERRFILE CMD...: timeout-bounded, stdout -> OUTFILE, stderr -> ERRFILE
FAILS=0
run() {
  local of=$1 ef=$2; shift 2
  local cmd=(timeout -k 5 "$TMO" "$@")
  echo "$(q "${cmd[@]}") > $(q "$of") 2> $(q "$ef")" | tee -a "$OUT/commands.txt"
  [ $DRY = 1 ] && return 0
  local t0=$SECONDS rc=0
  "${cmd[@]}" > "$of" 2> "$ef" || rc=$?
  if [ $rc != 0 ]; then
    FAILS=$((FAILS + 1))
    echo "   -> rc=$rc after $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (timeout)'); last lines of $ef:" >&2
    tail -5 "$ef" >&2 || true
  else
    echo "   -> ok in $((SECONDS - t0)) s" >&2
  fi
}

LB=("$RUN" -m "$MODEL" -ngl 99 --repack 0 -r "$REPS")
for fa in $(split "$FA_LIST"); do
  # prefill: one sequence, P prompt tokens
  for p in $(split "$PP_LIST"); do
    run "$OUT/llama-bench-pp$p-fa$fa.json" "$OUT/llama-bench-pp$p-fa$fa.log" \
        "${LB[@]}" -fa "$fa" -p "$p" -n 0 -o json "${EXTRA[@]}"
  done
  # decode at batch 1: TG tokens after a context of C tokens (-d: n_depth)
  for c in $(split "$CTX_LIST"); do
    run "$OUT/llama-bench-tg$TG-d$c-fa$fa.json" "$OUT/llama-bench-tg$TG-d$c-fa$fa.log" \
        "${LB[@]}" -fa "$fa" -p 0 -n "$TG" -d "$c" -o json "${EXTRA[@]}"
  done
  # decode at batch B: B parallel sequences, each at depth C
  if [ $BATCHED = 1 ]; then
    fa_word=$([ "$fa" = 1 ] && echo on || echo off)
    for c in $(split "$CTX_LIST"); do
      if [ $PER_BATCH = 1 ]; then groups=$(split "$B_LIST"); else groups=$B_LIST; fi
      for g in $groups; do
        # per-sequence KV stream: C + TG (+1 for -pps' dummy token), padded to 256 as llama.cpp does
        nkv=$(( $(max_of "$g") * ( (c + TG + 1 + 255) / 256 * 256 ) ))
        sfx=$([ $PER_BATCH = 1 ] && echo "-b$g" || true)
        run "$OUT/batched-ctx$c-fa$fa$sfx.jsonl" "$OUT/batched-ctx$c-fa$fa$sfx.log" \
            "$RUN" --batched -m "$MODEL" -ngl 99 --no-repack -fa "$fa_word" -c "$nkv" -b 2048 -ub 512 \
            -pps -npp "$c" -ntg "$TG" -npl "$g" --output-format jsonl
      done
    done
  fi
done

[ $DRY = 1 ] && { echo "(dry run: nothing executed; commands in $OUT/commands.txt)"; exit 0; }

# summary table (python3 on the GPU host; standard library only)
python3 - "$OUT" > "$OUT/summary.md" <<'EOF'
import glob, json, os, re, sys
out = sys.argv[1]
def objs(path):
    s = open(path, errors="replace").read()
    # C printf nan/-nan/inf (batched-bench prints speed_pp -nan for -npp 0) -> JSON-ish NaN
    s = re.sub(r"(?<=[:\[,\s])(-?)(nan|inf)\b",
               lambda m: "NaN" if m.group(2).lower() == "nan" else m.group(1) + "Infinity", s, flags=re.I)
    dec, i, res = json.JSONDecoder(), 0, []
    while (j := s.find("{", i)) >= 0:
        try:
            v, i = dec.raw_decode(s, j)
            if isinstance(v, dict): res.append(v)
        except json.JSONDecodeError:
            i = j + 1
    return res
rows = []
for f in glob.glob(os.path.join(out, "llama-bench-*.json")):
    for d in objs(f):
        if "avg_ts" not in d: continue
        pp = bool(d.get("n_prompt"))
        test = f"pp{d['n_prompt']}" if pp else f"tg{d['n_gen']}"
        rows.append(((0, not pp, d.get("n_prompt", 0), d.get("n_depth", 0), 1, str(d.get("flash_attn"))),
                     f"| llama-bench | {test} | {d.get('flash_attn')} | 1 | {d.get('n_depth', 0)} | {d['avg_ts']:.1f} ± {d.get('stddev_ts', 0):.1f} |"))
for f in glob.glob(os.path.join(out, "batched-*.jsonl")):
    for d in objs(f):
        if "speed_tg" not in d: continue
        rows.append(((1, True, 0, d["pp"], d["pl"], str(d.get("flash_attn"))),
                     f"| batched-bench | tg{d['tg']} (total) | {d.get('flash_attn')} | {d['pl']} | {d['pp']} | {d['speed_tg']:.1f} |"))
print("| tool | test | fa | batch | ctx/depth | tok/s |\n|---|---|---:|---:|---:|---:|")
for _, line in sorted(rows):
    print(line)
EOF
cat "$OUT/summary.md"
if [ -n "$MLA_JSON" ] || [ $BATCHED = 1 ]; then
  if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 "$ROOT/bench/plot_decode.py" ${MLA_JSON:+--mlaserve "$MLA_JSON"} --llama "$OUT" \
        -o "$OUT/decode.png" > /dev/null || echo "plot failed" >&2
  fi
fi
echo "failed or timed-out invocations: $FAILS"
