#!/usr/bin/env bash
# `cmake --install` into a staging folder (DESTDIR, prefix /usr/local, as the systemd unit
# expects): the layout (bin, share/mlaserve, share/doc/mlaserve), the systemd unit checked
# against the installed paths (its ExecStart binary is the installed one and runs; `systemd-analyze
# verify` on the unit with that path staged, when systemd-analyze is there; its install steps
# create /etc/mlaserve), the installed launch.sh finding the installed binaries, and a generation
# with the installed programs on the installed tiny model (the coordinator finds the worker
# beside itself).
# usage: test_install.sh BUILD_DIR
set -euo pipefail
build=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

DESTDIR="$d/stage" cmake --install "$build" --prefix /usr/local >"$d/install.log"
root="$d/stage/usr/local"
for f in bin/mlaserve bin/mlaserve-worker share/mlaserve/deploy/launch.sh share/mlaserve/deploy/slurm/mlaserve.sbatch; do
  [[ -x "$root/$f" ]] || fail "$f not installed (or not executable)"
done
for f in share/mlaserve/deploy/systemd/mlaserve.service share/mlaserve/deploy/systemd/mlaserve.env \
         share/mlaserve/models/tiny-deepseek3-bf16.gguf share/mlaserve/Dockerfile share/doc/mlaserve/README.md \
         share/doc/mlaserve/docs/deploy.md share/doc/mlaserve/docs/metrics.md share/doc/mlaserve/docs/api.md \
         share/doc/mlaserve/docs/openai-params.md share/doc/mlaserve/docs/ARCHITECTURE.md; do
  [[ -f "$root/$f" ]] || fail "$f not installed"
done
[[ ! -e "$root/lib" ]] || fail "lib/ installed, but every library of ours is static: $(ls "$root/lib")"
echo "layout ok"

# the unit against the installed paths
unit="$root/share/mlaserve/deploy/systemd/mlaserve.service"
exec_line=$(sed -n 's/^ExecStart=//p' "$unit")
exe=${exec_line%% *}
[[ "$exe" == /usr/local/bin/mlaserve ]] || fail "ExecStart runs $exe, not the installed /usr/local/bin/mlaserve"
"$d/stage$exe" --version | grep -q '^mlaserve ' || fail "the installed $exe --version"
grep -q 'mkdir -p /etc/mlaserve' "$unit" || fail "the unit's install steps do not create /etc/mlaserve"
grep -q '^EnvironmentFile=/etc/mlaserve/mlaserve.env' "$unit" || fail "EnvironmentFile is not /etc/mlaserve/mlaserve.env"
grep -q 'share/mlaserve/deploy/systemd/mlaserve.service /etc/systemd/system/' "$unit" ||
  fail "the unit's install steps do not copy it from the installed share/mlaserve"
if command -v systemd-analyze >/dev/null; then
  sed "s|/usr/local/bin/mlaserve|$d/stage/usr/local/bin/mlaserve|" "$unit" >"$d/mlaserve.service"
  systemd-analyze verify "$d/mlaserve.service"
  echo "systemd-analyze verify ok"
fi

# the installed launcher finds the installed binaries
out=$("$root/share/mlaserve/deploy/launch.sh" -m M.gguf -n 1 --cpu --dry-run --logs "$d/logs")
if ! grep -q "^coordinator: $root/bin/mlaserve serve" <<<"$out" || ! grep -q "^worker 0: env -u MLASERVE_API_KEY $root/bin/mlaserve-worker " <<<"$out"; then
  fail "installed launch.sh does not run the installed binaries: $out"
fi

# a generation with the installed programs and model
txt=$("$root/bin/mlaserve" generate -m "$root/share/mlaserve/models/tiny-deepseek3-bf16.gguf" -p "What is 7 plus 5?" -n 4 2>"$d/gen.err") ||
  fail "generate with the installed programs: $(tail -5 "$d/gen.err")"
[[ -n "$txt" ]] || fail "generate printed nothing"
echo "installed generate ok: $txt"
echo "install ok"
