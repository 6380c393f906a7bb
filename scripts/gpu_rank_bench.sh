#!/usr/bin/env bash
# The per-rank shapes of TP 8 on one GPU (issue 34): for each model of MODELS,
#   1. `mlaserve mkmodel --rank-of RANK_OF` writes what rank 0 of a TP-RANK_OF deployment holds
#      (heads, routed experts, dense FFN and shared-expert widths and output vocabulary divided;
#      `mlaserve mkmodel --help` says what), at full depth, as a model served at TP 1; its size is
#      checked first with --dry-run against MAX_GIB (default 60) and the disk's free space less
#      3 GiB, and the experts are cut (one a rank at a time until it fits, said in the table)
#      where it would not fit; the step of a batch of 1 reads one expert a token either way;
#   2. `mlaserve bench --backend cuda --prefill none --batch 1 --ctx 1024`: the batch-1 step, the
#      bytes it reads and its share of the HBM roofline at BW_GBS (default 4208 GB/s, the H200's
#      measured copy rate);
#   3. the file is deleted (two full-depth files do not fit a 64 GB disk together).
# Outputs in OUT (default ./out): rank-bench.md (one row a model), rank-<model>.json / .md
# (mlaserve bench's), rank-logs/ (every log).
# MODELS: words FAMILY:LAYERS[:EXPERTS] (EXPERTS: the whole model's routed experts, divided by
# RANK_OF in the file), default "glm5:78:256 v3:61:256".
# Env: BUNDLE (default .bundle90), MLASERVE (default BUNDLE/bin/mlaserve), BACKEND (cuda|cpu),
# BENCH_DIR (default /tmp/mla-rank), RANK_OF (8), MIX (q4k), MAX_GIB (60), BW_GBS (4208),
# MKMODEL_ARGS (added to mkmodel, e.g. --small), BENCH_ARGS (replaces the bench's point),
# TOTAL_S (default 240: a model gets an equal share of what is left; mkmodel and bench each run
# under timeout within it).
# A dry run without a GPU (small files, CPU backend):
#   MLASERVE=build/mlaserve BACKEND=cpu MODELS="glm5:2 v3:2" MKMODEL_ARGS=--small \
#   BENCH_ARGS="--prefill none --batch 1 --ctx 64 --steps 2 --warmup 1 --repeat 1" scripts/gpu_rank_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"
LOGS="$OUT/rank-logs"
mkdir -p "$OUT" "$LOGS"
export NCCL_NVLS_ENABLE=0
B="${BUNDLE:-.bundle90}"
MLA="${MLASERVE:-$B/bin/mlaserve}"
W="${BENCH_DIR:-/tmp/mla-rank}"
mkdir -p "$W"
N="${RANK_OF:-8}"
BW="${BW_GBS:-4208}"
MAXG="${MAX_GIB:-60}"
MODELS="${MODELS:-glm5:78:256 v3:61:256}"
TOTAL="${TOTAL_S:-240}"
T0=$SECONDS
TAB="$OUT/rank-bench.md"
{
  echo "# Batch-1 decode step of one rank of TP $N, on one GPU"
  echo
  echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU'),"\
    "commit $(git rev-parse --short HEAD 2>/dev/null || cat "$B/COMMIT" 2>/dev/null || echo '?'), backend ${BACKEND:-cuda}, roofline $BW GB/s"
  echo "- file: \`mlaserve mkmodel --rank-of $N\` (rank 0's heads, experts, FFN widths, output rows; top-k = ceil(k/$N))"
  echo
  echo "| model | layers | experts in file | file GiB | mkmodel s | step ms (best) | step ms (mean) | MB a step | GB/s | share of roofline |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$TAB"
rc=0
nm=$(echo "$MODELS" | wc -w)
i=0
for spec in $MODELS; do
  IFS=: read -r FAM L X <<<"$spec"
  X="${X:-256}"
  i=$((i + 1))
  left=$((TOTAL - (SECONDS - T0)))
  share=$((left / (nm - i + 1)))
  MK="$FAM-${L}l-rank$N"
  M="$W/$MK.gguf"
  # the file's size first: halve the experts until it fits MAX_GIB
  cut=""
  free_g=$(df -BG --output=avail "$W" | tail -1 | tr -dc 0-9)
  lim=$MAXG
  [ -n "$free_g" ] && [ $((free_g - 3)) -lt "$lim" ] && lim=$((free_g - 3))
  while :; do
    # shellcheck disable=SC2086
    gib=$("$MLA" mkmodel --family "$FAM" --layers "$L" --experts "$X" --rank-of "$N" --mix "${MIX:-q4k}" \
      --split-size 0 ${MKMODEL_ARGS:-} --dry-run 2>&1 >/dev/null | sed -n 's/.*tensors, \([0-9.]*\) GiB.*/\1/p')
    [ -n "$gib" ] || { echo "| $MK | $L | - | - | - | mkmodel --dry-run failed | | | | |" >>"$TAB"; rc=1; continue 2; }
    awk -v g="$gib" -v m="$lim" 'BEGIN { exit !(g > m) }' || break
    [ "$X" -gt "$N" ] || break
    X=$((X - N))
    cut=" (cut to fit $lim GiB)"
  done
  echo "== $MK: $X experts ($((X / N)) a rank)$cut, $gib GiB, $free_g GiB free, ${share} s"
  t=$SECONDS
  # shellcheck disable=SC2086
  if ! timeout -k 5 "$share" "$MLA" mkmodel --family "$FAM" --layers "$L" --experts "$X" --rank-of "$N" \
    --mix "${MIX:-q4k}" --split-size 0 ${MKMODEL_ARGS:-} -o "$M" >"$LOGS/$MK-mkmodel.log" 2>&1; then
    echo "| $MK | $L | $((X / N))$cut | $gib | >$((SECONDS - t)) | mkmodel failed or out of time | | | | |" >>"$TAB"
    tail -3 "$LOGS/$MK-mkmodel.log"
    rm -f "$M"
    rc=1
    continue
  fi
  mk_s=$((SECONDS - t))
  grep -h "^mkmodel: " "$LOGS/$MK-mkmodel.log" | head -3
  bs=$((share - mk_s))
  [ "$bs" -lt 30 ] && bs=30
  # shellcheck disable=SC2086
  timeout -k 5 "$bs" "$MLA" bench -m "$M" --backend "${BACKEND:-cuda}" \
    ${BENCH_ARGS:---prefill none --batch 1 --ctx 1024 --steps 32 --warmup 2 --repeat 2} --bw-gbs "$BW" \
    --json "$OUT/rank-$MK.json" --md "$OUT/rank-$MK.md" >"$LOGS/$MK-bench.log" 2>&1 || {
    echo "mlaserve bench: exit status $? (log: rank-logs/$MK-bench.log)"
    tail -5 "$LOGS/$MK-bench.log"
    rc=1
  }
  rm -f "$M"
  python3 - "$OUT/rank-$MK.json" "$MK" "$L" "$((X / N))$cut" "$gib" "$mk_s" >>"$TAB" <<'EOF'
import json, sys
f, mk, layers, x, gib, mk_s = sys.argv[1:]
try:
    j = json.load(open(f))
    rows = [r for r in j["rows"] if r["phase"] == "decode"]
except Exception as e:  # no JSON: the bench failed before writing it
    print(f"| {mk} | {layers} | {x} | {gib} | {mk_s} | bench failed: {type(e).__name__} | | | | |")
    sys.exit(0)
if not rows:
    print(f"| {mk} | {layers} | {x} | {gib} | {mk_s} | no decode row: {(j.get('error') or '?')[:80]} | | | | |")
fmt = lambda v, p="%.2f": "-" if v is None else p % v
for r in rows:
    bw = r.get("bw_frac")
    print(f"| {mk} | {layers} | {x} | {gib} | {mk_s} | {fmt(r.get('ms_best'))} | {fmt(r.get('ms_mean'))} | "
          f"{fmt(r.get('mb_per_step_rank'), '%.0f')} | {fmt(r.get('gb_s'), '%.0f')} | "
          f"{'-' if bw is None else '%.1f%%' % (100 * bw)} |")
EOF
done
{
  echo
  echo "- MB a step: weights rank 0 reads in a step (one expert a token) + the latent cache (mlaserve bench's model);"
  echo "  a real rank also reads the router's other experts' rows (F32) and runs 2 all-reduces a layer, not in this step"
  echo "- share of roofline = (MB / $BW GB/s) / mean step; total $((SECONDS - T0)) s"
} >>"$TAB"
cat "$TAB"
exit $rc
