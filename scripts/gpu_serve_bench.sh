#!/usr/bin/env bash
# Served load on whole models, mlaserve beside llama.cpp's llama-server on the same file and GPU
# (issue 31). For each model of MODELS:
#   1. `mlaserve mkmodel` writes it on this host's disk (deleted at the end of the model);
#   2. `mlaserve serve` (BACKEND, default cuda; --max-seqs 128, no prefix cache), then
#      bench/serve_load.py (the official openai client) at concurrency CONC (default 1 8 32 128,
#      shape SHAPE_C, default 1k-256) and two Poisson rates (shape SHAPE_R, default chat): RATE_LO
#      and RATE_HI (default 0.5 and 0.9) times the saturation rate, which is the best output tok/s of
#      mlaserve's concurrency points (RATE_TOKS: that many output tok/s instead, e.g. llama-server's
#      own best, so that both servers are offered a load the slower one carries: at mlaserve's rates
#      llama-server falls behind) over the mean output length of SHAPE_R; the
#      same rates, seeds and request sets for every server (RATES="r1 r2" fixes them instead);
#   3. llama-server (.llama-cuda/run-llama-bench.sh with LLAMA_TOOL=llama-server; skipped when the
#      package or its llama-server is absent) with -ngl 99 --parallel 128 -c LLAMA_CTX -b 2048 -ub 2048
#      --cont-batching --no-cache-prompt --cache-ram 0 (a cache of its own a slot, llama-server's default
#      with --parallel: a unified one attends over every slot's positions; batches of up to 2048
#      tokens as mlaserve's steps): FlashAttention on and off at one probe point
#      (the first concurrency of 8 or more), every point with the better of the two (LLAMA_FA_ALL=1: every
#      point with both; LLAMA_FA=on or off: that one alone, no probe, one server start instead of three).
#      FA on only where the package was built with its kernels (README.txt says GGML_CUDA_FA=ON);
#      otherwise -fa on would put the attention on the CPU, and the output says it was skipped;
#   4. `mlaserve bench --batch 1 --ctx 1024` (the whole model's batch-1 step, share of the HBM
#      roofline at BW_GBS, default the copy rate `mla-gpu-check --ceilings` measures on this GPU
#      first, where build-gpu-carried/ holds it (2995-3021 GB/s on an H100, 4208 on an H200), else
#      4208 GB/s; the JSON's bw_source says which), and `--prefill` of
#      SHAPE_C's prompt length (one prompt step alone, beside the served points' first token);
#   5. Nsight Compute on the CUDA logits tool (build-gpu-carried/mla-e2e, graphs off, 3 greedy tokens),
#      bench/ncu_step.py --families: the last complete decode step by kernel and by kernel family;
#      NCU_STALLS=1 also asks for the warp-state metrics and adds ncu_step.py --stalls (what the
#      warps waited on: instruction fetch, memory, barriers), replaying the whole run once a pass
#      (--replay-mode application) so that every kernel runs after the one before it in the step.
# Every point runs under `timeout` (POINT_S, default 150 s, and its --requests); a point that fails
# or times out is recorded with its error, and the script goes on. A model gets MODEL_S seconds
# (default: an equal share of what is left of TOTAL_S, default 570, among the models still to run)
# from the start of its mkmodel: of what is left after mkmodel, mlaserve's points end by 35% (80%
# where llama-server does not run), llama-server's by 80%, then the batch-1 step and ncu; a point or
# stage that does not fit is skipped and recorded as such, so that one model fits one 10-minute command.
# Outputs in OUT (default ./out): serve-<model>.json (every point of every server, the rates, the
# bench row, the kernel families, the host's CPU and cores and llama.cpp's build time there:
# llama-server's small-model figures move between hosts, so a comparison names its host),
# 0-serve-logs.tgz (every log, and serve-<model>.md / .png from bench/plot_serve.py), and those
# tables and plots beside the JSONs while OUT holds fewer than 8 files.
#
# MODELS: words FAMILY[:LAYERS[:EXPERTS]], FAMILY one of mkmodel's (v2lite glm47flash v3 glm5);
# e.g. "v2lite glm47flash v3:61:16 glm5:78:16" (default "v2lite glm47flash").
# Env: BUNDLE (default .bundle90), MLASERVE (default BUNDLE/bin/mlaserve), BACKEND (cuda|cpu),
# BENCH_DIR (model folder, default /tmp/mla-serve), MIX (q4k), MKMODEL_ARGS (added to mkmodel,
# e.g. --small), SERVE_ARGS (added to serve), CONC, SHAPE_C, SHAPE_R, WAVES (requests per concurrency
# point = WAVES x concurrency, at least REQ_MIN: defaults 1 and 4), RATE_S (seconds of arrivals a rate
# point, default 20; RATE_REQS fixes the count), RATE_TOKS (see 2.), SEED (1), POINT_S, START_S
# (server start bound, 420), LLAMA (0: skip llama-server), SERVE (0: skip mlaserve's points, e.g.
# llama-server alone in a command of its own; rate points then need RATES or RATE_TOKS), LLAMA_DIR
# (.llama-cuda), LLAMA_CTX (128 x the longest request of the shapes run, rounded up to 256: 163840
# for 1k-256, 655360 with chat rate points), LLAMA_ARGS (after the defaults: a later --parallel wins),
# BENCH (0: skip the bench step), BENCH_S (its bound, default 150 s), BENCH_ARGS (default "--prefill P
# --batch 1 --ctx 1024 --steps 32 --warmup 2 --repeat 2", P SHAPE_C's prompt tokens, none where SHAPE_C
# is chat), NCU (0: skip),
# NCU_S (180), NCU_STALLS (1: stall reasons), MODEL_S, TOTAL_S.
# Where .bundle90/bin/mlaserve or .llama-cuda/llama-server is missing and its archive of .gpucarry/
# (scripts/gpu_carry.sh: bins.tar.xz, llama-cuda.tar.xz) is there, it is unpacked first (llama-src.tar.xz,
# gpu_carry.sh LLAMA_SRC=1: llama.cpp is built here first, before TOTAL_S starts, at most LLAMA_BUILD_S
# seconds, default 420; 175 s on an H100 host's 16 cores); where Python lacks the openai
# module, it is installed from .gpucarry/wheels.tar.
# A dry run on a machine without a GPU (tests/bench/test_gpu_serve_bench.py does this):
#   MLASERVE=build/coordinator/mlaserve BACKEND=cpu MKMODEL_ARGS="--small --hidden 256" MODELS=glm47flash:2 \
#   CONC="1 2" SHAPE_C=8-3 SHAPE_R=6-4 REQ_MIN=2 RATE_REQS=3 NCU=0 \
#   BENCH_ARGS="--prefill none --batch 1 --ctx 16 --steps 2" \
#   scripts/gpu_serve_bench.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export NCCL_NVLS_ENABLE=0
# what scripts/gpu_carry.sh packed, each archive where its part is not unpacked yet (a host that kept
# the bundle from an earlier command may lack the llama.cpp package): bins (bundle, mla-e2e), llama.cpp
if [ ! -x "${MLASERVE:-${BUNDLE:-.bundle90}/bin/mlaserve}" ] && [ -f .gpucarry/bins.tar.xz ]; then
  tar xJf .gpucarry/bins.tar.xz || echo "unpack .gpucarry/bins.tar.xz failed"
fi
if [ -x "${LLAMA_DIR:-.llama-cuda}/llama-server" ]; then :
elif [ -f .gpucarry/llama-cuda.tar.xz ]; then
  tar xJf .gpucarry/llama-cuda.tar.xz || echo "unpack .gpucarry/llama-cuda.tar.xz failed"
elif [ -f .gpucarry/llama-src.tar.xz ]; then
  # llama.cpp's source (gpu_carry.sh LLAMA_SRC=1): built here with FlashAttention, bounded by LLAMA_BUILD_S
  # (default 420 s); its log in OUT/llama-build.log
  t=$SECONDS
  rm -rf /tmp/mla-llama-src && mkdir -p /tmp/mla-llama-src && tar xJf .gpucarry/llama-src.tar.xz -C /tmp/mla-llama-src &&
    FA=1 LLAMA_SRC=/tmp/mla-llama-src/llama.cpp BUILD_DIR=/tmp/mla-llama-build JOBS="$(nproc)" NICE=0 PACK=0 STATIC=1 \
      CUDA_HOME="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")" \
      timeout "${LLAMA_BUILD_S:-420}" scripts/build_llama_cuda.sh >"$OUT/llama-build.log" 2>&1
  st=$?
  LLAMA_BUILT_S=$((SECONDS - t))
  echo "llama.cpp built from source: status $st in $LLAMA_BUILT_S s (log: $OUT/llama-build.log)"
fi
B="$(cd "${BUNDLE:-.bundle90}" 2>/dev/null && pwd || echo "${BUNDLE:-.bundle90}")"
MLA="${MLASERVE:-$B/bin/mlaserve}"
BACKEND="${BACKEND:-cuda}"
W="${BENCH_DIR:-/tmp/mla-serve}"
LOGS="$W/logs"
REP="$W/report"
rm -rf "$LOGS" "$REP"
mkdir -p "$W" "$LOGS" "$REP"
MODELS="${MODELS:-v2lite glm47flash}"
CONC="${CONC:-1 8 32 128}"
SHAPE_C="${SHAPE_C:-1k-256}"
SHAPE_R="${SHAPE_R:-chat}"
SEED="${SEED:-1}"
# a shape's prompt and output tokens (bench/serve_load.py shape_of; chat: its largest, 4000 and 1000)
shape_lens() {
  case "$1" in
    chat) echo 4000 1000 ;;
    1k-256) echo 1024 256 ;;
    8k-1k) echo 8192 1024 ;;
    *) echo "${1%%-*} ${1##*-}" ;;
  esac
}
# PIN: the prompt tokens of SHAPE_C's requests, for the bench's prompt step (none for chat);
# llama-server's context a slot: the longest request of the shapes the run sends (SHAPE_R only
# where rate points run), rounded up to 256; LLAMA_CTX is 128 slots of it
read -r PIN POUT <<<"$(shape_lens "$SHAPE_C")"
SLOT_NEED=$((PIN + POUT))
[ "$SHAPE_C" = chat ] && PIN=none
if [ -z "${RATES:-}" ] || [[ "${RATES:-}" == *[0-9]* ]]; then
  read -r RIN ROUT <<<"$(shape_lens "$SHAPE_R")"
  [ $((RIN + ROUT)) -gt "$SLOT_NEED" ] && SLOT_NEED=$((RIN + ROUT))
fi
LLAMA_CTX="${LLAMA_CTX:-$((128 * ((SLOT_NEED + 255) / 256 * 256)))}"
POINT_S="${POINT_S:-150}"
START_S="${START_S:-420}"
TOTAL_END=$(($(date +%s) + ${TOTAL_S:-570}))
LL="${LLAMA_DIR:-$ROOT/.llama-cuda}"
# the roofline's copy rate: BW_GBS, else measured here by the op harness (a 2 GiB device copy), else the
# H200's; BW_SRC says which (in every model's JSON, bw_source)
BW="${BW_GBS:-}" BW_SRC="BW_GBS" BW_WHY="no op harness in build-gpu-carried/"
if [ -z "$BW" ] && [ "$BACKEND" = cuda ] && [ -x build-gpu-carried/mla-gpu-check ]; then
  BW=$(timeout 60 build-gpu-carried/mla-gpu-check --ceilings 2>/dev/null | sed -n 's/^ceiling: D2D copy \([0-9]*\) GB.*/\1/p')
  BW_SRC="measured on this GPU (mla-gpu-check --ceilings)" BW_WHY="mla-gpu-check --ceilings failed"
fi
[ -n "$BW" ] || BW=4208 BW_SRC="assumed, the H200's ($BW_WHY)"
T0=$(date +%s)
since() { echo "$(($(date +%s) - T0)) s"; }
log() { echo "[$(since)] $*"; }
[ -x "$MLA" ] || { echo "no mlaserve at $MLA (BUNDLE or MLASERVE)" >&2; exit 2; }
[ -f bench/serve_load.py ] || { echo "run from the repository (bench/serve_load.py)" >&2; exit 2; }
[ -z "${RATE_TOKS:-}" ] || awk -v v="$RATE_TOKS" 'BEGIN { exit !(v ~ /^[0-9]+([.][0-9]+)?$/ && v + 0 > 0) }' ||
  { echo "RATE_TOKS must be output tokens a second above 0, not '${RATE_TOKS}'" >&2; exit 2; }
# the openai client (bench/serve_load.py) from the wheels scripts/gpu_carry.sh packed, where this
# host's Python lacks it and has no network
if ! python3 -c "import openai" 2>/dev/null && [ -f .gpucarry/wheels.tar ]; then
  tar xf .gpucarry/wheels.tar -C "$W" &&
    { python3 -m pip install -q --no-index --find-links "$W/wheels" openai ||
      python3 -m pip install -q --break-system-packages --no-index --find-links "$W/wheels" openai; } >"$W/pip.log" 2>&1 ||
    { echo "installing openai from .gpucarry/wheels.tar failed:" >&2; tail -3 "$W/pip.log" >&2; }
fi
# the commit the binaries were built from (their --version), not the checkout's
COMMIT=$("$MLA" --version 2>/dev/null | sed -n 's/.*commit \([0-9a-f]*[-a-z]*\).*/\1/p')
COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU="${GPU:-none ($BACKEND backend)}"
rc=0

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# vocabulary size of a family (after MKMODEL_ARGS: --small writes 4096, --vocab N overrides)
vocab_of() {
  local v
  case "$1" in v3) v=129280 ;; glm5 | glm47flash) v=154880 ;; v2lite) v=102400 ;; *) v=4096 ;; esac
  case " ${MKMODEL_ARGS:-} " in *" --small "*) v=4096 ;; esac
  local n
  n=$(sed -n 's/.*--vocab[ =]\([0-9]*\).*/\1/p' <<<"${MKMODEL_ARGS:-}")
  [ -n "$n" ] && v=$n
  echo "$v"
}

# point SERVER_KEY URL NAME ARGS...: one serve_load.py run, its JSON (or its failure) in $PTS
point() {
  local key=$1 url=$2 name=$3
  shift 3
  local f="$PTS/$key--$name.json" t=$SECONDS prc=0 lim=$POINT_S
  local stage_left=$((STAGE_END - $(date +%s)))
  [ "$stage_left" -lt "$lim" ] && lim=$stage_left
  if [ "$lim" -lt 10 ]; then
    printf '{"label": "%s %s", "mode": "%s", "error": "not run: out of the stage'"'"'s time", "rc": -1}\n' "$key" "$name" "$name" >"$f"
    echo "    $key $name: not run (out of the stage's time)"
    return
  fi
  timeout -k 10 "$lim" python3 bench/serve_load.py --base-url "$url" --vocab "$VOCAB" --seed "$SEED" \
    --timeout "$lim" --label "$key $name" --json "$f.tmp" "$@" >>"$LOGS/$MK-load.log" 2>&1 || prc=$?
  if [ -s "$f.tmp" ]; then
    mv "$f.tmp" "$f"
  else
    rm -f "$f.tmp"
    local why="exit status $prc"
    [ "$prc" = 124 ] || [ "$prc" = 137 ] && why="timed out after $lim s"
    printf '{"label": "%s %s", "mode": "%s", "error": "%s", "rc": %d}\n' "$key" "$name" "$name" "$why" "$prc" >"$f"
    rc=1
  fi
  python3 - "$f" "$((SECONDS - t))" <<'EOF' | sed 's/^/    /'
import json, sys
j = json.load(open(sys.argv[1]))
if "error" in j:
    print(f"{j['label']}: FAILED ({j['error']}, {sys.argv[2]} s)")
else:
    print(f"{j['label']}: {j['output_tok_per_s']:.1f} tok/s, {j['requests_per_s']:.2f} req/s, TTFT p50 "
          f"{j['ttft_ms']['p50'] or 0:.1f} ms, ITL p50/p99 {j['itl_ms']['p50'] or 0:.2f}/{j['itl_ms']['p99'] or 0:.2f} ms, "
          f"{j['errors']} errors ({sys.argv[2]} s)")
    sv = j.get("server")
    if sv:  # where the first token's time went, as the server saw it (serve_load.py)
        print(f"  server: TTFT mean {sv['ttft']:.1f} ms = queue {sv['queue']:.1f} + prefill {sv['prefill']:.1f}; "
              f"client TTFT mean {j['ttft_ms']['mean']:.1f} ms; {sv['steps']} steps")
EOF
}

# the concurrency points and then the rate points of one server at URL
run_points() {
  local key=$1 url=$2 which=${3:-all} c n
  if [ "$which" != rates ]; then
    for c in $CONC; do
      n=$((c * ${WAVES:-1}))
      [ "$n" -lt "${REQ_MIN:-4}" ] && n=${REQ_MIN:-4}
      point "$key" "$url" "c$c" --concurrency "$c" --requests "$n" --shape "$SHAPE_C"
    done
  fi
  if [ "$which" != conc ]; then
    local i=0 r
    for r in $RATES_USED; do
      i=$((i + 1))
      point "$key" "$url" "r$i" --rate "$r" --requests "$(rate_reqs "$r")" --shape "$SHAPE_R"
    done
  fi
}
rate_reqs() { # requests of a rate point: RATE_S seconds of arrivals, 8..512 (RATE_REQS fixes it)
  if [ -n "${RATE_REQS:-}" ]; then echo "$RATE_REQS"; return; fi
  python3 -c "import sys; print(max(8, min(512, round(float(sys.argv[1]) * float(sys.argv[2])))))" "$1" "${RATE_S:-20}"
}

# the rates: RATES, else RATE_LO / RATE_HI x (RATE_TOKS, else the best output tok/s of mlaserve's
# concurrency points, / the mean output length of SHAPE_R, from 64 draws of serve_load.py's shape_of)
pick_rates() {
  if [ -n "${RATES:-}" ]; then echo "$RATES"; return; fi
  python3 - "$PTS" "$SHAPE_R" "$SEED" "${RATE_LO:-0.5}" "${RATE_HI:-0.9}" 64 "${RATE_TOKS:-}" <<'EOF'
import glob, json, random, sys
sys.path.insert(0, "bench")
import serve_load
pts, shape, seed, lo, hi, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
best = float(sys.argv[7]) if sys.argv[7] else 0.0
for f in ([] if sys.argv[7] else glob.glob(pts + "/mlaserve--c*.json")):
    j = json.load(open(f))
    if "error" not in j and j.get("errors", 1) == 0:
        best = max(best, j["output_tok_per_s"] or 0.0)
rnd = random.Random(seed)
outs = [serve_load.shape_of(shape, rnd)[1] for _ in range(n)]
mean = sum(outs) / len(outs)
sat = best / mean if best > 0 else 1.0
print("%.3g %.3g" % (max(0.01, lo * sat), max(0.02, hi * sat)))
EOF
}

SPID=""
stop_server() { # the server and its children (mlaserve's workers), so that the GPU is free after it
  [ -n "$SPID" ] || return 0
  local kids k
  kids=$(pgrep -P "$SPID" 2>/dev/null | tr '\n' ' ')
  kill -TERM "$SPID" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$SPID" 2>/dev/null
  wait "$SPID" 2>/dev/null
  for k in $kids; do
    for _ in $(seq 1 100); do kill -0 "$k" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$k" 2>/dev/null
  done
  SPID=""
}
trap 'stop_server; exit 130' INT TERM

start_lim() { # a server's start-up bound: START_S, or what is left of the stage
  local l=$((STAGE_END - $(date +%s)))
  if [ "$l" -lt "$START_S" ]; then echo "$l"; else echo "$START_S"; fi
}
start_mlaserve() { # sets PORT (empty: failed) and START
  local t=$SECONDS lim
  lim=$(start_lim)
  rm -f "$W/port"
  # shellcheck disable=SC2086
  "$MLA" serve -m "$M" --backend "$BACKEND" --port 0 --port-file "$W/port" --max-seqs 128 --no-prefix-cache \
    --stats-interval 0 --drain-timeout 5 ${SERVE_ARGS:-} >"$LOGS/$MK-mlaserve.log" 2>&1 &
  SPID=$!
  PORT=""
  while [ $((SECONDS - t)) -lt "$lim" ]; do
    [ -s "$W/port" ] && { PORT=$(cat "$W/port"); break; }
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.2
  done
  START=$((SECONDS - t))
  [ -n "$PORT" ] || { stop_server; tail -5 "$LOGS/$MK-mlaserve.log" | sed 's/^/    /'; }
}

start_llama() { # FA(on|off): sets PORT (empty: failed) and START
  local fa=$1 t=$SECONDS p lim
  lim=$(start_lim)
  p=$(free_port)
  # shellcheck disable=SC2086
  LLAMA_TOOL=llama-server "$LL/run-llama-bench.sh" -m "$M" -ngl 99 -fa "$fa" --parallel 128 \
    -c "$LLAMA_CTX" -b 2048 -ub 2048 --cont-batching --no-cache-prompt --cache-ram 0 --host 127.0.0.1 --port "$p" \
    --no-webui ${LLAMA_ARGS:-} >"$LOGS/$MK-llama-fa$fa.log" 2>&1 &
  SPID=$!
  PORT=""
  while [ $((SECONDS - t)) -lt "$lim" ]; do
    if curl -sf "http://127.0.0.1:$p/health" >/dev/null 2>&1; then PORT=$p; break; fi
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.5
  done
  START=$((SECONDS - t))
  [ -n "$PORT" ] || { stop_server; tail -5 "$LOGS/$MK-llama-fa$fa.log" | sed 's/^/    /'; }
}

# left(): seconds left of the model's budget; fits S: whether a stage bounded by S seconds fits
left() { echo $((MODEL_T0 + MODEL_BUDGET - $(date +%s))); }
fits() { [ "$(left)" -ge "$1" ]; }
note() { echo "$*" >>"$PTS/notes.txt"; log "$*"; }

have_llama=0
if [ "${LLAMA:-1}" = 1 ] && [ -x "$LL/run-llama-bench.sh" ] && [ -x "$LL/llama-server" ]; then have_llama=1; fi
fa_kernels=0
grep -q "GGML_CUDA_FA=ON" "$LL/README.txt" 2>/dev/null && fa_kernels=1

n_left=$(echo "$MODELS" | wc -w)
for spec in $MODELS; do
  IFS=: read -r FAM LAYERS EXPERTS <<<"$spec"
  MODEL_BUDGET=${MODEL_S:-$(((TOTAL_END - $(date +%s)) / n_left))}
  n_left=$((n_left - 1))
  MK="$FAM${LAYERS:+-${LAYERS}l}${EXPERTS:+-${EXPERTS}x}"
  PTS="$W/pts-$MK"
  rm -rf "$PTS"
  mkdir -p "$PTS"
  MODEL_T0=$(date +%s)
  VOCAB=$(vocab_of "$FAM")
  M="$W/$MK.gguf"
  margs=(mkmodel --family "$FAM" --mix "${MIX:-q4k}" --split-size 0 -o "$M")
  [ -n "$LAYERS" ] && margs+=(--layers "$LAYERS")
  [ -n "$EXPERTS" ] && margs+=(--experts "$EXPERTS")
  # shellcheck disable=SC2206
  margs+=(${MKMODEL_ARGS:-})
  log "== $MK ($MODEL_BUDGET s): mkmodel ${margs[*]:1}"
  t=$SECONDS
  if ! timeout -k 10 "${MKMODEL_S:-300}" "$MLA" "${margs[@]}" >"$LOGS/$MK-mkmodel.log" 2>&1; then
    note "mkmodel failed: $(tail -2 "$LOGS/$MK-mkmodel.log" | tr '\n' ' ')"
    rm -f "$M"
    rc=1
  else
    echo "$((SECONDS - t))" >"$PTS/mkmodel_s"
    grep -h "^mkmodel: .* tensors" "$LOGS/$MK-mkmodel.log" >"$PTS/mkmodel.txt"
    log "$(cat "$PTS/mkmodel.txt") ($(du -h "$M" | cut -f1), $((SECONDS - t)) s)"
  fi
  RATES_USED=""
  if [ -s "$M" ]; then
    # what is left of the model's time: mlaserve's points end by 35% of it (80% where llama-server
    # does not run), llama-server's by 80% (two starts and a probe more), the batch-1 step and ncu
    # have the rest
    R=$(left)
    OURS_END=$(($(date +%s) + R * (have_llama ? 35 : 80) / 100))
    LLAMA_END=$(($(date +%s) + R * 80 / 100))
    STAGE_END=$OURS_END
    # mlaserve
    if [ "${SERVE:-1}" = 0 ]; then
      note "mlaserve not run (SERVE=0)"
    else
      start_mlaserve
      echo "$START" >"$PTS/mlaserve.start_s"
      if [ -n "$PORT" ]; then
        log "mlaserve serve up in $START s on port $PORT"
        run_points mlaserve "http://127.0.0.1:$PORT/v1" conc
        RATES_USED=$(pick_rates)
        log "rates: $RATES_USED requests/s"
        run_points mlaserve "http://127.0.0.1:$PORT/v1" rates
        stop_server
      else
        note "mlaserve serve did not start in $START s (log: $MK-mlaserve.log)"
        rc=1
      fi
    fi
    if [ -z "$RATES_USED" ]; then # mlaserve not run: the given rates, or those of RATE_TOKS
      if [ -n "${RATE_TOKS:-}" ]; then RATES_USED=$(pick_rates); else RATES_USED="${RATES:-}"; fi
    fi
    echo "$RATES_USED" >"$PTS/rates.txt" # the rates every server ran (the JSON's rates)
    STAGE_END=$LLAMA_END
    # llama-server
    if [ "$have_llama" = 0 ]; then
      note "llama-server not run: $([ "${LLAMA:-1}" = 1 ] && echo "no $LL/llama-server" || echo "LLAMA=0")"
    elif [ $((LLAMA_END - $(date +%s))) -lt 120 ]; then
      note "llama-server not run: out of the model's time ($(left) s left)"
    else
      fas="off" all=${LLAMA_FA_ALL:-0}
      if [ "$fa_kernels" = 1 ]; then fas="on off"; else note "llama-server FA on not run: the package has no FlashAttention kernels"; fi
      case "${LLAMA_FA:-}" in
        on) [ "$fa_kernels" = 1 ] && fas=on; all=1 ;;
        off) fas=off all=1 ;;
      esac
      [ -n "${LLAMA_FA:-}" ] && note "llama-server: FlashAttention $fas only (LLAMA_FA=$LLAMA_FA), no probe"
      probe=$(echo "$CONC" | tr ' ' '\n' | awk '$1 >= 8' | head -1)
      probe=${probe:-$(echo "$CONC" | awk '{print $1}')}
      best_fa="" best=-1 live=""
      for fa in $fas; do
        [ $((LLAMA_END - $(date +%s))) -ge 60 ] || { note "llama-server FA $fa not run: out of time"; continue; }
        start_llama "$fa"
        echo "$START" >"$PTS/llama-fa$fa.start_s"
        [ -n "$PORT" ] || { note "llama-server -fa $fa did not start in $START s (log: $MK-llama-fa$fa.log)"; rc=1; continue; }
        log "llama-server -fa $fa up in $START s"
        if [ "$all" = 1 ]; then
          run_points "llama-fa$fa" "http://127.0.0.1:$PORT/v1"
          stop_server
          continue
        fi
        n=$((probe * ${WAVES:-1}))
        [ "$n" -lt "${REQ_MIN:-4}" ] && n=${REQ_MIN:-4}
        point "probe-llama-fa$fa" "http://127.0.0.1:$PORT/v1" "c$probe" --concurrency "$probe" --requests "$n" --shape "$SHAPE_C"
        v=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(int(j.get("output_tok_per_s") or 0) if "error" not in j and j.get("errors", 1) == 0 else 0)' \
          "$PTS/probe-llama-fa$fa--c$probe.json" 2>/dev/null || echo 0)
        live=""
        if [ "$v" -gt "$best" ]; then best=$v best_fa=$fa live=$fa; else stop_server; fi
        [ -n "$live" ] && [ "$fa" != "${fas##* }" ] && { stop_server; live=""; } # not the last: start it again later
      done
      if [ "$all" != 1 ] && [ -n "$best_fa" ]; then
        echo "$best_fa" >"$PTS/best-fa"
        note "llama-server: FlashAttention $best_fa for every point (the better at the concurrency-$probe probe, $best tok/s; $(echo "$fas" | wc -w) tried)"
        if [ -z "$live" ]; then
          if [ $((LLAMA_END - $(date +%s))) -ge 60 ]; then start_llama "$best_fa"; else PORT=""; note "llama-server points not run: out of time"; fi
          [ -n "$PORT" ] || { note "llama-server -fa $best_fa: no server for the points"; rc=1; }
        fi
        [ -n "$PORT" ] && run_points "llama-fa$best_fa" "http://127.0.0.1:$PORT/v1"
        stop_server
      fi
    fi
    # the batch-1 step of the whole model
    if [ "${BENCH:-1}" != 1 ]; then
      note "mlaserve bench not run (BENCH=0)"
    elif fits 60; then
      bs=$((${BENCH_S:-150} < $(left) ? ${BENCH_S:-150} : $(left)))
      # shellcheck disable=SC2086
      timeout -k 10 "$bs" "$MLA" bench -m "$M" --backend "$BACKEND" \
        ${BENCH_ARGS:---prefill $PIN --batch 1 --ctx 1024 --steps 32 --warmup 2 --repeat 2} --bw-gbs "$BW" \
        --json "$PTS/bench.json" --md "$PTS/bench.md" >"$LOGS/$MK-bench.log" 2>&1 ||
        { note "mlaserve bench: exit status $? (log: $MK-bench.log)"; rc=1; }
      [ -s "$PTS/bench.md" ] && sed 's/^/    /' "$PTS/bench.md"
    else
      note "mlaserve bench not run: out of the model's time ($(left) s left)"
    fi
    # where the batch-1 step goes: Nsight Compute on mla-e2e
    if [ "${NCU:-1}" != 1 ]; then
      note "ncu not run (NCU=0)"
    elif ! command -v ncu >/dev/null || [ ! -x build-gpu-carried/mla-e2e ]; then
      note "ncu not run: no ncu or no build-gpu-carried/mla-e2e"
    elif ! fits 90; then
      note "ncu not run: out of the model's time ($(left) s left)"
    else
      echo "11 22 33 44 55 66 77 88" >"$W/tok8.txt"
      ns=$((${NCU_S:-180} < $(left) ? ${NCU_S:-180} : $(left)))
      metrics=gpu__time_duration.sum replay=() stalls=()
      if [ "${NCU_STALLS:-0}" = 1 ]; then
        metrics+=",$(python3 bench/ncu_step.py --stall-metrics)" replay=(--replay-mode application) stalls=(--stalls)
      fi
      MLA_CUDA_GRAPHS=0 timeout -k 10 "$ns" ncu --clock-control none --cache-control none "${replay[@]}" --csv \
        --metrics "$metrics" build-gpu-carried/mla-e2e logits -m "$M" --split --tokens "$W/tok8.txt" \
        --out "$W/l8.f32" --greedy 3 --ids-out "$W/ids8.txt" >"$W/ncu-$MK.csv" 2>"$LOGS/$MK-ncu.err" ||
        note "ncu: exit status $? (log: $MK-ncu.err)"
      python3 bench/ncu_step.py "$W/ncu-$MK.csv" --families "${stalls[@]}" --json "$PTS/ncu.json" >"$PTS/ncu.md" \
        2>>"$LOGS/$MK-ncu.err" &&
        sed -n '1,/^$/p' "$PTS/ncu.md" | sed 's/^/    /'
      gzip -c "$W/ncu-$MK.csv" >"$LOGS/ncu-$MK.csv.gz" 2>/dev/null
    fi
  fi
  rm -f "$M" "$W/l8.f32" "$W/ncu-$MK.csv"
  # one JSON for the model
  python3 - "$PTS" "$OUT/serve-$MK.json" "$MK" "$FAM" "${LAYERS:-}" "${EXPERTS:-}" "$COMMIT" "$GPU" "$BACKEND" \
    "${MKMODEL_ARGS:-}" "$SHAPE_C" "$SHAPE_R" "$SEED" "$BW" "$BW_SRC" "${LLAMA_BUILT_S:-}" <<'EOF'
import glob, json, os, sys, time
pts, out, mk, fam, layers, experts, commit, gpu, backend, margs, shape_c, shape_r, seed, bw, bw_src, lbuilt = sys.argv[1:17]
# the host's CPU: llama-server's small-model figures move between hosts, so a comparison names its host
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None) \
    if os.path.exists("/proc/cpuinfo") else None
def rd(name, conv=str):
    p = os.path.join(pts, name)
    return conv(open(p).read().strip()) if os.path.exists(p) and open(p).read().strip() else None
res = {"model": mk, "family": fam, "layers": int(layers) if layers else None,
       "experts": int(experts) if experts else None, "mkmodel_args": margs, "commit": commit, "gpu": gpu,
       "backend": backend, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
       "shape_concurrency": shape_c, "shape_rate": shape_r, "seed": int(seed), "bw_gbs": float(bw), "bw_source": bw_src,
       "mkmodel": rd("mkmodel.txt"), "mkmodel_s": rd("mkmodel_s", int),
       "rates": [float(x) for x in (rd("rates.txt") or "").split()],
       "llama_fa_chosen": rd("best-fa"), "notes": (rd("notes.txt") or "").splitlines(), "servers": {},
       "host": {"cpu": cpu, "cores": os.cpu_count()}, "llama_build_s": int(lbuilt) if lbuilt else None}
for f in sorted(glob.glob(os.path.join(pts, "*--*.json"))):
    key, name = os.path.basename(f)[:-5].split("--", 1)
    j = json.load(open(f))
    j["point"] = name
    srv = res["servers"].setdefault(key, {"points": []})
    srv["points"].append(j)
for key, srv in res["servers"].items():
    s = rd(key.replace("probe-", "") + ".start_s", int)
    if s is not None:
        srv["start_s"] = s
    order = lambda p: (p["point"][0] != "c", int(p["point"][1:]) if p["point"][1:].isdigit() else 0)
    srv["points"].sort(key=order)
for name in ("bench", "ncu"):
    p = os.path.join(pts, name + ".json")
    if os.path.exists(p):
        try:
            res[name] = json.load(open(p))
        except ValueError as e:
            res[name] = {"error": str(e)}
with open(out, "w") as f:
    json.dump(res, f, indent=1)
print(f"{out}: {sum(len(s['points']) for s in res['servers'].values())} points")
EOF
  python3 bench/plot_serve.py "$OUT/serve-$MK.json" --md "$REP/serve-$MK.md" --png "$REP/serve-$MK.png" >/dev/null 2>>"$LOGS/$MK-plot.log" ||
    { note "plot_serve.py failed: $(tail -1 "$LOGS/$MK-plot.log")"; rc=1; }
  [ -s "$REP/serve-$MK.md" ] && cat "$REP/serve-$MK.md"
  cp "$OUT/serve-$MK.json" "$REP/"
  cp -r "$PTS" "$LOGS/" 2>/dev/null
  log "== $MK done in $(($(date +%s) - MODEL_T0)) s"
done
tar czf "$W/serve-logs.tgz" -C "$W" logs report 2>/dev/null && mv "$W/serve-logs.tgz" "$OUT/0-serve-logs.tgz"
# the tables and plots beside the JSONs while fewer than 8 files (all of them are in the archive)
for f in "$REP"/*.md "$REP"/*.png; do
  [ -e "$f" ] && [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -lt 8 ] && cp "$f" "$OUT/"
done
log "all done"
exit $rc
