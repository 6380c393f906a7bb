#!/usr/bin/env bash
# Real-width benchmarks on a GPU host: a synthetic DeepSeek-V3-shaped model
# (`mlaserve mkmodel`, random weights, Q4_K experts, Q8_0 attention, Q6_K embeddings/output),
# written on that machine's disk, then
#   1. `mlaserve bench` (coordinator + worker processes, the CUDA backend): prefill 512 and 4096
#      tokens, decode at batch 1/8/32/128/256 and context 1k/16k, each against its limit (the
#      copy bandwidth the op harness measured in this run, else 4208 GB/s; 790 TFLOP/s bf16)
#   2. llama.cpp on the same file (scripts/llama_side_by_side.sh with the carried .llama-cuda/):
#      one GPU, then llama.cpp's layer split over every GPU of the machine; the decode plot
#      (bench/plot_decode.py) of both
#   3. Nsight Compute on the first kernels of a few decode steps
# Env: BUNDLE (release tree, default .bundle), OUT (default ./out), LAYERS (default 4),
# BENCH_DIR (model folder, default /tmp/mla-bench), OURS_S / LLAMA_S (time bounds in seconds), REPEAT / WARMUP
# (runs of each row, default 2 and 2),
# FAMILY (v3, glm5 or v2lite: the shapes mkmodel writes; outputs are named by it), CAP (sm120 or
# sm100: the rows again under MLA_CUDA_SMEM_CAP and a row-by-row comparison), E2E_ALONE=0 skips
# the mla-e2e decode timing, TPS (tensor-parallel widths, default 1,2 with two GPUs or more, else
# 1), BW_GBS (the copy rate of the roofline where the op harness did not measure one), BACKEND and
# BENCH_ARGS / MKMODEL_ARGS (the dry run below), LLAMA=0 skips llama.cpp (LLAMA_B_S / LLAMA_2_S:
# time bounds of its batched and layer-split runs), NCU=0 skips Nsight Compute (NCU_Q8: the
# MLA_CUDA_Q8 values timed, default 1; NCU_PREFILL=0 skips the 512-token prompt; NCU_SOL=1 the
# speed-of-light section of NCU_COUNT (14) kernels after NCU_SKIP (60); NCU_S its time bound).
# A dry run of the script without a GPU (small model, CPU backend, short lists):
#   BUNDLE=<dir with bin/mlaserve> BACKEND=cpu MKMODEL_ARGS=--small NCU=0 \
#   BENCH_ARGS="--prefill 16 --batch 1,4 --ctx 64 --steps 2" scripts/gpu_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B="$(cd "${BUNDLE:-.bundle}" && pwd)"
W="${BENCH_DIR:-/tmp/mla-bench}"
mkdir -p "$W"
L="${LAYERS:-4}"
F="${FAMILY:-v3}" # v3 | glm5 | v2lite (mkmodel --family)
M="$W/${F}-${L}l-q4k.gguf"
t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 )) s"; }
[ -s "$M" ] || "$B/bin/mlaserve" mkmodel --family "$F" --layers "$L" --mix q4k --split-size 0 ${MKMODEL_ARGS:-} -o "$M" >"$OUT/mkmodel.log" 2>&1 ||
  { tail -5 "$OUT/mkmodel.log"; exit 1; }
echo "model: $M ($(du -h "$M" | cut -f1), $(since))"
# TP 1 and, on a machine with 2+ GPUs, TP 2 over NCCL (one rank per GPU)
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
TPS="${TPS:-$([ "$ngpu" -ge 2 ] && echo 1,2 || echo 1)}"
bw=$(grep -o 'D2D copy [0-9]*' "$OUT/gpu-check.log" 2>/dev/null | awk '{print $3}' | head -1)
bw="${BW_GBS:-${bw:-4208}}" # BW_GBS: a copy rate measured earlier (the op harness did not run in this run)
rc=0
# decode contexts up to 16k + the warm-up and timed steps; 32 timed steps a point, as llama-bench's
# tg32 (with 8, one slow step moved a row by 10%)
# shellcheck disable=SC2086
timeout "${OURS_S:-150}" "$B/bin/mlaserve" bench -m "$M" --backend "${BACKEND:-cuda}" --tp "$TPS" --repeat "${REPEAT:-2}" --warmup "${WARMUP:-2}" \
  ${BENCH_ARGS:---prefill 512,4096 --batch 1,8,32,128,256 --ctx 1024,16384 --steps 32} \
  --bw-gbs "$bw" --tflops 790 --cuda-precision split --json "$OUT/bench-$F.json" --md "$OUT/bench-$F.md" \
  >"$OUT/bench-$F.log" 2>&1 || { rc=1; echo "mlaserve bench: exit status $?"; tail -15 "$OUT/bench-$F.log"; }
cat "$OUT/bench-$F.md" 2>/dev/null
echo "ours done ($(since))"
# CAP=sm120 (or sm100): the same rows again with MLA_CUDA_SMEM_CAP=$CAP (the kernels as that part
# chooses them: shared memory capped, no wgmma), then both row by row (bench/ab_rows.py: the
# capped run's step time over the normal one's) in $OUT/cap-$CAP-$F.md
if [ -n "${CAP:-}" ]; then
  # shellcheck disable=SC2086
  MLA_CUDA_SMEM_CAP="$CAP" timeout "${OURS_S:-150}" "$B/bin/mlaserve" bench -m "$M" --backend "${BACKEND:-cuda}" --tp "$TPS" \
    --repeat "${REPEAT:-2}" --warmup "${WARMUP:-2}" ${BENCH_ARGS:---prefill 512,4096 --batch 1,8,32,128,256 --ctx 1024,16384 --steps 32} \
    --bw-gbs "$bw" --tflops 790 --cuda-precision split --env "MLA_CUDA_SMEM_CAP=$CAP" --json "$OUT/bench-$F-$CAP.json" \
    --md "$OUT/bench-$F-$CAP.md" >"$OUT/bench-$F-$CAP.log" 2>&1 ||
    { rc=1; echo "mlaserve bench (MLA_CUDA_SMEM_CAP=$CAP): exit status $?"; tail -15 "$OUT/bench-$F-$CAP.log"; }
  grep -h "configuration\|self-check passed" "$OUT/bench-$F.log" "$OUT/bench-$F-$CAP.log" 2>/dev/null | head -4
  { echo "# $F: MLA_CUDA_SMEM_CAP=$CAP (B) against the device's own configuration (A)"; echo
    python3 bench/ab_rows.py "$OUT/bench-$F.json" "$OUT/bench-$F-$CAP.json"; } | tee "$OUT/cap-$CAP-$F.md"
  echo "cap $CAP done ($(since))"
fi
# the same model's decode step without the coordinator, the wire and the worker loop: mla-e2e
# (one process, greedy on the host, graphs on), 8-token prompt, 32 tokens; the difference to the
# batch-1 row above is what the serving stack adds per step
if [ -x build-gpu-carried/mla-e2e ] && [ "${E2E_ALONE:-1}" = 1 ]; then
  echo "11 22 33 44 55 66 77 88" >"$W/tok8.txt"
  echo "mla-e2e alone (--split, the engine's default mode): $(MLA_E2E_TIME=1 timeout 120 build-gpu-carried/mla-e2e logits -m "$M" --split \
    --tokens "$W/tok8.txt" --out "$W/l8.f32" --greedy 32 --ids-out "$W/ids8.txt" 2>&1 | grep -E 'timing|graphs' | tr '\n' ' ')"
fi
if [ -x .llama-cuda/run-llama-bench.sh ] && [ "${LLAMA:-1}" = 1 ]; then
  # FlashAttention where the package has its kernels (scripts/build_llama_cuda.sh FA=1), else off
  fa=0
  grep -q "GGML_CUDA_FA=ON" .llama-cuda/README.txt 2>/dev/null && fa=1
  sbs() { timeout "$1" scripts/llama_side_by_side.sh -m "$M" --reps 1 --fa "$fa" "${@:2}" 2>&1 | tail -25; }
  # one GPU: prefill, decode at batch 1 at both contexts, then decode at batch B (llama-batched-bench)
  CUDA_VISIBLE_DEVICES=0 sbs "${LLAMA_S:-110}" -o "$OUT/llama-1gpu-$F" -p 512,4096 -c 1024,16384 --tg 32 --timeout 50 --no-batched
  CUDA_VISIBLE_DEVICES=0 sbs "${LLAMA_B_S:-100}" -o "$OUT/llama-1gpu-batched-$F" -p '' -c 1024 --tg 16 --timeout 90 \
    -b 1,8,32,128,256 --mlaserve "$OUT/bench-$F.json"
  cp "$OUT/llama-1gpu-batched-$F/decode.png" "$OUT/decode-$F.png" 2>/dev/null || true
  # every GPU of the machine: llama.cpp's layer split (its default with several GPUs)
  if [ "$ngpu" -ge 2 ]; then sbs "${LLAMA_2_S:-80}" -o "$OUT/llama-${ngpu}gpu-layer" -p 512,4096 -c 1024 --tg 32 --timeout 40 --no-batched; fi
  echo "llama.cpp done ($(since))"
  python3 bench/compare_llama.py "$OUT/bench-$F.json" "$OUT/llama-1gpu-$F" "$OUT/llama-1gpu-batched-$F" |
    tee "$OUT/compare-$F.md"
else
  echo "llama.cpp: .llama-cuda/ not carried, not run"
fi
# 4. where a decode step's time goes: Nsight Compute's duration of every kernel of mla-e2e on the
# same model (an 8-token prompt, 3 greedy tokens, graphs off so that kernels run one by one),
# summed by kernel over the last complete decode step (bench/ncu_step.py; caches left warm between
# kernels, as in a real step); with the integer GEMV
# (MLA_CUDA_Q8=1) and with the fp32 one (=0). NCU_SOL=1 adds the speed-of-light section of the
# first decode kernels.
if command -v ncu >/dev/null && [ -x build-gpu-carried/mla-e2e ] && [ "${NCU:-1}" = 1 ]; then
  echo "11 22 33 44 55 66 77 88" >"$W/tok.txt"
  e2e=(build-gpu-carried/mla-e2e logits -m "$M" --split --tokens "$W/tok.txt" --out "$W/l.f32" --greedy 3 --ids-out "$W/ids.txt")
  for q in ${NCU_Q8:-1}; do
    MLA_CUDA_Q8=$q MLA_CUDA_GRAPHS=0 timeout "${NCU_S:-100}" ncu --clock-control none --cache-control none --csv \
      --metrics gpu__time_duration.sum "${e2e[@]}" >"$OUT/ncu-step-q8$q.csv" 2>"$OUT/ncu-step-q8$q.err" ||
      echo "ncu (MLA_CUDA_Q8=$q): exit status $?"
    echo "decode step by kernel, MLA_CUDA_Q8=$q:"
    python3 bench/ncu_step.py "$OUT/ncu-step-q8$q.csv" | tee "$OUT/ncu-step-q8$q.md" | head -24
  done
  # the same for a 512-token prompt (the first step of the run: ncu_step.py --step 1 with two
  # greedy tokens), NCU_PREFILL=0 skips it
  if [ "${NCU_PREFILL:-1}" = 1 ]; then
    seq 1000 1511 | tr '\n' ' ' >"$W/tok512.txt"
    MLA_CUDA_GRAPHS=0 timeout "${NCU_S:-100}" ncu --clock-control none --cache-control none --csv \
      --metrics gpu__time_duration.sum build-gpu-carried/mla-e2e logits -m "$M" --split --tokens "$W/tok512.txt" \
      --out "$W/l.f32" --greedy 2 --ids-out "$W/ids.txt" >"$OUT/ncu-prefill.csv" 2>"$OUT/ncu-prefill.err" ||
      echo "ncu (prefill 512): exit status $?"
    echo "prefill step (512 tokens) by kernel:"
    python3 bench/ncu_step.py "$OUT/ncu-prefill.csv" --step 1 | tee "$OUT/ncu-prefill.md" | head -30
  fi
  if [ "${NCU_SOL:-0}" = 1 ]; then
    MLA_CUDA_GRAPHS=0 timeout "${NCU_S:-90}" ncu --clock-control none --section SpeedOfLight \
      -k regex:'gemv|mla_attn|grp|moe|mma' --launch-skip "${NCU_SKIP:-60}" -c "${NCU_COUNT:-14}" "${e2e[@]}" \
      >"$OUT/ncu.txt" 2>&1 || echo "ncu: exit status $?"
    grep -E '^  [a-z_].*\(|Duration|Memory Throughput|Compute \(SM\) Throughput|DRAM Throughput' "$OUT/ncu.txt" | head -80
  fi
  echo "ncu done ($(since))"
fi
# keep the outputs few: all of $OUT also as one archive that
# sorts first
tar czf "/tmp/bench-$F.tgz" -C "$OUT" --exclude='0-*.tgz' . 2>/dev/null && mv "/tmp/bench-$F.tgz" "$OUT/0-bench-$F.tgz"
exit $rc
