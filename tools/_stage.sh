# Sourced by the device runners (packages/deepinfer-kernels/diag/gpu_kernels_check.sh, tools/gpu_engine_check.sh): `stage NAME TIMEOUT
# CMD...` runs CMD under a timeout capped by what is left of $DEADLINE (seconds since the call
# began, bash's $SECONDS) and appends "NAME: rc=... seconds" to $SUMMARY.
stage() {   # stage NAME TIMEOUT CMD...   (the timeout is capped by what is left of DEADLINE)
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 5))
  if [ "$left" -lt 20 ]; then
    echo "$name: skipped (call deadline ${DEADLINE}s reached)" | tee -a "$SUMMARY"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note=" (TIMEOUT after ${limit}s)"
  echo "$name: rc=$rc $((SECONDS - t0))s$note" | tee -a "$SUMMARY"
  return $rc
}

