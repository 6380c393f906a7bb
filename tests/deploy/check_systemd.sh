#!/usr/bin/env bash
# deploy/systemd: `systemd-analyze verify` on the unit (ExecStart pointed at this build), and every
# MLASERVE_* variable the unit uses is set in the example env file.
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
echo "systemd unit ok"
