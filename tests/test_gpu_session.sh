#!/usr/bin/env bash
# test_gpu_session.sh: tools/gpu_session.sh, the one script a session with a lent GPU runs, exercised on the CPU
# runtime (--cpu: the same stages at tiny sizes, with the CPU build's binaries):
#   - every stage runs and passes, in the order build, tests, bench, peer, kernels, profile, sanitize, tests-rest,
#     its log and the summary hold the test lines and the benchmarks' results (bench_kernels's, or the line that says
#     it is not built where this tree has no tests/bench_kernels.cu); the peer, profile and sanitize stages are
#     skipped, as they need a GPU; the candidates' stages (ab-*, matmul) are gone;
#   - a second call with the same --dir runs the build again (the binaries there known to be this tree's by the
#     stamp the first build wrote) and nothing that passed;
#   - a stage is not started when its estimate does not fit the budget left;
#   - the build's estimate (a stand-in GPU tree: a stand-in build.sh, nvcc and binaries): with --prebuilt of this
#     tree and a budget under the 300 s of a real build, the build takes the pack, compiles nothing and the tests
#     run; without binaries of this tree the build is skipped and so are the stages after it, saying why; binaries
#     a passing build left are this tree's until a source changes;
#   - the peer stage takes mlm.c's side from the bench stage's log (not run again) and times the peer at the given
#     micro-batches (a stand-in for the peer's Python), or runs the trainer itself where the bench stage has not
#     passed; the summary holds its table; bench_vs_peer.sh's new options refuse bad values in one line;
#   - the profile stage runs ncu (a stand-in) on both kernel benchmarks and the summary has a line per kernel; a
#     profiler that profiled nothing fails the stage; a passing build leaves no log;
#   - the sanitize stage runs each of compute-sanitizer's checks (a stand-in) on the test, its lines in tests.log and
#     the summary; a hazard fails the stage;
#   - --pack FILE (the GPU build's, and the CPU build's) and --prebuilt FILE: a pack of this tree is taken (its
#     binaries touched newer than their sources), one of another tree, or no pack, is not, and says so;
#   - a test binary that is missing fails the tests stage and the exit code;
#   - bad arguments (a removed stage among them) give one line and exit code 2.
# Needs ./build.sh all (build/test_*, build/bench_*, ./trainer_cpu; ./trainer and build/gpu/ for the GPU pack).
# Run by tests/run.sh; prints "N passed, N failed".
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
for s in build tests bench kernels tests-rest; do
  check '[ "$(state "$W/a" $s)" = ok ]' "stage $s: $(state "$W/a" $s), expected ok"
done
check '[ "$(state "$W/a" peer)" = skipped ] && grep -q "^peer: needs a GPU" "$W/a/summary.txt"' "the peer is not skipped as needing a GPU"
check '[ "$(state "$W/a" profile)" = skipped ] && grep -q "^profile: needs a GPU" "$W/a/summary.txt"' "the profile is not skipped as needing a GPU"
check '[ "$(state "$W/a" sanitize)" = skipped ] && grep -q "^sanitize: needs a GPU" "$W/a/summary.txt"' "the sanitize stage is not skipped as needing a GPU"
order=$(grep -o -E '^gpu_session: [a-z-]+ (\(|skipped)' "$W/a.out" | awk '{ print $2 }' | tr '\n' ' ')
check '[ "$order" = "build tests bench peer kernels profile sanitize tests-rest " ]' \
  "the stages did not run in the order build, tests, bench, peer, kernels, profile, sanitize, tests-rest: $order"
check '! grep -q -E "^(ab-mlp|ab-attention|matmul|ab-matmul) " "$W/a/summary.txt" && ! grep -q -E -- "--(mlp|attention|matmul-algos)( |$)" "$W/a.out"' \
  "a candidate's stage or flag is still there: $(grep -E -- 'ab-|matmul|--mlp|--attention' "$W/a.out" | head -n 3)"
check '[ ! -f "$W/a/build.log" ]' "a passing build left its log"
for t in test_runtime test_attention test_kernels; do  # (test_kernels: the tests-rest stage's, after)
  check 'grep -q -E "^$t: [0-9]+ passed, 0 failed \(exit 0\)$" "$W/a/summary.txt"' "the summary has no passing line for $t"
done
check 'grep -q "^gpu_session: bench (.*): EMU_DEVICE_BYTES=[0-9]* ./trainer_cpu --bench --preset mini --seq 32 --bench-steps 1 --batch 4 --bench-warmup 1$" "$W/a.out" && grep -q "^bench-result preset=mini T=32 batch=4 " "$W/a/summary.txt" && grep -A 12 "^-- bench" "$W/a/summary.txt" | grep -q -E "^  (matmuls|tokens/s) "' \
  "the bench stage did not run ./trainer_cpu --bench, or the summary lacks its result and phases: $(sed -n '/^-- bench/,/^-- /p' "$W/a/summary.txt" | head -n 5)"
check 'grep -q "^bench-attention-result shape=tiny " "$W/a/summary.txt"' "the summary lacks bench_attention's result line"
if [ -x build/bench_kernels ]; then
  check '! grep -q "bench_kernels: skipped" "$W/a/kernels.log" && grep -q "^gpu_session: kernels (.*): .* && build/bench_kernels --tiny$" "$W/a.out"' \
    "bench_kernels is built but the kernels stage did not run it: $(grep '^gpu_session: kernels' "$W/a.out")"
else  # (tests/bench_kernels.cu not written yet in this tree: the stage goes on, and says so)
  check '[ ! -f tests/bench_kernels.cu ] && grep -q -x "bench_kernels: skipped: not built (no tests/bench_kernels.cu in this tree)" "$W/a/summary.txt"' \
    "bench_kernels is not built, and the kernels stage did not say it was skipped: $(sed -n '/^-- kernels/,$p' "$W/a/summary.txt" | tail -n 3)"
fi
check '[ "$(tail -n +2 "$W/a.out" | grep -c "^== gpu_session summary")" = 1 ] && tail -n 1 "$W/a.out" | grep -q -v "^gpu_session: "' \
  "the summary is not printed last"

# 2. a second call goes on: the build again (its binaries this tree's, by the stamp the first build wrote), nothing
# that passed
cp "$W/a/kernels.log" "$W/kernels.before"
$GS --cpu --dir "$W/a" >"$W/b.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^gpu_session: build (" "$W/b.out" && ! grep -q -E "^gpu_session: (tests|bench|kernels|tests-rest) \(" "$W/b.out"' \
  "the second call (exit $rc) ran stages that had passed: $(grep '^gpu_session: ' "$W/b.out" | tr '\n' ';')"
check 'grep -q "^gpu_session: the binaries here are this tree.s (stamp [0-9a-f]\{16\}): the build should compile nothing$" "$W/b.out"' \
  "the second call did not know its binaries as this tree's: $(head -n 2 "$W/b.out")"
check 'cmp -s "$W/a/kernels.log" "$W/kernels.before" && [ "$(state "$W/a" kernels)" = ok ]' "the second call changed a passed stage's log or state"

# 3. the budget: a stage starts only if its estimate fits what is left (--cpu: the build 5 s where its binaries are
# this tree's, tests 20, bench 20, kernels 30)
$GS --cpu --dir "$W/c" --budget 26 >"$W/c.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/c" build)" = ok ] && [ "$(state "$W/c" kernels)" = skipped ]' \
  "with --budget 26 (exit $rc) kernels was not skipped: $(cat "$W/c/summary.txt")"
check 'grep -q -E "^kernels: needs about 30 s, [0-9]+ s left$" "$W/c/summary.txt" && [ ! -f "$W/c/kernels.log" ]' \
  "the skip does not say why: $(grep '^kernels' "$W/c/summary.txt")"

# 3b. the build's estimate, in GPU mode: a stand-in tree (a copy of the script, a stand-in build.sh, nvcc and
# binaries). A pack of it, taken by --prebuilt on a fresh tree with a budget under a real build's 300 s: the build
# (20 s) compiles nothing and the tests run. (The script before this fix skipped the build, and every stage after.)
FT=$W/ft
mkdir -p "$FT/tools" "$FT/tests" "$FT/build/gpu"
cp "$GS" "$FT/tools/gpu_session.sh"
printf '#!/usr/bin/env bash\necho "build.sh (a stand-in): $*"\n' >"$FT/build.sh"
printf '#!/usr/bin/env bash\necho "nvcc (a stand-in), release 13.0, V13.0.0"\n' >"$W/fake_nvcc"
printf '#!/usr/bin/env bash\necho "a stand-in trainer"\n' >"$FT/trainer"
printf '#!/usr/bin/env bash\necho "3 passed, 0 failed"\n' >"$FT/build/gpu/test_runtime"
chmod +x "$FT/build.sh" "$W/fake_nvcc" "$FT/trainer" "$FT/build/gpu/test_runtime"
echo 'int main() { return 0; }' >"$FT/trainer.cu" && echo '// a test' >"$FT/tests/test_runtime.cu"
echo 'trainer: trainer.cu' >"$FT/build/gpu/trainer.d" && echo 'build/gpu/test_runtime: tests/test_runtime.cu' >"$FT/build/gpu/test_runtime.d"
fgs() { NVCC="$W/fake_nvcc" GPU_SESSION_TESTS=test_runtime "$FT/tools/gpu_session.sh" "$@"; }
fgs --pack "$W/ft.tar.xz" >"$W/ft0.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && tar -tJf "$W/ft.tar.xz" | grep -q -x build/gpu/prebuilt.stamp' "--pack in the stand-in tree (exit $rc): $(tail -n 2 "$W/ft0.out")"
rm -rf "$FT/trainer" "$FT/build"  # a fresh machine: the tree, no binaries
fgs --prebuilt "$W/ft.tar.xz" --budget 200 --only tests --dir "$W/ft1" >"$W/ft1.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/ft1" build)" = ok ] && [ "$(state "$W/ft1" tests)" = ok ] && grep -q -x "test_runtime: 3 passed, 0 failed (exit 0)" "$W/ft1/tests.log"' \
  "--prebuilt of this tree with --budget 200 (exit $rc) did not build and run the tests: $(cat "$W/ft1/summary.txt" 2>/dev/null; tail -n 3 "$W/ft1.out")"
check 'grep -q "^build: prebuilt $W/ft.tar.xz: [0-9]* files built from this tree (stamp [0-9a-f]*), taken$" "$W/ft1/summary.txt" && grep -q "^gpu_session: build ([0-9]* s left): ./build.sh gpu$" "$W/ft1.out"' \
  "the build did not say it took the pack, or did not start with the budget under 300 s: $(grep 'build' "$W/ft1.out" | head -n 3)"
# no binaries of this tree: the build (300 s) is skipped, and the tests after it, each saying why
rm -rf "$FT/trainer" "$FT/build"
fgs --budget 200 --only tests --dir "$W/ft2" >"$W/ft2.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/ft2" build)" = skipped ] && grep -q -E "^build: needs about 300 s, [0-9]+ s left$" "$W/ft2/summary.txt"' \
  "without binaries, --budget 200 (exit $rc) did not skip the build for its 300 s: $(cat "$W/ft2/summary.txt")"
check '[ "$(state "$W/ft2" tests)" = skipped ] && grep -q "^tests: the build was skipped, and the binaries here are not this tree.s" "$W/ft2/summary.txt"' \
  "the tests were not skipped with the reason: $(cat "$W/ft2/summary.txt")"
# binaries carried without a stamp: a build that passes stamps them, and the next call with a short budget runs on
mkdir -p "$W/ftx" && tar -xJf "$W/ft.tar.xz" -C "$W/ftx" && rm "$W/ftx/build/gpu/prebuilt.stamp" && cp -R "$W/ftx/." "$FT/"
fgs --only tests --dir "$W/ft3" >"$W/ft3.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/ft3" build)" = ok ] && [ -s "$FT/build/gpu/prebuilt.stamp" ]' \
  "a build that passed (exit $rc) wrote no stamp: $(cat "$W/ft3/summary.txt")"
fgs --budget 200 --only tests --dir "$W/ft4" >"$W/ft4.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/ft4" build)" = ok ] && [ "$(state "$W/ft4" tests)" = ok ]' \
  "binaries a build here stamped, --budget 200 (exit $rc): $(cat "$W/ft4/summary.txt")"
echo '// edited since' >>"$FT/trainer.cu"  # ... until a source changes
fgs --budget 200 --only tests --dir "$W/ft5" >"$W/ft5.out" 2>&1; rc=$?
check '[ "$(state "$W/ft5" build)" = skipped ] && [ "$(state "$W/ft5" tests)" = skipped ]' \
  "a source edited since the build, --budget 200: the binaries were taken as this tree's: $(cat "$W/ft5/summary.txt")"

# 4. the peer: mlm.c's side from the bench stage's log (not run again), the peer's Python a stand-in timed at the
# micro-batches given (--peer-batch: bench_peer.py --batch); the summary keeps the table
cat >"$W/fake_python" <<'EOF2'
#!/usr/bin/env bash
case " $* " in
  *" --check "*) echo "bench_peer.py: torch 0.0 (stand-in), transformers 0.0, no GPU" ;;
  *) echo "peer: a stand-in"; echo 'peer-result preset=mini T=32 batch=16 max_batch=14 tokens_per_s=1000 step_ms=1 device="none"' ;;
esac
EOF2
chmod +x "$W/fake_python"
mkdir -p "$W/g"
printf 'tests ok 1\nbench ok 1\n--\n' >"$W/g/summary.txt"
echo 'bench-result preset=mini T=32 batch=4 max_batch=3 world=1 tokens_per_s=2500 step_ms=1 mfu=na device="x"' >"$W/g/bench.log"
GPU_SESSION_PYTHON="$W/fake_python" $GS --cpu --dir "$W/g" --only peer >"$W/g.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/g" peer)" = ok ] && grep -q -x "mlm.c: $W/g/bench.log (./trainer --bench.s output, not run again)" "$W/g/peer.log" && ! grep -q "^running: ./trainer_cpu" "$W/g/peer.log"' \
  "the peer (exit $rc, $(state "$W/g" peer)) did not take mlm.c's side from the bench stage's log: $(head -n 4 "$W/g/peer.log"; tail -n 3 "$W/g.out")"
check 'grep -q -x "running: $W/fake_python tools/bench_peer.py --preset mini --seq 32 --steps 1 --batch 4" "$W/g/peer.log"' \
  "the peer was not timed at --batch 4 alone: $(grep '^running: ' "$W/g/peer.log")"
check 'grep -q "^the peer timed at micro-batches 4 only$" "$W/g/summary.txt" && grep -qE "^mini +2500 +3 +n/a +1000 +14 \(16\) +2.50x +0.21x$" "$W/g/summary.txt"' \
  "the summary lacks the peer's table from the bench stage's figures: $(sed -n '/^-- peer/,$p' "$W/g/summary.txt")"
# where the bench stage has not passed, the peer runs the trainer itself
mkdir -p "$W/g2"
printf 'tests ok 1\n--\n' >"$W/g2/summary.txt"
GPU_SESSION_PYTHON="$W/fake_python" $GS --cpu --dir "$W/g2" --only peer >"$W/g2.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/g2" peer)" = ok ] && grep -q "^running: ./trainer_cpu --bench --preset mini --seq 32 --bench-steps 1 --batch 4 --bench-warmup 1$" "$W/g2/peer.log"' \
  "the peer without a bench stage (exit $rc, $(state "$W/g2" peer)) did not run the trainer: $(grep '^running: ' "$W/g2/peer.log"; tail -n 3 "$W/g2.out")"
check 'grep -q "^mlm.c with --batch 4 --bench-warmup 1$" "$W/g2/summary.txt" && grep -qE "^mini +[0-9]+ +[0-9]+ +n/a +1000 " "$W/g2/summary.txt"' \
  "the summary lacks the peer's table: $(sed -n '/^-- peer/,$p' "$W/g2/summary.txt")"
for args in "--peer-batch 64,x" "--peer-batch 0" "--mlmc-log $W/none.log" "--mlmc-log $W/g/bench.log --preset bert-base"; do
  out=$(tools/bench_vs_peer.sh $args 2>&1); rc=$?
  check '[ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && [[ "$out" == "bench_vs_peer.sh: "* ]]' "bench_vs_peer.sh $args: exit $rc, '$out'"
done
out=$(TRAINER_FLAGS="--batch 4" tools/bench_vs_peer.sh --preset mini --seq 32 --mlmc-log "$W/g/bench.log" 2>&1); rc=$?
check '[ $rc -eq 2 ] && [[ "$out" == *"--mlmc-log and TRAINER_FLAGS"* ]]' "--mlmc-log with TRAINER_FLAGS: exit $rc, '$out'"

# 4d. the profile: ncu (a stand-in that runs the program and prints one kernel's report in ncu's layout) on both
# benchmarks (bench_kernels where it is built), a summary line per kernel; a profiler that profiles nothing fails
# the stage
cat >"$W/fake_ncu" <<'EOF2'
#!/usr/bin/env bash
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do shift 2; done  # (every option of the stage's takes a value)
"$@" >/dev/null || exit $?
[ -n "${NCU_NOTHING:-}" ] && { echo "==WARNING== No kernels were profiled."; exit 0; }
cat <<EOF3
==PROF== Connected to process 1 ($1)
  void $(basename "$1")_kernel<64>(__nv_bfloat16 *, const float *, int) (8, 12, 64)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Memory Throughput                 %        46.43
    Duration                         us       102.43
    Compute (SM) Throughput           %        75.33
    ----------------------- ----------- ------------
    OPT   This kernel is limited by a stand-in.
EOF3
EOF2
chmod +x "$W/fake_ncu"
mkdir -p "$W/h"
GPU_SESSION_NCU="$W/fake_ncu" $GS --cpu --dir "$W/h" --only profile >"$W/h.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/h" profile)" = ok ] && grep -q "^gpu_session: profile (.*): $W/fake_ncu .*--kernel-id .*layernorm.* build/bench_attention --tiny && " "$W/h.out"' \
  "the profile (exit $rc, $(state "$W/h" profile)) did not run ncu on bench_attention: $(tail -n 3 "$W/h.out")"
line() { echo "${1}_kernel<64> (8, 12, 64)x(128, 1, 1): Memory Throughput 46.43 %; Duration 102.43 us; Compute (SM) Throughput 75.33 %;"; }
check 'grep -q -x "$(line bench_attention)" "$W/h/summary.txt"' "the summary lacks bench_attention's kernel line: $(sed -n '/^-- profile/,$p' "$W/h/summary.txt")"
if [ -x build/bench_kernels ]; then
  check 'grep -q -x "$(line bench_kernels)" "$W/h/summary.txt"' "the summary lacks bench_kernels's kernel line: $(sed -n '/^-- profile/,$p' "$W/h/summary.txt")"
else
  check 'grep -q -x "bench_kernels: skipped: not built (no tests/bench_kernels.cu in this tree)" "$W/h/summary.txt"' \
    "the profile did not say bench_kernels is not built: $(sed -n '/^-- profile/,$p' "$W/h/summary.txt")"
fi
mkdir -p "$W/i"
NCU_NOTHING=1 GPU_SESSION_NCU="$W/fake_ncu" $GS --cpu --dir "$W/i" --only profile >"$W/i.out" 2>&1; rc=$?
check '[ $rc -eq 1 ] && [ "$(state "$W/i" profile)" = failed ] && grep -q "^profile: exit 1: no kernel profiled" "$W/i/summary.txt"' \
  "a profile of nothing (exit $rc, $(state "$W/i" profile)) did not fail: $(cat "$W/i/summary.txt")"

# 4e. compute-sanitizer (a stand-in that runs the test and prints a summary in compute-sanitizer's layout; a hazard
# in racecheck when SAN_HAZARD=1)
cat >"$W/fake_sanitizer" <<'EOF2'
#!/usr/bin/env bash
tool=$2; shift 4  # --tool TOOL --error-exitcode N PROGRAM
"$@" >/dev/null; rc=$?
if [ -n "${SAN_HAZARD:-}" ] && [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 99
fi
echo "========= ERROR SUMMARY: 0 errors"; exit ${SAN_TEST_RC:-$rc}
EOF2
chmod +x "$W/fake_sanitizer"
mkdir -p "$W/j"
printf 'test_runtime: 55 passed, 0 failed (exit 0)\n' >"$W/j/tests.log"
GPU_SESSION_SANITIZER="$W/fake_sanitizer" $GS --cpu --dir "$W/j" --only sanitize >"$W/j.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/j" sanitize)" = ok ] && [ "$(grep -c -E "^sanitize (memcheck|racecheck|synccheck) test_runtime: ERROR SUMMARY: 0 errors \(exit 0\)$" "$W/j/summary.txt")" = 3 ]' \
  "the sanitize stage (exit $rc, $(state "$W/j" sanitize)) lacks its three passing lines: $(cat "$W/j/summary.txt")"
check 'grep -q "^test_runtime: 55 passed" "$W/j/tests.log" && [ "$(grep -c "^sanitize " "$W/j/tests.log")" = 3 ]' \
  "the sanitize lines did not join tests.log: $(cat "$W/j/tests.log")"
mkdir -p "$W/k2"  # the test's own checks fail under the sanitizer (it serializes kernels), which found nothing: ok
SAN_TEST_RC=1 GPU_SESSION_SANITIZER="$W/fake_sanitizer" $GS --cpu --dir "$W/k2" --only sanitize >"$W/k2.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/k2" sanitize)" = ok ]' \
  "a test failing its own checks under a sanitizer that found nothing (exit $rc) failed the stage: $(cat "$W/k2/summary.txt")"
mkdir -p "$W/k"
SAN_HAZARD=1 GPU_SESSION_SANITIZER="$W/fake_sanitizer" $GS --cpu --dir "$W/k" --only sanitize >"$W/k.out" 2>&1; rc=$?
check '[ $rc -eq 1 ] && [ "$(state "$W/k" sanitize)" = failed ] && grep -q "^sanitize racecheck test_runtime: RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings) (exit 99)$" "$W/k/summary.txt"' \
  "a racecheck hazard (exit $rc, $(state "$W/k" sanitize)) did not fail the stage: $(cat "$W/k/summary.txt")"

# 4g. --pack and --prebuilt. The GPU build's pack (nvcc is here; ./build.sh all made its binaries): ./trainer,
# build/gpu/ and the stamp; --prebuilt takes it (the build stage needs no GPU). Then the CPU build's, taken, and
# tampered with (another stamp, a stand-in trainer_cpu): not taken. Each says which in the summary.
export XZ_OPT="-T0 -0"  # (the fastest xz: this tests the packing, not its ratio)
if [ -x trainer ] && [ -f build/gpu/trainer.d ]; then
  $GS --pack "$W/gpu.tar.xz" >"$W/pg.out" 2>&1; rc=$?
  check '[ $rc -eq 0 ] && grep -q "^gpu_session: packed [0-9]* files of this tree (stamp [0-9a-f]\{16\}) into $W/gpu.tar.xz" "$W/pg.out" && tar -tJf "$W/gpu.tar.xz" | grep -q -x -e trainer && tar -tJf "$W/gpu.tar.xz" | grep -q -x build/gpu/prebuilt.stamp' \
    "--pack (GPU, exit $rc): $(tail -n 2 "$W/pg.out")"
  touch -d '-1 min' "$W/mark"
  $GS --prebuilt "$W/gpu.tar.xz" --only build --dir "$W/pgd" >"$W/pgd.out" 2>&1; rc=$?
  check '[ $rc -eq 0 ] && grep -q "^build: prebuilt $W/gpu.tar.xz: [0-9]* files built from this tree (stamp [0-9a-f]*), taken$" "$W/pgd/summary.txt" && [ trainer -nt "$W/mark" ]' \
    "--prebuilt (GPU, exit $rc) was not taken: $(cat "$W/pgd/summary.txt"; tail -n 2 "$W/pgd.out")"
else
  bad "no GPU build here (./build.sh all makes ./trainer and build/gpu/ where nvcc is)"
fi
$GS --cpu --pack "$W/cpu.tar.xz" >"$W/pc.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && tar -tJf "$W/cpu.tar.xz" | grep -q -x build/cpu/prebuilt.stamp' "--pack --cpu (exit $rc): $(tail -n 2 "$W/pc.out")"
touch -d '-1 min' "$W/mark"
$GS --cpu --prebuilt "$W/cpu.tar.xz" --only build --dir "$W/pcd" >"$W/pcd.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^build: prebuilt $W/cpu.tar.xz: [0-9]* files built from this tree (stamp [0-9a-f]*), taken$" "$W/pcd/summary.txt" && [ trainer_cpu -nt "$W/mark" ]' \
  "--cpu --prebuilt (exit $rc) was not taken: $(cat "$W/pcd/summary.txt")"
mkdir -p "$W/t" && tar -xJf "$W/cpu.tar.xz" -C "$W/t" && echo 0000000000000000 >"$W/t/build/cpu/prebuilt.stamp" &&
  echo "not this tree" >"$W/t/trainer_cpu" && tar -cJf "$W/other.tar.xz" -C "$W/t" .
$GS --cpu --prebuilt "$W/other.tar.xz" --only build --dir "$W/pco" >"$W/pco.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^build: prebuilt $W/other.tar.xz: built from another tree or compiler (stamp 0000000000000000, this tree.s [0-9a-f]*): building here$" "$W/pco/summary.txt" && ./trainer_cpu --help >/dev/null 2>&1' \
  "a pack of another tree (exit $rc) was taken, or not said: $(cat "$W/pco/summary.txt")"
$GS --cpu --prebuilt README.md --only build --dir "$W/pcn" >"$W/pcn.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^build: prebuilt README.md: not a --pack archive of this mode (build/cpu/prebuilt.stamp): building here$" "$W/pcn/summary.txt"' \
  "--prebuilt README.md (exit $rc): $(cat "$W/pcn/summary.txt")"

# 5. a missing test binary fails the stage and the exit code
GPU_SESSION_TESTS="test_runtime test_no_such" $GS --cpu --dir "$W/e" --only tests >"$W/e.out" 2>&1; rc=$?
check '[ $rc -eq 1 ] && [ "$(state "$W/e" tests)" = failed ] && grep -q "^test_no_such: not built" "$W/e/tests.log"' \
  "a missing test binary: exit $rc, state $(state "$W/e" tests)"

# 6. bad arguments
for args in "--budget soon" "--only tests,lunch" "--only ab-mlp" "--only tests,matmul" "--dir" "--frobnicate" "--prebuilt $W/none.tar.xz" "--pack $W/x --only tests"; do
  out=$($GS $args 2>&1); rc=$?
  check '[ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && [[ "$out" == "gpu_session.sh: "* ]]' "'$args': exit $rc, '$out'"
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
