#!/usr/bin/env bash
# The speculators tier: speculators 0.9.0 in its own venv (reused when it already holds this
# version), then `python -m pytest -q tests/speculators_tier` with that venv's python.
#
# speculators 0.9.0 requires torchvision and torchaudio, which it never imports; PyPI's builds of
# them pin another torch than the local CPU 2.13.0 wheel, and a mismatched torchvision breaks
# `import transformers`. So: torch 2.13.0 first, then speculators with --no-deps and the
# dependencies it declares (its METADATA) less those two (hs-connectors, datasets, openai, aiohttp
# and httpx are imported by `import speculators` itself, through speculators/train/data.py).
# An install that fails three times (`tier_retry`) fails CI with its reason, as does any test.
# Env: SPECDRAFT_SPECULATORS_VENV (default /tmp/specdraft-speculators-venv), SPECDRAFT_SPECULATORS_REBUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

SPECULATORS_VERSION=0.9.0
venv="${SPECDRAFT_SPECULATORS_VENV:-/tmp/specdraft-speculators-venv}"
stamp="$venv/.specdraft-speculators-$SPECULATORS_VERSION"
log="${TMPDIR:-/tmp}/specdraft-speculators-install.log"
start=$(date +%s)
DEPS=(aiohttp click "datasets>=4.0.0,<=5.1.0" httpx huggingface-hub "loguru>=0.7.2,<=0.7.3"
      "numpy>=2.0.0,<=2.5.4" "openai>=2.0.0" protobuf psutil "pydantic>=2.0.0" "pydantic-settings>=2.0.0"
      rich safetensors "tqdm>=4.66.3,<=4.70.1" "transformers>=5.0.0,<=5.19.0" "typer>=0.12.0"
      "hs-connectors==0.9.0" pytest)

tier=speculators
# shellcheck source=.ci/tier_common.sh
source .ci/tier_common.sh

if tier_needs_install "${SPECDRAFT_SPECULATORS_REBUILD:-0}"; then
  rm -rf "$venv"
  python3 -m venv "$venv" || tier_fail "cannot create a venv at $venv"
  py="$venv/bin/python"
  : >"$log"
  if ! { tier_retry "$py" -m pip install torch==2.13.0 && tier_retry "$py" -m pip install "${DEPS[@]}" &&
         tier_retry "$py" -m pip install --no-deps "speculators==$SPECULATORS_VERSION"; }; then
    rm -rf "$venv"
    tier_fail "speculators==$SPECULATORS_VERSION or its dependencies could not be installed in 3 attempts (pip log: $log)"
  fi
  touch "$stamp"
  echo "speculators tier: installed speculators $SPECULATORS_VERSION into $venv in" \
       "$(( $(date +%s) - start )) s ($(du -sh "$venv" | cut -f1))"
fi
# This checkout's specdraft (editable, so a reused venv follows the current tree), and tensorboard,
# the one specdraft dependency the tier uses that speculators' do not bring (specdraft's trainer
# in tests/speculators_tier/test_side_by_side.py).
"$venv/bin/python" -m pip install -q --no-deps -e . >>"$log" 2>&1
"$venv/bin/python" -m pip install -q "tensorboard>=2.15" >>"$log" 2>&1
"$venv/bin/python" -c "import importlib.metadata as m, specdraft, speculators, torch; \
print('speculators', m.version('speculators'), 'torch', torch.__version__)"

tier_pytest tests/speculators_tier -p no:logging -W ignore::DeprecationWarning
