#!/usr/bin/env bash
# Sampling on the device (kernels/sample_cuda.cu, the CUDA engine's default) checked and measured on
# a GPU, in three steps (docs/cuda.md):
#   1. the op check against the host sampler (mla-gpu-check --sample: 129280 and 154880 tokens, 1
#      and 8 pieces, T 1/8/64, masks, biases, ties; deterministic on a second run; then timed
#      beside the argmax), and the clamp of sampled ids (ids_to_tokens);
#   2. the served comparison on the tiny-deepseek3 fixture (tests/serve/test_ahead_host.py with
#      BACKEND cuda: the step ahead off and queued with the device sampling, and a server that
#      samples on the host, every streamed text the same);
#   3. the batch that motivates it (scripts/gpu_structured.sh: the whole V2-Lite shape, 8, 9 or
#      16 greedy rows beside 0, 1 or 8 JSON-schema, temperature-1 or top_p rows, sampled on the host
#      and on the device), the greedy rows' token gap read from the tables against the all-greedy
#      batch of the same size.
# Input: .gpucarry/ made by scripts/gpu_carry.sh (unpacked here unless build-gpu-carried/ is
# there). Output: $OUT (default ./out), everything also in $OUT/0-sample-out.tgz. About 7 minutes
# on an H200. Env: STEPS (default "1 2 3").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
trap 'tar czf /tmp/sample-out.tgz -C "$OUT" --exclude=0-sample-out.tgz . 2>/dev/null && mv /tmp/sample-out.tgz "$OUT/0-sample-out.tgz"' EXIT
if [ ! -x build-gpu-carried/mla-gpu-check ]; then
  for f in .gpucarry/*.tar.xz; do tar xJf "$f" || { echo "unpack $f failed"; exit 2; }; done
fi
rc=0
for s in ${STEPS:-1 2 3}; do
  case $s in
  1)
    echo "== 1. op check: device sampling against the host sampler"
    timeout 200 build-gpu-carried/mla-gpu-check --sample >"$OUT/sample-check.log" 2>&1 || rc=1
    grep -E "^sample|^sampling|UNEXPLAINED|FORBIDDEN|ids_to_tokens|^\| [0-9]|checks," "$OUT/sample-check.log" ;;
  2)
    echo "== 2. served: device sampling against the host's, tiny-deepseek3"
    timeout 300 python3 tests/serve/test_ahead_host.py .bundle90/bin/mlaserve .bundle90/bin/mlaserve-worker \
      models/tiny-deepseek3-bf16.gguf 1 cuda >"$OUT/sample-served.log" 2>&1 || rc=1
    grep -E "FAIL|step ahead rows|passed" "$OUT/sample-served.log" | cut -c1-200 | head -20 ;;
  3)
    echo "== 3. greedy rows beside sampled ones, host and device sampling"
    ROWS=8,9,16 CONSTRAINED=0,1,8 KINDS=json,sampled,top_p TOKENS=128 AHEAD=queue SAMPLE=host,device OUT="$OUT/structured" \
      timeout 400 scripts/gpu_structured.sh >"$OUT/sample-structured.log" 2>&1 || rc=1
    grep -v "^$" "$OUT/sample-structured.log" | tail -30 ;;
  esac
done
exit $rc
