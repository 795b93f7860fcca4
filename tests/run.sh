#!/usr/bin/env bash
# tests/run.sh: runs every test binary that ./build.sh made, on the CPU runtime and under
# AddressSanitizer, and prints the total as the closing line "N passed, N failed".
# A binary that crashes or prints no summary line counts as one failure.
#   tests/run.sh            all tests (CPU + ASan)
#   tests/run.sh gpu        the GPU test binaries (build/gpu/test_*), on a machine with a GPU
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-cpu}
if [ "$MODE" = gpu ]; then BINS=$(ls build/gpu/test_* 2>/dev/null | grep -v '\.d$'); else BINS="$(ls build/test_* 2>/dev/null) $(ls build/asan/test_* 2>/dev/null)"; fi
# Test scripts (tests/test_*.sh, tests/test_*.py for the Python tools) run in CPU mode too;
# each prints its own "N passed, N failed" line.
[ "$MODE" = gpu ] || BINS="$BINS $(ls tests/test_*.sh tests/test_*.py 2>/dev/null)"

[ -n "${BINS// /}" ] || { echo "tests/run.sh: no test binaries in build/ (run ./build.sh all first)"; echo "0 passed, 1 failed"; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0}
total_pass=0; total_fail=0
for b in $BINS; do
  [ -x "$b" ] || [[ "$b" == *.py ]] || continue
  start=$(date +%s%N)
  run=("$b"); case "$b" in *.py) run=(python3 "$b") ;; esac
  out=$(timeout "${TEST_TIMEOUT:-600}" "${run[@]}" 2>&1); rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  last=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$last" ]; then
    p=0; f=1; why="crashed or printed no summary (exit $rc)"
  else
    p=$(echo "$last" | awk '{print $1}'); f=$(echo "$last" | awk '{print $3}')
    why=$last
    [ $rc -ne 0 ] && [ "$f" -eq 0 ] && { f=1; why="$last, but exit code $rc"; }
  fi
  if [ "$f" -ne 0 ] || [ -n "${TEST_VERBOSE:-}" ]; then echo "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 40; fi
  printf '%-40s %-32s %6.1fs\n' "$b" "$why" "$secs"
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
done
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
