#!/usr/bin/env bash
# The main job: builds, then trains the default MLP (configs/mlp.yaml) on the GPU when there is
# one, on the CPU otherwise. Extra arguments go to `train`.
#
# Each call starts the default run afresh: checkpoint.overwrite=true replaces the previous run's
# checkpoints and metrics in its folder (train warns when it does). `train` alone refuses a folder
# that holds another run; pass --set checkpoint.overwrite=false to get that here, or --resume DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "run.sh: building minitrain into ${MT_BUILD_DIR:-build}/ (the first build takes a few minutes)" >&2
bash scripts/build.sh >&2  # the build's progress, on stderr
exec "${MT_BUILD_DIR:-build}"/train --config configs/mlp.yaml --set checkpoint.overwrite=true "$@"
