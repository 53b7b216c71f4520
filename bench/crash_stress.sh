#!/usr/bin/env bash
# The crash rounds, again and again, each run with fresh random seeds: the
# three kill -9 tests of crates/cli/tests/it/crash_rounds.rs (serve on
# SQLite, serve on PostgreSQL with S3, a cluster with its agent and then its
# control plane killed), plus the fault-point test of a control plane killed
# while its node revives. Stops at the first failure, printing its seed
# (replay it with FLOTILLA_CRASH_SEED=<seed>) and where its logs are kept.
#
#   bench/crash_stress.sh [runs (default 20)]
#
# Prints one line per run: the run, each test's result and time, and the
# count of consecutive green runs so far.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
features=(--features flotilla/fault-points)
cargo nextest run --no-run -p flotilla "${features[@]}" >/dev/null 2>&1
log=$(mktemp -d)
echo "logs of each run in $log"
green=0
for run in $(seq 1 "$runs"); do
  unset FLOTILLA_CRASH_SEED
  started=$(date +%s)
  if cargo nextest run -p flotilla "${features[@]}" --no-fail-fast \
      -E 'test(/^crash_rounds::/)' >"$log/run-$run.txt" 2>&1; then
    green=$((green + 1))
    outcome=green
  else
    outcome=RED
  fi
  times=$(grep -E '^\s+(PASS|FAIL) ' "$log/run-$run.txt" | sed -E 's/^\s+(PASS|FAIL) \[ *([0-9.]+)s\].*crash_rounds::(.*)$/\3 \1 \2s/' | tr '\n' ';')
  echo "run $run: $outcome in $(( $(date +%s) - started )) s; $times consecutive green: $green"
  if [ "$outcome" = RED ]; then
    grep -E 'FLOTILLA_CRASH_SEED=|logs kept in|panicked' "$log/run-$run.txt" | head -20
    exit 1
  fi
done
echo "$green consecutive green runs of every crash test"
