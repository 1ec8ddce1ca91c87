#!/usr/bin/env bash
# Run make targets side by side, each a lane of its own; every output line is prefixed with its
# lane's name as it comes, and each lane's exit status and time are printed when it ends.
#   scripts/lanes.sh TARGET...
# Each lane is `make -k TARGET`: a failed step does not hide the later ones of its lane.
# Exits non-zero when any lane failed, after every lane has ended (a failed lane never cuts another short: a
# molecule scenario stopped half-way would leave its cluster up). make test runs pytest and the
# molecule scenarios this way: they share no cluster, port, address range or state directory
# (tests/conftest.py, molecule/*/inventory), and both spend much of their time waiting on
# processes they started (Ray, sshd, ansible's connections), so two lanes on two cores end well
# before the two one after the other.
# When a lane fails, its failures are printed again at the very end (pytest's FAILED / ERROR lines,
# make's "*** ... Error" lines, a molecule scenario's non-zero rc), so that the tail of a long log, all
# a CI page may keep, names what failed.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/lanes.sh TARGET..." >&2; exit 2; }
make=${MAKE:-make}
logs=$(mktemp -d "${TMPDIR:-/tmp}/lanes.XXXXXX")
trap 'rm -rf "$logs"' EXIT

lane() {
  local name=$1 start=$SECONDS rc
  # A pipeline, not a process substitution: bash waits for every part of it, so the prefixed lines are all
  # written (to the terminal and the lane's log) before its exit line. The prefixing part ignores INT and
  # TERM (sed and tee inherit that), so that Ctrl-C stops make, and the lines make prints as it stops still
  # come through.
  "$make" -k --no-print-directory "$name" 2>&1 | (trap '' INT TERM; sed -u "s/^/[$name] /" | tee "$logs/$name")
  rc=${PIPESTATUS[0]}
  echo "[$name] === exit $rc after $((SECONDS - start)) s"
  return "$rc"
}

# Each lane in a process group of its own (job control), so that SIGINT reaches it: without job
# control a background job ignores SIGINT, and pytest would neither stop nor run its teardown on
# Ctrl-C. An INT or TERM to this script is passed on to every lane, which ends as it would alone.
set -m
pids=()
forward() {
  for pid in "${pids[@]}"; do kill -"$1" -- "-$pid" 2>/dev/null || true; done
}
trap 'forward INT' INT
trap 'forward TERM' TERM
for target in "$@"; do
  lane "$target" </dev/null &  # no lane reads the terminal (a background group would be stopped)
  pids+=("$!")
done
failed=()
for i in "${!pids[@]}"; do
  # wait returns early (> 128) when a trapped signal arrives: wait again until the lane has ended
  while true; do
    wait "${pids[$i]}"
    rc=$?
    kill -0 "${pids[$i]}" 2>/dev/null || break
  done
  [ "$rc" -eq 0 ] || failed+=("${@:i+1:1}")
done
if [ ${#failed[@]} -gt 0 ]; then
  for name in "${failed[@]}"; do
    echo "=== what failed in $name:" >&2
    # pytest's short summary (-ra), its final count, make's errors, a molecule scenario's rc; at most 60 lines
    grep -m 60 -aE "^\[$name\] ((FAILED|ERROR) |=+ .*([0-9]+ (failed|errors?)).* in [0-9.]+s|make(\[[0-9]+\])?: \*\*\* |=== molecule [^ ]+: rc [1-9])" \
      "$logs/$name" >&2 || echo "[$name] (no pytest, make or molecule failure line: see the lane's log above)" >&2
  done
  echo "lanes failed: ${failed[*]} (their lines above are prefixed with [name])" >&2
  exit 1
fi
echo "lanes passed: $*"
