#!/usr/bin/env bash
# deploy/systemd: `systemd-analyze verify` on the unit (ExecStart pointed at this build), and every
# MLASERVE_* variable the unit uses is set in the example env file, which sh can source as well
# (values with spaces quoted, as systemd's EnvironmentFile also reads them).
# usage: check_systemd.sh DEPLOY_SYSTEMD_DIR MLASERVE_EXE
set -euo pipefail
src=$1 exe=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
sed "s|/usr/local/bin/mlaserve|$exe|" "$src/mlaserve.service" >"$d/mlaserve.service"
systemd-analyze verify "$d/mlaserve.service"
grep -o 'MLASERVE_[A-Z_]*' "$src/mlaserve.service" | sort -u | while read -r v; do
  grep -q "^$v=" "$src/mlaserve.env" || { echo "$v is used by the unit but missing from mlaserve.env"; exit 1; }
done
# shellcheck disable=SC1091
extra=$(set -eu && . "$src/mlaserve.env" && printf '%s' "$MLASERVE_EXTRA_ARGS") ||
  { echo "mlaserve.env: sh cannot source it"; exit 1; }
case "$extra" in
  --max-queue\ *) ;;
  *) echo "mlaserve.env: MLASERVE_EXTRA_ARGS read by sh as '$extra'"; exit 1 ;;
esac
echo "systemd unit ok"
