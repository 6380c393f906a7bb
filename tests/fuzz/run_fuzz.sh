#!/bin/sh
# Runs a libFuzzer target for a bounded time over seed corpora and fails on any crash.
# Usage: run_fuzz.sh TARGET_BINARY SECONDS|runs=N CORPUS_DIR...
# New inputs go to a scratch corpus (the seed folders are only read); a crashing input is
# written under $FUZZ_ARTIFACTS (default ./fuzz-artifacts): copy it into tests/data/<module>/
# and the replay test (tests/fuzz/replay_main.c) keeps it as a regression test.
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 TARGET_BINARY SECONDS CORPUS_DIR..." >&2
    exit 2
fi
target=$1
secs=$2
shift 2
for d in "$@"; do
    if [ ! -e "$d" ]; then
        echo "run_fuzz: seed corpus $d does not exist" >&2
        exit 2
    fi
done
art=${FUZZ_ARTIFACTS:-$PWD/fuzz-artifacts}
mkdir -p "$art"
work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-corpus.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
# SECONDS "runs=N": N inputs with -seed=1 (deterministic, for ctest) instead of a time budget
case $secs in
runs=*) limit="-runs=${secs#runs=} -seed=1" ;;
*) limit="-max_total_time=$secs" ;;
esac
# shellcheck disable=SC2086
"$target" $limit -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
    -print_final_stats=1 -artifact_prefix="$art/" "$work" "$@"
rc=$?
if [ $rc -ne 0 ]; then
    echo "run_fuzz: $target FAILED (exit $rc); reproducer(s) in $art:" >&2
    ls -l "$art" >&2
    exit 1
fi
echo "run_fuzz: $target ran ($secs) clean"
