#!/usr/bin/env bash
# A long prompt beside short chats on one GPU (bench/long_mix.py): `mlaserve serve` with
# --long-prefill-tokens 0 (a prompt's chunks take every step until its prefill is done) and with
# the default, twice each, on one `mkmodel` file. Prints a JSON line a run.
# Env: FAMILY (mkmodel's, default v2lite), MKMODEL_ARGS (added to mkmodel), LONGS (default
# "32768 100000"), SHORT (chats, 16), VOCAB (token ids below it, 30000), BACKEND (cuda), BUNDLE (default .bundle90; unpacked from
# .gpucarry/bins.tar.xz where missing), MLASERVE (default BUNDLE/bin/mlaserve), M (the model file,
# default /tmp/long-mix.gguf, deleted at the end). A run without a GPU (minutes, on the CPU backend):
#   MLASERVE=build/coordinator/mlaserve BACKEND=cpu MKMODEL_ARGS="--small --hidden 256 --layers 2" \
#   LONGS=600 SHORT=2 VOCAB=4096 scripts/gpu_long_mix.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B="${BUNDLE:-.bundle90}"
S="${MLASERVE:-$B/bin/mlaserve}" M="${M:-/tmp/long-mix.gguf}" W=$(mktemp -d)
[ -x "$S" ] || tar xJf .gpucarry/bins.tar.xz
trap 'rm -rf "$W" "$M"' EXIT
"$S" --version | head -1
"$S" mkmodel --family "${FAMILY:-v2lite}" --mix q4k --split-size 0 ${MKMODEL_ARGS:-} -o "$M" >"$W/mk.log" 2>&1 || { tail -3 "$W/mk.log"; exit 1; }
for rep in 1 2; do
  for form in off default; do
    args=(); [ $form = off ] && args=(--long-prefill-tokens 0)
    rm -f "$W/port"
    "$S" serve -m "$M" --backend "${BACKEND:-cuda}" --port 0 --port-file "$W/port" --max-seqs 128 --no-prefix-cache --stats-interval 0 "${args[@]}" \
      >"$W/serve.log" 2>&1 &
    P=$!
    for _ in $(seq 1 480); do [ -s "$W/port" ] && break; sleep 0.5; done
    [ -s "$W/port" ] || { echo "$form: the server did not start: $(tail -3 "$W/serve.log")"; kill $P; exit 1; }
    port=$(cat "$W/port")
    python3 bench/long_mix.py "$port" 2048 4 "${VOCAB:-30000}" >/dev/null 2>&1 # warm-up
    for L in ${LONGS:-32768 100000}; do
      echo "$form rep $rep long $L: $(python3 bench/long_mix.py "$port" "$L" "${SHORT:-16}" "${VOCAB:-30000}" 2>&1 | tail -1)"
    done
    kill $P
    wait $P 2>/dev/null
  done
done
