# Sourced by the real-engine tier scripts (.ci/vllm_tier.sh, .ci/speculators_tier.sh) after they
# set: tier (its name in messages), venv, stamp (the file that marks a finished install) and start
# (`date +%s` at its start).

# Whether the venv must be (re)built: $1 is the tier's REBUILD variable's value.
tier_needs_install() {
  [ "${1:-0}" = 1 ] || [ ! -f "$stamp" ]
}

# Exit 0 with a "skipped: <reason>" line (only for what cannot be installed here).
tier_skip() {
  echo "skipped: $1"
  echo "$tier tier: skipped after $(( $(date +%s) - start )) s"
  exit 0
}

# Run pytest with the venv's python on the tier's test folder ($1; more pytest arguments after
# it) and exit with its status; collecting no tests fails.
tier_pytest() {
  local dir=$1 status
  shift
  set +e
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" "$dir"
  status=$?
  set -e
  echo "$tier tier: $(( $(date +%s) - start )) s in all"
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests in $dir" >&2
    exit 1
  fi
  exit "$status"
}
