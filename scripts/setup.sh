#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages minitrain builds against, skipping those already present,
# so it also succeeds offline on a machine that has everything (no package registry needed).
set -euo pipefail

libraries=(libspdlog-dev libyaml-cpp-dev libgtest-dev libopenblas-dev nlohmann-json3-dev
           zlib1g-dev)
missing=()
for p in "${libraries[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Tools may come from outside dpkg (a newer CMake from pip, say): any on PATH will do.
for tool in cmake:cmake g++:g++ make:make pkg-config:pkg-config ninja:ninja-build; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq || true
if ! "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  # Offline, or a distribution that names a package differently: carry on, and let CMake's
  # configure step name precisely what is still missing.
  echo "setup: warning: could not install ${missing[*]}; continuing" >&2
fi
