#!/usr/bin/env bash
# Two builds side by side on the same files and GPU: `mlaserve bench` of bundle A, then of bundle
# B, model by model (mkmodel files, written here), on the rows of the 24-row table of
# scripts/gpu_bench.sh (prefill 512 and 4096; decode at batch 1 at 1k and 16k; batch 8, 32, 128,
# 256 at 1k), then a table of B / A per row (bench/ab_rows.py). For a change that must not move
# speed (a refactor): A the tree before it, B after. A tree that differs only in its worker: a copy
# of the release tree with that worker as bin/mlaserve-worker.
# Env: A, B (release trees with bin/mlaserve; default .bundle-before and .bundle90), OUT (default
# ./out), FAMILIES (default "v3 glm5 v2lite"): each FAMILY[:LAYERS[:RANK_OF]], LAYERS a count
# (default 4) or "all" (the real depth), RANK_OF what one rank of TP N holds (mkmodel --rank-of),
# e.g. "v2lite:all v3:all:8"; ROUNDS (default 1): every build once a round over each file, a table
# a round; KEEP_FILES (default 1; 0 deletes each file after its rounds: whole models on a small
# disk); BENCH_DIR (default /tmp/mla-bench), RUN_S (time bound of one bench run, default 150),
# BW_GBS (the copy rate for the roofline, default 4250).
# TREES="DIR DIR DIR ..." instead of A and B: more than two builds, labelled A, B, C, ... in that
# order, each compared with the first; a round runs them in order, the next one in reverse (drift
# over a round then falls on every build alike).
# SAME_BITS=1 (for a change meant to keep the arithmetic): before the rounds, every tree's
# `mlaserve logits` of the file (three prompts of vocabulary ids 100-3999, the first 3 tokens in one
# pass, the rest and 12 greedy tokens one at a time, worker processes) is compared byte for byte
# with A's, logits and greedy ids; the file's table says which trees gave the same bits, and a
# tree that did not fails the script.
# A dry run without a GPU: A=<tree> B=<tree> BACKEND=cpu MKMODEL_ARGS=--small
# BENCH_ARGS="--prefill 16 --batch 1,2 --ctx 64 --steps 2" scripts/gpu_ab_bundles.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
if [ -n "${TREES:-}" ]; then read -ra trees <<<"$TREES"; else trees=("${A:-.bundle-before}" "${B:-.bundle90}"); fi
labels=(A B C D E F G H)
[ "${#trees[@]}" -ge 2 ] && [ "${#trees[@]}" -le 8 ] || { echo "gpu_ab_bundles: 2 to 8 trees, not ${#trees[@]}"; exit 1; }
for i in "${!trees[@]}"; do
  trees[i]="$(cd "${trees[i]}" && pwd)" || exit 1
  echo "${labels[i]}: ${trees[i]}"
done
last="${trees[${#trees[@]} - 1]}"
W="${BENCH_DIR:-/tmp/mla-bench}"
mkdir -p "$W"
t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 )) s"; }
rc=0
for spec in ${FAMILIES:-v3 glm5 v2lite}; do
  IFS=: read -r F L N <<<"$spec"
  L="${L:-4}" N="${N:-1}"
  largs=() tag="$F-${L}l"
  [ "$L" = all ] || largs=(--layers "$L")
  [ "$N" = 1 ] || tag="$tag-r$N"
  M="$W/$tag-q4k.gguf"
  [ -s "$M" ] || "$last/bin/mlaserve" mkmodel --family "$F" "${largs[@]}" --rank-of "$N" --mix q4k --split-size 0 \
    ${MKMODEL_ARGS:-} -o "$M" >"$OUT/mkmodel-$tag.log" 2>&1 || { tail -5 "$OUT/mkmodel-$tag.log"; rc=1; continue; }
  : >"$OUT/ab-$tag.md"
  if [ "${SAME_BITS:-0}" = 1 ]; then
    python3 -c "import random; r = random.Random(7)
for n in (9, 23, 40): print(' '.join(str(r.randrange(100, 4000)) for _ in range(n)))" >"$W/bits-tok.txt"
    for i in "${!trees[@]}"; do
      side="${labels[i]}"
      timeout "${RUN_S:-150}" "${trees[i]}/bin/mlaserve" logits -m "$M" --backend "${BACKEND:-cuda}" --processes \
        --tokens "$W/bits-tok.txt" --out "$W/bits-$tag-$side.f32" --decode-from 3 --greedy 12 \
        --ids-out "$W/bits-$tag-$side.txt" >"$OUT/bits-$tag-$side.log" 2>&1 ||
        { rc=1; echo "$tag $side: mlaserve logits exit status $?"; tail -3 "$OUT/bits-$tag-$side.log"; }
      [ "$i" = 0 ] && continue
      if cmp -s "$W/bits-$tag-A.f32" "$W/bits-$tag-$side.f32" && cmp -s "$W/bits-$tag-A.txt" "$W/bits-$tag-$side.txt"; then
        line="$tag: $side gives A's bits ($(stat -c %s "$W/bits-$tag-A.f32") bytes of logits, the same greedy ids)"
      else
        rc=1
        line="$tag: $side DIFFERS from A: logits $(cmp "$W/bits-$tag-A.f32" "$W/bits-$tag-$side.f32" 2>&1 | head -1 |
          sed 's/.*differ: //; s/, line .*//'), greedy ids $(cmp -s "$W/bits-$tag-A.txt" "$W/bits-$tag-$side.txt" &&
          echo same || echo differ)"
      fi
      echo "$line" | tee -a "$OUT/ab-$tag.md"
    done
    rm -f "$W"/bits-"$tag"-*.f32
  fi
  for round in $(seq 1 "${ROUNDS:-1}"); do
    order=("${!trees[@]}")
    [ $((round % 2)) = 0 ] && mapfile -t order < <(printf '%s\n' "${order[@]}" | sort -rn)
    for i in "${order[@]}"; do
      side="${labels[i]}" bin="${trees[i]}"
      # shellcheck disable=SC2086
      timeout "${RUN_S:-150}" "$bin/bin/mlaserve" bench -m "$M" --backend "${BACKEND:-cuda}" --tp 1 --repeat 2 --warmup 2 \
        ${BENCH_ARGS:---prefill 512,4096 --batch 1,8,32,128,256 --ctx 1024,16384 --steps 32} \
        --bw-gbs "${BW_GBS:-4250}" --tflops 790 --json "$OUT/ab-$tag-$side$round.json" >"$OUT/ab-$tag-$side$round.log" 2>&1 ||
        { rc=1; echo "$tag $side: mlaserve bench exit status $?"; tail -5 "$OUT/ab-$tag-$side$round.log"; }
      echo "$tag $side round $round done ($(since))"
    done
    for i in "${!trees[@]}"; do
      [ "$i" = 0 ] && continue
      s="${labels[i]}"
      { echo "$tag, round $round, $s against A:"
        python3 bench/ab_rows.py "$OUT/ab-$tag-A$round.json" "$OUT/ab-$tag-$s$round.json"; } | tee -a "$OUT/ab-$tag.md"
    done
  done
  [ "${KEEP_FILES:-1}" = 1 ] || rm -f "$M"
done
exit $rc
