#!/usr/bin/env bash
# CPU benchmark beside llama.cpp on the same synthetic file (not a test: no timings in ctest).
#
#   bench/cpu_vs_llamacpp.sh [OUT.md]
#
# 1. builds mlaserve (Release, CPU) in build-bench/;
# 2. writes a DeepSeek-V2-Lite-shaped model with `mlaserve mkmodel` (real widths, vocabulary and
#    64 experts; LAYERS layers, default 3: 1 dense + 2 MoE) under $WORK (default /tmp/mlabench);
# 3. builds llama.cpp's CPU llama-bench and llama-completion in $LCPP/build (default /tmp/lcpp)
#    from $LLAMA_SRC (a llama.cpp source tree; never inside this repository and never committed).
#    Without LLAMA_SRC it looks for $LCPP/*/vendor/llama.cpp, the llama.cpp tree that PyPI's
#    llama-cpp-python sdist carries (`pip download --no-deps --no-binary :all: llama-cpp-python`);
# 4. checks that llama.cpp LOADS the file and generates, then compares prefill and decode
#    tokens/s: llama-bench (pp$NP, tg$NG) against `mlaserve generate` (TP=1, $THREADS threads).
# Prints a markdown table (and writes it to OUT.md when given).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/mlabench}
LCPP=${LCPP:-/tmp/lcpp}
LAYERS=${LAYERS:-3}
THREADS=${THREADS:-2}
NP=${NP:-128}
NG=${NG:-32}
MIX=${MIX:-q4k}
OUT=${1:-}
mkdir -p "$WORK" "$LCPP"

echo "== building mlaserve (Release)" >&2
# -O3 makes GCC 12 see a maybe-uninitialized in common/gguf.c (a false positive under -Werror)
cmake -S "$ROOT" -B "$ROOT/build-bench" -G Ninja -DMLA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_FLAGS="-Wno-error=maybe-uninitialized" >/dev/null
ninja -C "$ROOT/build-bench" mlaserve mlaserve-worker >/dev/null
MLA="$ROOT/build-bench/coordinator/mlaserve"

MODEL="$WORK/v2lite-${LAYERS}l-$MIX.gguf"
if [ ! -f "$MODEL" ]; then
  echo "== mkmodel -> $MODEL" >&2
  "$MLA" mkmodel --family v2lite --layers "$LAYERS" --mix "$MIX" -o "$MODEL" 2> "$WORK/mkmodel.log"
fi
SHAPES=$(head -1 "$WORK/mkmodel.log" | sed 's/^mkmodel: //')

if [ -z "${LLAMA_SRC:-}" ]; then
  LLAMA_SRC=$(ls -d "$LCPP"/*/vendor/llama.cpp 2>/dev/null | head -1 || true)
fi
if [ -z "${LLAMA_SRC:-}" ] || [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
  echo "no llama.cpp source: set LLAMA_SRC, or: (cd $LCPP && pip download --no-deps --no-binary :all: llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz)" >&2
  exit 2
fi
if [ ! -x "$LCPP/build/bin/llama-bench" ] || [ ! -x "$LCPP/build/bin/llama-completion" ]; then
  echo "== building llama.cpp (CPU, Release) from $LLAMA_SRC" >&2
  cmake -S "$LLAMA_SRC" -B "$LCPP/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
  ninja -C "$LCPP/build" llama-bench llama-completion >/dev/null
fi
LB="$LCPP/build/bin/llama-bench"
LC="$LCPP/build/bin/llama-completion"
LVER=$(cd "$LLAMA_SRC" && (git rev-parse --short HEAD 2>/dev/null || grep -m1 -o 'version = "[^"]*"' ../../pyproject.toml 2>/dev/null || echo unknown))

echo "== llama.cpp loads the file and generates" >&2
# Weight repacking (extra buffer types: AMX on Sapphire Rapids) aborts in graph scheduling with
# this llama.cpp on AMX CPUs (GGML_ASSERT(*cur_backend_id != -1), the fixtures too): retry without.
REPACK_NOTE="weight repacking on (default)"
LC_ARGS=(); LB_ARGS=()
if ! "$LC" -m "$MODEL" -p "the quick brown fox" -n 16 -t "$THREADS" --temp 0 -no-cnv --no-warmup \
      > "$WORK/llama-completion.out" 2> "$WORK/llama-completion.log"; then
  LC_ARGS=(--no-repack); LB_ARGS=(--repack 0)
  REPACK_NOTE="weight repacking off (--no-repack / --repack 0): with it, this llama.cpp aborts on this CPU"
  "$LC" -m "$MODEL" -p "the quick brown fox" -n 16 -t "$THREADS" --temp 0 -no-cnv --no-warmup "${LC_ARGS[@]}" \
        > "$WORK/llama-completion.out" 2> "$WORK/llama-completion.log" || {
    echo "llama.cpp refused the file:" >&2
    tail -20 "$WORK/llama-completion.log" >&2
    exit 1
  }
fi
GEN_TEXT=$(tr '\n' ' ' < "$WORK/llama-completion.out" | cut -c1-120)

echo "== llama-bench pp$NP tg$NG, $THREADS threads" >&2
"$LB" -m "$MODEL" -t "$THREADS" -p "$NP" -n "$NG" -r 3 "${LB_ARGS[@]}" -o csv > "$WORK/llama-bench.csv" 2> "$WORK/llama-bench.log"
L_PP=$(awk -F, 'NR==1{for(i=1;i<=NF;i++){gsub(/"/,"",$i); h[$i]=i}} NR>1{gsub(/"/,""); if ($h["n_prompt"]>0) print $h["avg_ts"]}' "$WORK/llama-bench.csv")
L_TG=$(awk -F, 'NR==1{for(i=1;i<=NF;i++){gsub(/"/,"",$i); h[$i]=i}} NR>1{gsub(/"/,""); if ($h["n_gen"]>0) print $h["avg_ts"]}' "$WORK/llama-bench.csv")

echo "== mlaserve generate, TP=1, $THREADS threads" >&2
# a prompt of about NP tokens: words of the generated vocabulary (letters), one token each or two
PROMPT=$(python3 -c "
import random
random.seed(1)
print(' ' + ' '.join(''.join(random.choice('etaoinshrd') for _ in range(3)) for _ in range($NP - 1)))")
M_PP=""; M_TG=""; M_NP=""
for rep in 1 2 3; do
  "$MLA" generate -m "$MODEL" -p "$PROMPT" -n "$((NG + 1))" --threads "$THREADS" \
      > "$WORK/mla-generate.out" 2> "$WORK/mla-generate.log"
  line=$(grep "mlaserve generate: prompt" "$WORK/mla-generate.log")
  np=$(echo "$line" | sed -E 's/.*prompt ([0-9]+) tokens.*/\1/')
  pp=$(echo "$line" | sed -E 's/.*tokens in [0-9.]+ s \(([0-9.]+) tokens\/s, first.*/\1/')
  tg=$(echo "$line" | sed -E 's/.* more tokens in [0-9.]+ s \(([0-9.]+) tokens\/s\).*/\1/')
  M_NP=$np
  M_PP=$(python3 -c "print(max([float(x) for x in '$M_PP $pp'.split()]))")
  M_TG=$(python3 -c "print(max([float(x) for x in '$M_TG $tg'.split()]))")
done

COMMIT=$(cd "$ROOT" && git rev-parse --short HEAD)
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
TABLE=$(cat <<EOF
| | prefill tokens/s | decode tokens/s |
|---|---|---|
| mlaserve generate (TP=1, $THREADS threads; prompt $M_NP tokens, $NG generated) | $M_PP | $M_TG |
| llama.cpp llama-bench (-t $THREADS, pp$NP / tg$NG) | $L_PP | $L_TG |

- machine: $CPU, $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u +%Y-%m-%d)
- mlaserve commit $COMMIT (+ working tree); llama.cpp $LVER
- file: $(basename "$MODEL") ($(du -h "$MODEL" | cut -f1)): $SHAPES
- llama.cpp loaded it and generated: "$GEN_TEXT"
- llama.cpp: $REPACK_NOTE
EOF
)
echo "$TABLE"
if [ -n "$OUT" ]; then echo "$TABLE" > "$OUT"; fi
