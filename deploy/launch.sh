#!/usr/bin/env bash
# shellcheck disable=SC2317 # the cleanup functions run from traps
# deploy/launch.sh: one node, N GPUs: `mlaserve serve` (coordinator + HTTP) and one
# `mlaserve-worker` per GPU, each with its own log file. Worker i sees one GPU: the i-th entry of
# CUDA_VISIBLE_DEVICES when it is set (a mask given to the launcher is kept: worker i gets its
# i-th device), else GPU i.
# Ctrl-C / SIGTERM: the server is asked to drain (SIGTERM), the workers follow it; whatever is
# still running after the grace period is killed, so no process outlives the launcher.
# With `-- --on-worker-failure restart` a worker that exits is started again, so that the
# coordinator's restart of the group finds workers to register: after 1 s, twice as long each time
# it exits again within a minute of its start, at most 30 s.
#
# usage: deploy/launch.sh -m MODEL.gguf [-n N] [--logs DIR] [--bin DIR] [--port P] [--host H]
#                         [--curve-dir DIR] [--grace S] [--cpu] [--dry-run] [-- extra serve options]
#   -n N          tensor-parallel degree = workers = GPUs (default: the devices in
#                 CUDA_VISIBLE_DEVICES, else nvidia-smi's count, else 1)
#   --logs DIR    coordinator.log and worker-<i>.log go there (default ./mlaserve-logs-<date>)
#   --bin DIR     where mlaserve and mlaserve-worker are (default: beside this script's build, PATH)
#   --host H      the HTTP address (default 127.0.0.1)
#   --grace S     seconds the server and the workers get to stop before they are killed (default 40)
#   --cpu         no GPUs: the workers share the host (CPU backend); for testing
#   --dry-run     print the commands instead of running them
# Environment: MLASERVE_API_KEY (API key: the coordinator's, not passed to the workers), NCCL_* / CUDA_*
# (passed to the workers unchanged).
set -euo pipefail

model="" n="" logs="" bin="" port=8000 host=127.0.0.1 curve="" grace=40 dry=0 cpu=0
extra=()
# an option that takes a value must have one: val "$@" before reading $2
val() { [[ $# -ge 2 ]] || { echo "launch.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -m|--model) val "$@"; model=$2; shift 2 ;;
    -n|--tp) val "$@"; n=$2; shift 2 ;;
    --logs) val "$@"; logs=$2; shift 2 ;;
    --bin) val "$@"; bin=$2; shift 2 ;;
    --port) val "$@"; port=$2; shift 2 ;;
    --host) val "$@"; host=$2; shift 2 ;;
    --curve-dir) val "$@"; curve=$2; shift 2 ;;
    --grace) val "$@"; grace=$2; shift 2 ;;
    --cpu) cpu=1; shift ;;
    --dry-run) dry=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR >= 3 && /^#/ { sub(/^# ?/, ""); print; next } NR >= 3 { exit }' "$0"; exit 0 ;;
    *) echo "launch.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -n "$model" ]] || { echo "launch.sh: -m MODEL.gguf is required" >&2; exit 2; }
# the devices the workers get: the given mask's entries (ids or UUIDs), else 0..N-1
mask=()
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a mask <<<"$CUDA_VISIBLE_DEVICES"
fi
if [[ -z "$n" ]]; then
  if [[ ${#mask[@]} -gt 0 ]]; then
    n=${#mask[@]}
  elif [[ $cpu -eq 0 ]] && command -v nvidia-smi >/dev/null 2>&1; then
    n=$(nvidia-smi -L | grep -c '^GPU' || true)
  fi
  [[ -n "$n" && "$n" -ge 1 ]] || n=1
fi
# decimal whole numbers (bash would read 010 as octal where mlaserve reads 10)
[[ "$n" =~ ^[1-9][0-9]{0,3}$ ]] || { echo "launch.sh: bad -n '$n' (a whole number from 1)" >&2; exit 2; }
[[ "$grace" =~ ^[0-9]{1,6}$ ]] || { echo "launch.sh: bad --grace '$grace' (whole seconds)" >&2; exit 2; }
grace=$((10#$grace))
if [[ $cpu -eq 0 && ${#mask[@]} -gt 0 && $n -gt ${#mask[@]} ]]; then
  echo "launch.sh: -n $n workers but CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists ${#mask[@]} device(s)" >&2
  exit 2
fi
device_of() { # rank -> the CUDA_VISIBLE_DEVICES value of that worker
  if [[ ${#mask[@]} -gt 0 ]]; then echo "${mask[$1]}"; else echo "$1"; fi
}

find_bin() { # name -> path
  if [[ -n "$bin" ]]; then
    # a build tree keeps the worker in ../worker
    if [[ ! -x "$bin/$1" && -x "$bin/../worker/$1" ]]; then echo "$bin/../worker/$1"; else echo "$bin/$1"; fi
    return
  fi
  local here inst; here=$(cd "$(dirname "$0")/.." && pwd)
  # a source tree's build, or an installed tree (PREFIX/share/mlaserve/deploy -> PREFIX/bin)
  inst=""
  if [[ -d "$here/../../bin" ]]; then inst=$(cd "$here/../../bin" && pwd); fi
  for d in "$here/build/coordinator" "$here/build/worker" ${inst:+"$inst"}; do
    [[ -x "$d/$1" ]] && { echo "$d/$1"; return; }
  done
  command -v "$1" || echo "$1"
}
serve_exe=$(find_bin mlaserve)
worker_exe=$(find_bin mlaserve-worker)
logs=${logs:-./mlaserve-logs-$(date +%Y%m%d-%H%M%S)}
[[ $dry -eq 1 ]] || mkdir -p "$logs" # a dry run only prints: it leaves nothing behind

# The control plane: an ipc:// socket private to this node (no network, no keys needed); with
# --curve-dir the workers and the coordinator also use CURVE.
sock="$(realpath -m "$logs")/coord.sock"
[[ ${#sock} -lt 100 ]] || sock="${TMPDIR:-/tmp}/mlaserve-$$.sock" # sun_path holds 107 bytes
endpoint="ipc://$sock"
curve_args=()
[[ -n "$curve" ]] && curve_args=(--curve-dir "$curve")

serve_cmd=("$serve_exe" serve -m "$model" --tp "$n" --host "$host" --port "$port" --workers-external
           --coord "$endpoint" --port-file "$logs/port" "${curve_args[@]}" "${extra[@]}")
worker_args() { # rank -> the array wargs (the API key stays with the coordinator, as serve's own workers)
  wargs=(env -u MLASERVE_API_KEY "$worker_exe" --coord "$endpoint" --rank "$1" --world "$n" -m "$model" "${curve_args[@]}")
  if [[ $cpu -eq 1 ]]; then wargs+=(--backend cpu --device cpu); else wargs+=(--backend cuda --device "cuda:$1"); fi
}

# serve's --on-worker-failure restart: the workers are started again when they exit
respawn=0
for ((i = 0; i < ${#extra[@]}; i++)); do
  case "${extra[$i]}" in
    --on-worker-failure=*) [[ "${extra[$i]#*=}" == restart ]] && respawn=1 || respawn=0 ;;
    --on-worker-failure) [[ "${extra[$((i + 1))]:-}" == restart ]] && respawn=1 || respawn=0 ;;
  esac
done

if [[ $dry -eq 1 ]]; then
  printf 'coordinator:'; printf ' %q' "${serve_cmd[@]}"; printf '\n'
  for ((r = 0; r < n; r++)); do
    worker_args "$r"
    printf 'worker %d:' "$r"
    [[ $cpu -eq 1 ]] || printf ' CUDA_VISIBLE_DEVICES=%s' "$(device_of "$r")"
    printf ' %q' "${wargs[@]}"; printf '\n'
  done
  exit 0
fi

pids=()
coord_pid=""
stopping=0
stop_pids() { # grace pid... : TERM, wait up to grace seconds, KILL, reap
  local grace_s=$1 p deadline; shift
  for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
  deadline=$((SECONDS + grace_s))
  for p in "$@"; do
    while kill -0 "$p" 2>/dev/null && [[ $SECONDS -lt $deadline ]]; do sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      echo "launch.sh: pid $p did not stop in ${grace_s}s; killing it" >&2
      kill -KILL "$p" 2>/dev/null || true
    fi
    wait "$p" 2>/dev/null || true
  done
}
cleanup() {
  # the coordinator first: it drains (finishes requests in flight) and then tells the workers
  # to shut down; then the workers, then anything left is killed
  [[ -n "$coord_pid" ]] && stop_pids "$grace" "$coord_pid"
  [[ ${#pids[@]} -gt 1 ]] && stop_pids 5 "${pids[@]:1}"
  [[ ${#timers[@]} -gt 0 ]] && { kill "${timers[@]}" 2>/dev/null || true; }
  rm -f "$sock"
}
on_signal() {
  [[ $stopping -eq 1 ]] && return
  stopping=1
  echo "launch.sh: stopping (logs in $logs)" >&2
  cleanup
  trap - EXIT
  exit 0
}
trap on_signal INT TERM
trap cleanup EXIT

started=() due=() delay=() timers=()
write_pids() { echo "${pids[*]}" >"$logs/pids.tmp" && mv -f "$logs/pids.tmp" "$logs/pids"; }
start_worker() { # rank -> started, its pid in pids[rank + 1] (the log appended to)
  started[$1]=$SECONDS
  worker_args "$1"
  if [[ $cpu -eq 1 ]]; then
    "${wargs[@]}" >>"$logs/worker-$1.log" 2>&1 &
  else
    CUDA_VISIBLE_DEVICES=$(device_of "$1") "${wargs[@]}" >>"$logs/worker-$1.log" 2>&1 &
  fi
  pids[$1 + 1]=$!
}

echo "launch.sh: coordinator + $n workers; logs in $logs" >&2
"${serve_cmd[@]}" >"$logs/coordinator.log" 2>&1 &
coord_pid=$!
pids+=("$coord_pid")
for ((r = 0; r < n; r++)); do
  : >"$logs/worker-$r.log"
  start_worker "$r"
done
write_pids

# Only the coordinator's exit ends the launcher: a worker that dies is reported by the
# coordinator (/health 503, logs) and handled per --on-worker-failure; with restart, it is
# started again here when its back-off has passed (a sleep in the background, whose end wakes the
# loop, times it; pids lists the live workers).
status=0
live=("${pids[@]}")
while [[ ${#live[@]} -gt 0 ]]; do
  st=0
  done_pid=""
  wait -n -p done_pid "${live[@]}" || st=$?
  [[ $stopping -eq 1 ]] && break
  [[ -z "$done_pid" ]] && break
  if [[ "$done_pid" == "$coord_pid" ]]; then status=$st; break; fi
  rest=()
  for p in "${live[@]}"; do [[ "$p" == "$done_pid" ]] || rest+=("$p"); done
  live=("${rest[@]}")
  rest=()
  for p in "${timers[@]}"; do [[ "$p" == "$done_pid" ]] || rest+=("$p"); done
  was_timer=0
  [[ ${#rest[@]} -ne ${#timers[@]} ]] && was_timer=1
  timers=("${rest[@]}")
  if [[ $was_timer -eq 0 ]]; then # a worker
    for ((r = 0; r < n; r++)); do [[ "${pids[$r + 1]}" == "$done_pid" ]] && break; done
    echo "launch.sh: worker $r (pid $done_pid) exited (status $st)" >&2
    if [[ $respawn -eq 1 ]]; then
      if [[ $((SECONDS - started[r])) -lt 60 ]]; then
        delay[r]=$((${delay[r]:-0} * 2)); [[ ${delay[r]} -ge 1 ]] || delay[r]=1; [[ ${delay[r]} -le 30 ]] || delay[r]=30
      else
        delay[r]=1
      fi
      due[r]=$((SECONDS + delay[r]))
      sleep "${delay[r]}" &
      timers+=("$!"); live+=("$!")
    fi
  fi
  # the workers whose back-off has passed, while the coordinator runs
  for ((r = 0; r < n; r++)); do
    [[ ${due[r]:-0} -gt 0 && ${due[r]} -le $SECONDS ]] || continue
    due[r]=0
    kill -0 "$coord_pid" 2>/dev/null || continue
    start_worker "$r"
    live+=("${pids[$r + 1]}")
    write_pids
    echo "launch.sh: worker $r started again (pid ${pids[$r + 1]})" >&2
  done
done
echo "launch.sh: the coordinator exited (status $status); stopping the workers" >&2
if [[ $status -ne 0 && $stopping -eq 0 && -s "$logs/coordinator.log" ]]; then # why, from its log
  echo "launch.sh: the end of $logs/coordinator.log:" >&2
  tail -n 5 "$logs/coordinator.log" | sed 's/^/  /' >&2
fi
exit "$status"
