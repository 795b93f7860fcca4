#!/usr/bin/env bash
# test_attention_cpu.sh: the attention checks that only the CPU build can run:
#   - build/test_attention and build/test_attention_fp32 with threads run in shuffled orders (EMU_SHUFFLE):
#     a missing barrier or cp.async wait makes some thread read a tile before it is complete;
#   - build/bench_attention --tiny: the benchmark runs and prints its table (a smoke test, no timing checked).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_attention_cpu: $*"; }
for seed in 3 11; do
  for t in build/test_attention build/test_attention_fp32; do
    out=$(EMU_SHUFFLE=$seed "$t" 2>&1); rc=$?
    last=$(echo "$out" | tail -n 1)
    if [ $rc -eq 0 ] && echo "$last" | grep -qE '^[0-9]+ passed, 0 failed$'; then ok; else bad "EMU_SHUFFLE=$seed $t: exit $rc, $last"; echo "$out" | grep FAIL | head -5; fi
  done
done
out=$(build/bench_attention --tiny 2>&1); rc=$?
rows=$(echo "$out" | grep -cE '^tiny .*forward +[0-9.]+ ms .*fwd\+bwd +[0-9.]+ ms')
if [ $rc -eq 0 ] && [ "$rows" -eq 2 ]; then ok; else bad "bench_attention --tiny: exit $rc, $rows of 2 table rows: $out"; fi
build/bench_attention --iters 0 >/dev/null 2>&1
if [ $? -eq 2 ]; then ok; else bad "bench_attention --iters 0 was not refused"; fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
