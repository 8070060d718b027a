#!/usr/bin/env bash
# The main job: builds the libraries and `train` (nothing else), then trains the default MLP
# (configs/mlp.yaml) on the GPU when there is one, on the CPU otherwise. Extra arguments go to
# `train`.
#
# The CUDA backend is built when a GPU is visible (nvidia-smi lists one), for that GPU's
# architecture only; with no GPU it is left out, which keeps the first build to about a minute on
# two cores. MT_CUDA=ON (or OFF) decides instead. The choice is made when build/ is first
# configured: a build/ that scripts/test.sh already configured with CUDA is used as it is.
#
# Each call starts the default run afresh: checkpoint.overwrite=true replaces the previous run's
# checkpoints and metrics in its folder (train warns when it does). `train` alone refuses a folder
# that holds another run; pass --set checkpoint.overwrite=false to get that here, or --resume DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MT_BUILD_DIR:-build}
configure=()
if [[ -n ${MT_CUDA:-} ]]; then
  configure=(-DMT_CUDA="$MT_CUDA")
elif [[ ! -f $build/CMakeCache.txt ]]; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    configure=(-DMT_CUDA=AUTO)
  else
    echo "run.sh: no GPU visible: building the CPU backend only (MT_CUDA=ON builds CUDA too)" >&2
    configure=(-DMT_CUDA=OFF)
  fi
fi
echo "run.sh: building the libraries and train into $build/" >&2
MT_BUILD_TARGETS=train bash scripts/build.sh "${configure[@]}" >&2  # the build's progress, on stderr
exec "$build"/train --config configs/mlp.yaml --set checkpoint.overwrite=true "$@"
