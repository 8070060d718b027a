#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages minitrain builds against, skipping those already present,
# so it also succeeds offline on a machine that has everything (no package registry needed).
set -euo pipefail

libraries=(libspdlog-dev libyaml-cpp-dev libgtest-dev libopenblas-dev nlohmann-json3-dev
           zlib1g-dev)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${libraries[@]}"; do
  installed "$p" || missing+=("$p")
done
# Tools may come from outside dpkg (a newer CMake from pip, say): any on PATH will do.
for tool in cmake:cmake g++:g++ make:make pkg-config:pkg-config ninja:ninja-build; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done

# Optional, asked for by scripts/fuzz.sh only (`setup.sh --fuzz`): clang and its libFuzzer
# runtime. Whether they are there is tested by linking a fuzzer, since distributions package the
# runtime differently (Ubuntu 22.04 has it in libclang-common-14-dev). If they cannot be
# installed, setup only warns and fuzz.sh skips.
optional=()
[[ ${1:-} == --fuzz ]] && optional=(clang libclang-rt-dev)
have_libfuzzer() {
  local dir ok=1
  dir=$(mktemp -d)
  echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$dir/probe.cpp"
  clang++ -fsanitize=fuzzer "$dir/probe.cpp" -o "$dir/probe" 2>/dev/null || ok=0
  rm -rf "$dir"
  ((ok))
}
((${#optional[@]} > 0)) && command -v clang++ >/dev/null && have_libfuzzer && optional=()
# libgloo-dev: the multi-process CPU backend. Optional in CMake (a machine without it, such as
# one offline that lacks it, only warns here and builds without it); CI configures with
# MT_GLOO=ON (.ci/run), so there it must install.
installed libgloo-dev || optional+=(libgloo-dev)

if ((${#missing[@]} + ${#optional[@]} == 0)); then
  echo "setup: all packages present"
  exit 0
fi
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    # Nothing can be installed: say what to install, and let CMake name what is really missing
    # (a library built from source is not in dpkg's list, yet CMake may find it).
    echo "setup: warning: not root and no sudo, so nothing is installed; as root run:" \
      "apt-get install ${missing[*]} ${optional[*]}" >&2
    exit 0
  fi
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# apt and dpkg print a hundred lines per install: they go to a log, shown only when a step fails.
log=$(mktemp -t minitrain-setup.XXXXXX.log)
apt_get() {
  if "${sudo_cmd[@]}" apt-get -qq "$@" >>"$log" 2>&1; then return 0; fi
  echo "setup: apt-get $* failed; its output ($log):" >&2
  tail -n 40 "$log" >&2
  return 1
}
"${sudo_cmd[@]}" apt-get -qq update >>"$log" 2>&1 || true  # fails offline, where nothing may be missing
if ((${#missing[@]} > 0)); then
  echo "setup: installing ${missing[*]} (output in $log)"
  if ! apt_get install -y --no-install-recommends "${missing[@]}"; then
    # Offline, or a distribution that names a package differently: carry on, and let CMake's
    # configure step name precisely what is still missing.
    echo "setup: warning: could not install ${missing[*]}; continuing" >&2
  fi
fi
# One at a time, after the required ones: a package this distribution lacks (Ubuntu 22.04 has no
# libclang-rt-dev; its clang brings libFuzzer along) must not keep the others from installing.
for p in "${optional[@]}"; do
  echo "setup: installing $p (optional)"
  apt_get install -y --no-install-recommends "$p" ||
    echo "setup: warning: could not install $p (libgloo-dev: builds without the multi-process" \
      "CPU backend; clang: scripts/fuzz.sh skips)" >&2
done
