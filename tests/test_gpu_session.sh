#!/usr/bin/env bash
# test_gpu_session.sh: tools/gpu_session.sh, the one script a session with a lent GPU runs, exercised on the CPU
# runtime (--cpu: the same stages at tiny sizes, with the CPU build's binaries):
#   - every stage runs and passes, its log and the summary hold the test lines and the benchmarks' results; the peer
#     is skipped, as it needs a GPU; the matmul stage tunes the shapes of a --bench step into DIR/matmul_algos.txt,
#     and ab-matmul runs whole steps with it against the default path;
#   - a second call with the same --dir runs the build again and nothing that passed;
#   - a stage is not started when its estimate does not fit the budget left;
#   - a candidate's whole-step benchmark is skipped when its kernels' test did not pass on the machine;
#   - the whole steps run the combination the kernels stage found fastest (--attention fwd,dkdv), or every candidate
#     where that is the default;
#   - the peer stage runs with the flags of each candidate whose whole steps won (a stand-in for the peer's Python),
#     and the summary holds its table;
#   - the profile stage runs ncu (a stand-in) on both kernel benchmarks and the summary has a line per kernel; a
#     profiler that profiled nothing fails the stage; a passing build leaves no log;
#   - the sanitize stage runs each of compute-sanitizer's checks (a stand-in) on the test, its lines in tests.log and
#     the summary; a hazard fails the stage;
#   - --pack FILE (the GPU build's, and the CPU build's) and --prebuilt FILE: a pack of this tree is taken (its
#     binaries touched newer than their sources), one of another tree, or no pack, is not, and says so;
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
for s in build tests kernels ab-mlp ab-attention matmul ab-matmul tests-rest; do
  check '[ "$(state "$W/a" $s)" = ok ]' "stage $s: $(state "$W/a" $s), expected ok"
done
check '[ "$(state "$W/a" peer)" = skipped ] && grep -q "^peer: needs a GPU" "$W/a/summary.txt"' "the peer is not skipped as needing a GPU"
check '[ "$(state "$W/a" profile)" = skipped ] && grep -q "^profile: needs a GPU" "$W/a/summary.txt"' "the profile is not skipped as needing a GPU"
check '[ "$(state "$W/a" sanitize)" = skipped ] && grep -q "^sanitize: needs a GPU" "$W/a/summary.txt"' "the sanitize stage is not skipped as needing a GPU"
check '[ ! -f "$W/a/build.log" ]' "a passing build left its log"
for t in test_runtime test_gemm test_attention test_kernels; do  # (test_kernels: the tests-rest stage's, after)
  check 'grep -q -E "^$t: [0-9]+ passed, 0 failed \(exit 0\)$" "$W/a/summary.txt"' "the summary has no passing line for $t"
done
check 'grep -q "^bench-gemm-result preset=tiny" "$W/a/summary.txt" && grep -q "^bench-matmul-result table=$W/a/matmul-run/matmul_algos.txt " "$W/a/summary.txt"' \
  "the summary lacks bench_gemm's or bench_matmul --tune's result line"
n_run=$(grep -c '^matmul ' "$W/a/matmul-run/matmul_algos.txt" 2>/dev/null)
check '[ "${n_run:-0}" -ge 10 ] && [ "$(grep -c "^matmul " "$W/a/matmul_algos.txt")" = "$n_run" ] && grep -q "^bench_matmul: wrote $W/a/matmul_algos.txt" "$W/a/summary.txt"' \
  "the matmul stage did not tune the --bench step's ${n_run:-no} shapes into $W/a/matmul_algos.txt: $(tail -n 2 "$W/a/matmul.log")"
check 'grep -q "with --matmul-algos $W/a/matmul_algos.txt$" "$W/a/ab-matmul.log" && grep -A 3 "^-- ab-matmul" "$W/a/summary.txt" | grep -q "tokens/s"' \
  "ab-matmul did not run whole steps with the tuned table: $(grep -h ' with ' "$W/a/ab-matmul.log")"
check '[ "$(grep -A 3 "^-- ab-mlp" "$W/a/summary.txt" | grep -c -E "^ *(tokens/s|step ms)")" = 2 ]' \
  "the summary lacks --mlp wgmma's tokens/s and step time against the default"
# (the flags are the kernels stage's best=, or wgmma where that is the default path: on the CPU, timings at random)
flag() { local f; f=$(grep -m 1 "^bench-$1-result" "$W/a/kernels.log" | sed 's/.* best=//'); [ "$f" = "$2" ] && f=wgmma; echo "$f"; }
check 'grep -q "fastest: --attention" "$W/a/summary.txt" && grep -q "fastest: --mlp" "$W/a/summary.txt"' "the summary lacks the kernels' fastest flags"
check 'grep -q "with --attention $(flag attention mma)$" "$W/a/ab-attention.log" && grep -q "with --mlp $(flag gemm cublaslt)$" "$W/a/ab-mlp.log"' \
  "the ab stages did not run the kernels stage's fastest flags ($(flag attention mma), $(flag gemm cublaslt)): $(grep -h ' with ' "$W/a"/ab-*.log | head -n 2)"
check '[ "$(grep -n -m 1 "^test_kernels: " "$W/a/tests.log" | cut -d: -f1)" -gt "$(grep -n -m 1 "^test_attention: " "$W/a/tests.log" | cut -d: -f1)" ] && sed -n "1,/^-- /p" "$W/a/summary.txt" | grep -A 3 "^ab-attention " | grep -q "^peer .*" ' \
  "the stages did not run in the order tests, ..., ab-attention, peer, matmul, tests-rest: $(head -n 9 "$W/a/summary.txt")"
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

# 4b. the whole steps take the kernels stage's fastest flags; where that is the default, every candidate
mkdir -p "$W/f"
printf 'tests ok 1\nkernels ok 1\n--\n' >"$W/f/summary.txt"
printf 'test_gemm: 47 passed, 0 failed (exit 0)\ntest_attention: 80 passed, 0 failed (exit 0)\n' >"$W/f/tests.log"
printf 'bench-gemm-result preset=tiny rows=512 forward_x=1.1 backward_x=0.9 best=fwd\nbench-attention-result shape=tiny rows=full best=dq,dkdv\nbench-attention-result shape=tiny rows=packed best=fwd\n' >"$W/f/kernels.log"
$GS --cpu --dir "$W/f" --only ab-attention,ab-mlp >"$W/f.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "with --attention dq,dkdv$" "$W/f/ab-attention.log" && grep -q "with --mlp fwd$" "$W/f/ab-mlp.log"' \
  "the ab stages (exit $rc) did not take best=fwd and best=dq,dkdv: $(grep -h ' with ' "$W/f"/ab-*.log | head -n 2)"
sed -i 's/best=fwd$/best=cublaslt/' "$W/f/kernels.log"
printf 'tests ok 1\nkernels ok 1\n--\n' >"$W/f/summary.txt"
$GS --cpu --dir "$W/f" --only ab-mlp >"$W/f2.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "with --mlp wgmma$" "$W/f/ab-mlp.log"' "best=cublaslt did not give the whole candidate (exit $rc)"

# 4c. the peer runs with the candidates that won their whole steps (--mlp fwd here, not --attention dkdv), and the
# summary keeps its table (the peer's Python a stand-in)
mkdir -p "$W/g"
printf 'tests ok 1\nkernels ok 1\nab-mlp ok 1\nab-attention ok 1\n--\n' >"$W/g/summary.txt"
printf 'A: ./trainer_cpu\nB: ./trainer_cpu with --mlp fwd\nmini:\n  tokens/s (each round)   100 / 100   110 / 110   1.1000\n' >"$W/g/ab-mlp.log"
printf 'A: ./trainer_cpu\nB: ./trainer_cpu with --attention dkdv\nmini:\n  tokens/s (each round)   100 / 100   90 / 90   0.9000\n' >"$W/g/ab-attention.log"
cat >"$W/fake_python" <<'EOF2'
#!/usr/bin/env bash
case " $* " in
  *" --check "*) echo "bench_peer.py: torch 0.0 (stand-in), transformers 0.0, no GPU" ;;
  *) echo "peer: a stand-in"; echo 'peer-result preset=mini T=32 batch=16 max_batch=14 tokens_per_s=1000 step_ms=1 device="none"' ;;
esac
EOF2
chmod +x "$W/fake_python"
GPU_SESSION_PYTHON="$W/fake_python" $GS --cpu --dir "$W/g" --only peer >"$W/g.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/g" peer)" = ok ] && grep -q "^running: ./trainer_cpu --bench .* --batch 4 --mlp fwd$" "$W/g/peer.log"' \
  "the peer (exit $rc, $(state "$W/g" peer)) did not run with --mlp fwd alone: $(grep '^running: ./trainer' "$W/g/peer.log"; tail -n 3 "$W/g.out")"
check 'grep -q "^mlm.c with --batch 4 --mlp fwd$" "$W/g/summary.txt" && grep -qE "^mini +[0-9]+ +[0-9]+ +n/a +1000 " "$W/g/summary.txt"' \
  "the summary lacks the peer's table: $(sed -n '/^-- peer/,$p' "$W/g/summary.txt")"

# 4d. the profile: ncu (a stand-in that runs the program and prints one kernel's report in ncu's layout) on both
# benchmarks, a summary line per kernel; a profiler that profiles nothing fails the stage
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
check '[ $rc -eq 0 ] && [ "$(state "$W/h" profile)" = ok ] && grep -q "^gpu_session: profile (.*): $W/fake_ncu .*--kernel-id .* build/bench_attention --tiny && " "$W/h.out"' \
  "the profile (exit $rc, $(state "$W/h" profile)) did not run ncu on bench_attention: $(tail -n 3 "$W/h.out")"
for b in bench_attention bench_gemm; do
  check 'grep -q -x "${b}_kernel<64> (8, 12, 64)x(128, 1, 1): Memory Throughput 46.43 %; Duration 102.43 us; Compute (SM) Throughput 75.33 %;" "$W/h/summary.txt"' \
    "the summary lacks $b's kernel line: $(sed -n '/^-- profile/,$p' "$W/h/summary.txt")"
done
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
echo "========= ERROR SUMMARY: 0 errors"; exit $rc
EOF2
chmod +x "$W/fake_sanitizer"
mkdir -p "$W/j"
printf 'test_runtime: 55 passed, 0 failed (exit 0)\n' >"$W/j/tests.log"
GPU_SESSION_SANITIZER="$W/fake_sanitizer" $GS --cpu --dir "$W/j" --only sanitize >"$W/j.out" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(state "$W/j" sanitize)" = ok ] && [ "$(grep -c -E "^sanitize (memcheck|racecheck|synccheck) test_runtime: ERROR SUMMARY: 0 errors \(exit 0\)$" "$W/j/summary.txt")" = 3 ]' \
  "the sanitize stage (exit $rc, $(state "$W/j" sanitize)) lacks its three passing lines: $(cat "$W/j/summary.txt")"
check 'grep -q "^test_runtime: 55 passed" "$W/j/tests.log" && [ "$(grep -c "^sanitize " "$W/j/tests.log")" = 3 ]' \
  "the sanitize lines did not join tests.log: $(cat "$W/j/tests.log")"
mkdir -p "$W/k"
SAN_HAZARD=1 GPU_SESSION_SANITIZER="$W/fake_sanitizer" $GS --cpu --dir "$W/k" --only sanitize >"$W/k.out" 2>&1; rc=$?
check '[ $rc -eq 1 ] && [ "$(state "$W/k" sanitize)" = failed ] && grep -q "^sanitize racecheck test_runtime: RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings) (exit 99)$" "$W/k/summary.txt"' \
  "a racecheck hazard (exit $rc, $(state "$W/k" sanitize)) did not fail the stage: $(cat "$W/k/summary.txt")"

# 4f. ab-matmul waits for a tuned table that saves at least MIN_GAIN (on the CPU -100%: any), and says why not
mkdir -p "$W/l"
$GS --cpu --dir "$W/l" --only ab-matmul >"$W/l.out" 2>&1
check '[ "$(state "$W/l" ab-matmul)" = skipped ] && grep -q "^ab-matmul: no tuned table: the matmul stage has not passed" "$W/l/summary.txt"' \
  "ab-matmul without a table: $(cat "$W/l/summary.txt")"

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
for args in "--budget soon" "--only tests,lunch" "--dir" "--frobnicate" "--prebuilt $W/none.tar.xz" "--pack $W/x --only tests"; do
  out=$($GS $args 2>&1); rc=$?
  check '[ $rc -eq 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && [[ "$out" == "gpu_session.sh: "* ]]' "'$args': exit $rc, '$out'"
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
