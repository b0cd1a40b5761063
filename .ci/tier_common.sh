# Sourced by the real-engine tier scripts (.ci/vllm_tier.sh, .ci/speculators_tier.sh) after they
# set: tier (its name in messages), venv, stamp (the file that marks a finished install) and start
# (`date +%s` at its start).

# Whether the venv must be (re)built: $1 is the tier's REBUILD variable's value.
tier_needs_install() {
  [ "${1:-0}" = 1 ] || [ ! -f "$stamp" ]
}

# Fail CI with the reason: a tier that cannot be installed is no pass.
tier_fail() {
  echo "$tier tier: FAILED after $(( $(date +%s) - start )) s: $1" >&2
  exit 1
}

# Run the install command "$@" (output appended to $log) up to 3 times, 30 s and 60 s apart
# (SPECDRAFT_TIER_RETRY_WAIT: the first wait, s), so a registry hiccup does not drop the tier;
# returns non-zero when every attempt failed.
tier_retry() {
  local attempt wait=${SPECDRAFT_TIER_RETRY_WAIT:-30}
  for attempt in 1 2 3; do
    if "$@" >>"$log" 2>&1; then
      return 0
    fi
    tail -n 5 "$log"
    if [ "$attempt" -lt 3 ]; then
      echo "$tier tier: install attempt $attempt failed; retrying in $(( attempt * wait )) s"
      sleep $(( attempt * wait ))
    fi
  done
  return 1
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
