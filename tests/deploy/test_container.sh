#!/usr/bin/env bash
# The Dockerfile, built with podman on a local base (no registry is reachable here): a bundle in
# the install layout (cmake --install of this build) is the build context; the base image is made
# from this machine's libraries that the binaries load (glibc included), imported with `podman
# import`. Checks the image: ENTRYPOINT is the installed mlaserve, the bundle's files are in
# /opt/mlaserve. Then runs it: `podman run` where this machine allows containers; where it does
# not (a sandbox without cgroup v2 delegation: crun refuses), the exported image filesystem is
# run with chroot instead (--version, and a generation on the bundled model: coordinator +
# worker process inside the image's tree). Exit 77 (skipped): no podman, or not root for chroot.
# usage: test_container.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
command -v podman >/dev/null || { echo "podman not installed (scripts/install-deps.sh --test installs it)"; exit 77; }
d=$(mktemp -d)
tag="mlaserve-test-$$"
cleanup() {
  mountpoint -q "$d/rootfs/proc" 2>/dev/null && umount "$d/rootfs/proc"
  mountpoint -q "$d/rootfs/dev" 2>/dev/null && umount "$d/rootfs/dev"
  podman rm -f "$tag-c" >/dev/null 2>&1 || true
  podman rmi -f "localhost/$tag" "localhost/$tag-base" >/dev/null 2>&1 || true
  rm -rf "$d"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# the build context: .bundle/ in the install layout, and the Dockerfile
mkdir -p "$d/ctx"
cmake --install "$build" --prefix "$d/ctx/.bundle" >/dev/null
cp "$src/Dockerfile" "$d/ctx/"

# the local base: every library the two programs load, at its path here, and /tmp
mkdir -p "$d/base/tmp" "$d/base/dev/shm"
chmod 1777 "$d/base/tmp"
for b in "$d/ctx/.bundle/bin/mlaserve" "$d/ctx/.bundle/bin/mlaserve-worker"; do
  ldd "$b" | awk '/=> \//{print $3} $1 ~ /^\// && $1 ~ /ld-linux/{print $1}' | while read -r lib; do
    mkdir -p "$d/base$(dirname "$lib")"
    cp -L "$lib" "$d/base$lib"
  done
done
tar -C "$d/base" -c . | podman import - "localhost/$tag-base" >"$d/podman.log" 2>&1 ||
  fail "podman import of the base: $(tail -3 "$d/podman.log")"
podman build --build-arg BASE="localhost/$tag-base" -t "localhost/$tag" "$d/ctx" >"$d/podman.log" 2>&1 ||
  fail "podman build of the Dockerfile: $(tail -5 "$d/podman.log")"
echo "podman build ok"
ep=$(podman image inspect --format '{{json .Config.Entrypoint}}' "localhost/$tag")
[[ "$ep" == '["/opt/mlaserve/bin/mlaserve"]' ]] || fail "ENTRYPOINT is $ep"
podman create --name "$tag-c" "localhost/$tag" >/dev/null
mkdir -p "$d/rootfs"
podman export "$tag-c" | tar -C "$d/rootfs" -x
for f in bin/mlaserve bin/mlaserve-worker share/mlaserve/models/tiny-deepseek3-bf16.gguf \
         share/mlaserve/deploy/systemd/mlaserve.service; do
  [[ -e "$d/rootfs/opt/mlaserve/$f" ]] || fail "/opt/mlaserve/$f is not in the image"
done
echo "image layout ok"

model=/opt/mlaserve/share/mlaserve/models/tiny-deepseek3-bf16.gguf
if out=$(podman run --rm "localhost/$tag" --version 2>&1); then
  grep -q '^mlaserve ' <<<"$out" || fail "podman run --version: $out"
  podman run --rm "localhost/$tag" generate -m "$model" -p "What is 7 plus 5?" -n 4 ||
    fail "podman run generate"
  echo "podman run ok"
  exit 0
fi
echo "podman run is not possible here ($(tail -1 <<<"$out")); running the image's tree with chroot"
[[ $(id -u) -eq 0 ]] || { echo "not root: cannot chroot"; exit 77; }
mkdir -p "$d/rootfs/proc" "$d/rootfs/dev"
mount --bind /proc "$d/rootfs/proc"
mount --bind /dev "$d/rootfs/dev"
out=$(chroot --userspec=65534:65534 "$d/rootfs" /opt/mlaserve/bin/mlaserve --version) || fail "chroot --version"
grep -q '^mlaserve ' <<<"$out" || fail "--version printed: $out"
txt=$(cd "$d" && chroot --userspec=65534:65534 "$d/rootfs" /opt/mlaserve/bin/mlaserve generate -m "$model" \
        -p "What is 7 plus 5?" -n 4) || fail "generate in the image's tree"
[[ -n "$txt" ]] || fail "generate printed nothing"
echo "image tree runs: $out; generated: $txt"
