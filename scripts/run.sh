#!/usr/bin/env bash
# The main job: builds, then trains the default MLP (configs/mlp.yaml) on the GPU when there is
# one, on the CPU otherwise. Extra arguments go to `train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
exec "${MT_BUILD_DIR:-build}"/train --config configs/mlp.yaml "$@"
