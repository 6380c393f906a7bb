#!/usr/bin/env bash
# Installs what mlaserve needs to build and test, only what is missing.
# Debian 12 / Ubuntu 22.04+. Runs apt-get as root or through sudo; pip for the test tools.
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config git python3 python3-pip
      libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev libhttp-parser-dev
      libcjson-dev libpcre2-dev libsodium-dev libnghttp2-dev libssl-dev openssl clang libclang-rt-dev curl
      shellcheck iproute2)
# what the tests run besides mlaserve: promtool (Prometheus: checks /metrics), podman (builds the Dockerfile)
[[ "${1:-}" == "--test" ]] && pkgs+=(prometheus podman)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# clang's runtime package is named per version on some releases; accept any libclang-rt-*-dev.
if [[ " ${missing[*]} " == *" libclang-rt-dev "* ]] && dpkg -l 'libclang-rt-*-dev' 2>/dev/null | grep -q '^ii'; then
  missing=("${missing[@]/libclang-rt-dev}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python packages used by the tests as independent references (gguf-py dequantization,
# jinja2 templates, the official openai and anthropic clients, grpcio with grpcio-tools to generate a client
# from proto/api.proto and grpcio-health-checking for grpc.health.v1, hpack to read the headers of
# raw HTTP/2 test connections, the jsonschema validator of structured output; matplotlib draws the
# benchmark plots).
if [[ "${1:-}" == "--test" ]]; then
  py_missing=()
  for m in gguf:gguf numpy:numpy jinja2:jinja2 openai:openai anthropic:anthropic tokenizers:tokenizers \
           grpc_tools:grpcio-tools \
           grpc_health.v1:grpcio-health-checking hpack:hpack jsonschema:jsonschema \
           matplotlib:matplotlib; do
    python3 -c "import ${m%%:*}" 2>/dev/null || py_missing+=("${m##*:}")
  done
  if ((${#py_missing[@]})); then
    echo "install-deps: pip installing ${py_missing[*]}"
    python3 -m pip install -q "${py_missing[@]}" 2>/dev/null ||
      python3 -m pip install -q --break-system-packages "${py_missing[@]}"
  fi
fi
