#!/usr/bin/env bash
# test_gemm_cpu.sh: the gemm_wgmma checks that only the CPU build can run:
#   - build/test_gemm with threads run in shuffled orders (EMU_SHUFFLE): a missing mbarrier wait, or a warpgroup that
#     reads a stage or its X tile before it has landed, reads stale bytes;
#   - build/bench_gemm --tiny: the benchmark runs and prints its table (a smoke test, no timing checked), and refuses
#     a bad option.
cd "$(dirname "$0")/.."
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_gemm_cpu: $*"; }
for seed in 3 11; do
  out=$(EMU_SHUFFLE=$seed build/test_gemm 2>&1); rc=$?
  last=$(echo "$out" | tail -n 1)
  if [ $rc -eq 0 ] && echo "$last" | grep -qE '^[0-9]+ passed, 0 failed$'; then ok; else bad "EMU_SHUFFLE=$seed build/test_gemm: exit $rc, $last"; echo "$out" | grep -E "FAIL|cpu runtime" | head -5; fi
done
out=$(build/bench_gemm --tiny 2>&1); rc=$?
rows=$(echo "$out" | grep -cE '^  (cuBLASLt|gemm_wgmma) .* [0-9.]+ ms ')
if [ $rc -eq 0 ] && [ "$rows" -eq 8 ] && echo "$out" | grep -qE '^bench-gemm-result preset=tiny rows=512 forward_x=[0-9.]+ backward_x=[0-9.]+'; then ok; else bad "bench_gemm --tiny: exit $rc, $rows of 8 rows: $out"; fi
build/bench_gemm --rows 0 >/dev/null 2>&1
if [ $? -eq 2 ]; then ok; else bad "bench_gemm --rows 0 was not refused"; fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
