#!/usr/bin/env bash
# test_gpu_session.sh: tools/gpu_session.sh, the one script a session with a lent GPU runs, exercised on the CPU
# runtime (--cpu: the same stages at tiny sizes, with the CPU build's binaries):
#   - every stage runs and passes, its log and the summary (at most 8 files: what the device tool brings back) hold
#     the test lines and the benchmarks' results; the peer is skipped, as it needs a GPU;
#   - a second call with the same --dir runs the build again and nothing that passed;
#   - a stage is not started when its estimate does not fit the budget left;
#   - a candidate's whole-step benchmark is skipped when its kernels' test did not pass on the machine;
#   - a test binary that is missing fails the tests stage and the exit code;
#   - bad arguments give one line and exit code 2.
# Needs ./build.sh all (build/test_*, build/bench_*, ./trainer_cpu). Run by tests/run.sh; prints "N passed, N failed".
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_gpu_session: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_gpu_session_XXXXXX)
trap 'rm -rf "$W"' EXIT
export TMPDIR="$W"  # bench_ab's trees and logs go here
GS=tools/gpu_session.sh
state() { awk -v s="$2" '$1 == "--" { exit } $1 == s { print $2 }' "$1/summary.txt"; }  # state DIR STAGE

# 1. every stage, on the CPU runtime
$GS --cpu --dir "$W/a" >"$W/a.out" 2>&1; rc=$?
check '[ $rc -eq 0 ]' "--cpu exited $rc: $(tail -n 5 "$W/a.out")"
for s in build tests kernels ab-mlp ab-attention matmul; do
  check '[ "$(state "$W/a" $s)" = ok ]' "stage $s: $(state "$W/a" $s), expected ok"
done
check '[ "$(state "$W/a" peer)" = skipped ] && grep -q "^peer: needs a GPU" "$W/a/summary.txt"' "the peer is not skipped as needing a GPU"
for t in test_runtime test_gemm test_attention; do
  check 'grep -q -E "^$t: [0-9]+ passed, 0 failed \(exit 0\)$" "$W/a/summary.txt"' "the summary has no passing line for $t"
done
check 'grep -q "^bench-gemm-result preset=tiny" "$W/a/summary.txt" && grep -q "^bench-matmul-result preset=tiny" "$W/a/summary.txt"' \
  "the summary lacks bench_gemm's or bench_matmul's result line"
check '[ "$(grep -A 2 "^-- ab-mlp" "$W/a/summary.txt" | grep -c -E "^ *(tokens/s|step ms)")" = 2 ]' \
  "the summary lacks --mlp wgmma's tokens/s and step time against the default"
check 'grep -q "with --attention wgmma" "$W/a/ab-attention.log"' "ab-attention did not run the candidate"
check '[ "$(ls "$W/a" | wc -l)" -le 8 ] && [ -z "$(find "$W/a" -mindepth 2)" ]' "more than 8 files, or folders, in --dir: $(ls "$W/a")"
check '[ "$(tail -n +2 "$W/a.out" | grep -c "^== gpu_session summary")" = 1 ] && tail -n 1 "$W/a.out" | grep -q -v "^gpu_session: "' \
  "the summary is not printed last"

# 2. a second call goes on: the build again, nothing that passed
cp "$W/a/kernels.log" "$W/kernels.before"
$GS --cpu --dir "$W/a" >"$W/b.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^gpu_session: build (" "$W/b.out" && ! grep -q -E "^gpu_session: (tests|kernels|ab-mlp|matmul) \(" "$W/b.out"' \
  "the second call (exit $rc) ran stages that had passed: $(grep '^gpu_session: ' "$W/b.out" | tr '\n' ';')"
check 'cmp -s "$W/a/kernels.log" "$W/kernels.before" && [ "$(state "$W/a" kernels)" = ok ]' "the second call changed a passed stage's log or state"

# 3. the budget: a stage starts only if its estimate fits what is left (--cpu: build 5 s, tests 20, kernels 30)
$GS --cpu --dir "$W/c" --budget 26 >"$W/c.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/c" build)" = ok ] && [ "$(state "$W/c" kernels)" = skipped ]' \
  "with --budget 26 (exit $rc) kernels was not skipped: $(cat "$W/c/summary.txt")"
check 'grep -q -E "^kernels: needs about 30 s, [0-9]+ s left$" "$W/c/summary.txt" && [ ! -f "$W/c/kernels.log" ]' \
  "the skip does not say why: $(grep '^kernels' "$W/c/summary.txt")"

# 4. no whole steps of a candidate whose kernels failed their test here
mkdir -p "$W/d"
printf 'tests ok 1\n--\n' >"$W/d/summary.txt"
printf 'test_runtime: 51 passed, 0 failed (exit 0)\ntest_attention: 79 passed, 1 failed (exit 1)\n' >"$W/d/tests.log"
$GS --cpu --dir "$W/d" --only ab-attention,ab-mlp >"$W/d.out" 2>&1; rc=$?
check '[ "$(state "$W/d" ab-attention)" = skipped ] && grep -q "^ab-attention: test_attention has not passed on this machine" "$W/d/summary.txt"' \
  "ab-attention ran though test_attention failed: $(cat "$W/d/summary.txt")"
check '[ "$(state "$W/d" ab-mlp)" = skipped ] && [ ! -f "$W/d/ab-mlp.log" ] && [ -z "$(state "$W/d" kernels)" ]' \
  "ab-mlp ran without test_gemm's pass, or --only ran another stage"

# 5. a missing test binary fails the stage and the exit code
GPU_SESSION_TESTS="test_runtime test_no_such" $GS --cpu --dir "$W/e" --only tests >"$W/e.out" 2>&1; rc=$?
check '[ $rc -eq 1 ] && [ "$(state "$W/e" tests)" = failed ] && grep -q "^test_no_such: not built" "$W/e/tests.log"' \
  "a missing test binary: exit $rc, state $(state "$W/e" tests)"

# 6. bad arguments
for args in "--budget soon" "--only tests,lunch" "--dir" "--frobnicate"; do
  out=$($GS $args 2>&1); rc=$?
  check '[ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && [[ "$out" == "gpu_session.sh: "* ]]' "'$args': exit $rc, '$out'"
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
