#!/usr/bin/env bash
# Installs every dependency of quantforge from Debian packages. Idempotent and
# quiet: packages already present are not touched, and apt runs only when
# something is missing.
#   scripts/setup.sh            build, test and run dependencies
#   scripts/setup.sh --fixture  also what scripts/fixture/ needs to retrain the fixture model
#   scripts/setup.sh --fuzz     also clang and libFuzzer for scripts/fuzz.sh
# (flags combine: scripts/setup.sh --fixture --fuzz)
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libthrust-dev                         # device code's host build, where the CUDA toolkit (include/cccl) is absent
  libeigen3-dev nlohmann-json3-dev libcli11-dev libzstd-dev libyaml-cpp-dev
  libgtest-dev libpcre2-dev libsentencepiece-dev pybind11-dev
  libpng-dev libjpeg-dev                # image files of the vision-language models (formats/image)
  python3-dev python3-numpy python3-pytest python3-tqdm
  python3-matplotlib python3-nbclient python3-nbformat python3-ipykernel
  slurmctld slurmd slurm-client munge   # tests/cli/slurm.sh runs a one-node cluster for `batch`
)
for arg in "$@"; do
  case "$arg" in
    --fixture) packages+=(python3-torch libopenblas0-pthread python3-sentencepiece python3-protobuf) ;;
    --fuzz) packages+=(clang-14 libclang-rt-14-dev) ;;
    *) echo "setup.sh: unknown option '$arg' (--fixture, --fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
