#!/usr/bin/env bash
# The SGLang tier: each pinned SGLang release in its own venv (reused when it already holds that
# version), then `python -m pytest -q tests/sglang_tier` with that venv's python: SGLang's own
# loader, draft forward and target capture on the CPU against specdraft's exports.
#
# SGLang's wheels pin a CUDA torch (0.5.10: 2.9.1, 0.5.12: 2.11.0, 0.5.23: 2.14.1) and CUDA-only
# kernels; the tier runs their CPU path on the local CPU torch 2.13.0 instead: torch first, then
# the release's pinned transformers with the small packages its import path needs, then sglang
# with --no-deps. triton is real (torch's inductor imports it); torchvision and sgl_kernel are
# stand-ins (tests/sglang_tier/engine.py), so neither may be installed.
# An install that fails three times (`tier_retry`) fails CI with its reason, as does any test.
# Env: SPECDRAFT_SGLANG_VENV_PREFIX (default /tmp/specdraft-sglang-venv), SPECDRAFT_SGLANG_REBUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

# version, its pinned transformers, apache-tvm-ffi and openai (each wheel's METADATA)
PINS=("0.5.10 5.3.0 >=0.1.5,<0.2 2.6.1"
      "0.5.12 5.6.0 ==0.1.9 2.6.1"
      "0.5.23 5.19.0 ==0.1.11 2.8.0")
COMMON=(numpy orjson psutil pybase64 requests pillow starlette msgspec pyzmq ipython aiohttp dill
        sentencepiece compressed-tensors pydantic loguru gguf partial_json_parser einops safetensors
        pytest typer rich httpx "tensorboard>=2.15")
start_all=$(date +%s)

# One release: install on demand, then its tests (a subshell: tier_pytest exits).
run_version() {
  local version=$1 transformers=$2 tvm=$3 openai=$4
  venv="${SPECDRAFT_SGLANG_VENV_PREFIX:-/tmp/specdraft-sglang-venv}-$version"
  stamp="$venv/.specdraft-sglang-$version"
  log="${TMPDIR:-/tmp}/specdraft-sglang-$version-install.log"
  start=$(date +%s)
  tier="sglang $version"
  # shellcheck source=.ci/tier_common.sh
  source .ci/tier_common.sh
  if tier_needs_install "${SPECDRAFT_SGLANG_REBUILD:-0}"; then
    rm -rf "$venv"
    python3 -m venv "$venv" || tier_fail "cannot create a venv at $venv"
    local py="$venv/bin/python"
    : >"$log"
    if ! { tier_retry "$py" -m pip install torch==2.13.0 triton==3.9.0 &&
           tier_retry "$py" -m pip install "transformers==$transformers" "apache-tvm-ffi$tvm" \
             "openai==$openai" "${COMMON[@]}" &&
           tier_retry "$py" -m pip install --no-deps "sglang==$version"; }; then
      rm -rf "$venv"
      tier_fail "sglang==$version or its dependencies could not be installed in 3 attempts (pip log: $log)"
    fi
    touch "$stamp"
    echo "sglang tier: installed sglang $version into $venv in $(( $(date +%s) - start )) s" \
         "($(du -sh "$venv" | cut -f1))"
  fi
  # This checkout's specdraft (editable, so a reused venv follows the current tree).
  "$venv/bin/python" -m pip install -q --no-deps -e . >>"$log" 2>&1
  "$venv/bin/python" -c "import importlib.metadata as m, torch, transformers; \
print('sglang', m.version('sglang'), 'torch', torch.__version__, 'transformers', transformers.__version__)"
  OMP_NUM_THREADS=1 tier_pytest tests/sglang_tier -p no:logging -W ignore::UserWarning \
    -W ignore::DeprecationWarning
}

status=0
for pin in "${PINS[@]}"; do
  # shellcheck disable=SC2086
  ( run_version $pin ) || status=1
done
echo "sglang tier: $(( $(date +%s) - start_all )) s for ${#PINS[@]} releases"
exit "$status"
