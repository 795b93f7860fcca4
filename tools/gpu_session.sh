#!/usr/bin/env bash
# gpu_session.sh: what a session with a lent GPU runs, as one script that fits the device's calls (at most 10
# minutes each). Stages, in this order:
#   build         ./build.sh gpu (incremental; run at every call, so a fresh machine rebuilds)
#   tests         the GPU tests of what the benchmarks run: the emulator's reading of the PTX ISA (TMA, wgmma
#                 layouts: test_runtime), the candidates' kernels, the default path's kernels and the model
#   kernels       build/gpu/bench_gemm (bert-base, bert-large) and build/gpu/bench_attention
#   ab-mlp        whole steps, --mlp BEST against the default path (tools/bench_ab.py, bert-base)
#   ab-attention  whole steps, --attention BEST against the default path
#   peer          tools/bench_vs_peer.sh: mlm.c against PyTorch + transformers, bert-base and bert-large, with the
#                 flags of each candidate whose whole steps beat the default path in its ab stage (issue 16's targets
#                 are measured this way: the fastest this commit can run)
#   profile       Nsight Compute (ncu) on each kernel of bench_attention and bench_gemm at bert-base, once: time,
#                 throughputs, occupancy, stalls and ncu's own advice, so that a session without a GPU can tune from it
#   sanitize      compute-sanitizer's memcheck, racecheck and synccheck on the tests of the candidates' kernels and of
#                 the emulator's layouts (test_runtime, test_gemm, test_attention); its lines go into tests.log
#   matmul        the matmul shapes of a bert-base --bench step (DIR/matmul-run, DIR/matmul_algos.txt's source), each
#                 timed by build/gpu/bench_matmul --tune against cuBLASLt's other algorithms: DIR/matmul_algos.txt
#                 holds the fastest of each
#   ab-matmul     whole steps, --matmul-algos DIR/matmul_algos.txt against the default path, where bench_matmul found
#                 the step's matmuls at least 1% faster with it
#   tests-rest    every other GPU test binary (its lines go into tests.log too)
#
#   tools/gpu_session.sh [--budget SECONDS] [--dir DIR] [--only STAGE,STAGE] [--prebuilt FILE] [--cpu]
#   tools/gpu_session.sh --pack FILE [--cpu]
#
# --pack FILE builds here (where nvcc is, without a GPU) and writes FILE (tar.xz): ./trainer, build/gpu/ (binaries and
# nvcc's dependency files) and a stamp, a hash of every file of this tree those dependency files name, of build.sh and
# of `nvcc --version`. --prebuilt FILE, on the GPU, unpacks it and, where this tree's stamp is the same, takes its
# binaries (the build stage then compiles nothing: a fresh machine saves the 5 minutes of the GPU build); where it is
# not (another commit, an edit since, another nvcc), it says so and builds here. The device tool's carry takes FILE.
#
# A stage starts only while its estimate fits the time left of --budget (default 540 s), and runs under a timeout
# of what is left, so the script ends inside the call. A stage whose log says it passed is not run again: a second
# call with the same --dir (default runs/gpu_session) goes on where the first stopped. A candidate's whole steps run
# only if its kernels passed their tests on this machine (test_gemm for --mlp, test_attention for --attention):
# timing a wrong kernel says nothing. BEST is the candidates' fastest combination by the kernels stage (its "best="
# at bert-base: --mlp fwd, --attention fwd,dkdv, ...), or all of them (wgmma) where that is the default. Each stage
# writes DIR/STAGE.log; DIR/summary.txt holds each stage's state, time and result lines, and is printed last (the
# device tool brings back 8 files: `tar czf $OUT/gpu_session.tgz -C runs gpu_session` brings DIR as one). --cpu runs the same stages on the CPU runtime at
# tiny sizes (the CPU build's binaries): the script's own test, tests/test_gpu_session.sh. GPU_SESSION_TESTS="test_a
# test_b" names the test binaries instead; GPU_SESSION_PYTHON the peer's Python (with --cpu, a stand-in, without
# which the peer is skipped there); GPU_SESSION_NCU the profiler and GPU_SESSION_SANITIZER compute-sanitizer
# (likewise). The build's log is kept only when it fails (it runs at every call). Exit code 0 when no stage that ran
# failed, 1 when one did, 2 for a bad argument.
set -uo pipefail
cd "$(dirname "$0")/.."
die() { echo "gpu_session.sh: $*" >&2; exit 2; }

BUDGET=540 DIR=runs/gpu_session ONLY="" CPU=0 PACK="" PREBUILT=""
STAGES="build tests kernels ab-mlp ab-attention peer matmul ab-matmul profile sanitize tests-rest"
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) [ $# -ge 2 ] || die "--budget needs a value"; BUDGET=$2; shift 2 ;;
    --dir) [ $# -ge 2 ] || die "--dir needs a value"; DIR=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || die "--only needs a value"; ONLY=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --pack) [ $# -ge 2 ] || die "--pack needs a file"; PACK=$2; shift 2 ;;
    --prebuilt) [ $# -ge 2 ] || die "--prebuilt needs a file"; PREBUILT=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) die "$1: unknown argument (--budget SECONDS --dir DIR --only STAGE,STAGE --cpu)" ;;
  esac
done
[[ "$BUDGET" =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge 1 ] || die "--budget $BUDGET: expected a positive number of seconds"
for s in ${ONLY//,/ }; do [[ " $STAGES " == *" $s "* ]] || die "--only $s: not a stage (expected some of: $STAGES)"; done
[ -z "$PREBUILT" ] || [ -f "$PREBUILT" ] || die "--prebuilt $PREBUILT: no such file (tools/gpu_session.sh --pack makes it)"
[ -z "$PACK" ] || [ -z "$PREBUILT$ONLY" ] || die "--pack FILE builds and packs, and runs no stage (no --prebuilt, --only)"
[ -n "$PACK" ] || mkdir -p "$DIR" || die "cannot create $DIR"
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
limit() { local l; l=$(left); echo $((l > 1 ? l : 1)); }  # a timeout of what is left (timeout 0 would mean none)

# The binaries and sizes of each mode. The estimates (seconds) are what a stage is given room for before it starts.
if [ $CPU = 1 ]; then
  BIN=build TRAINER=./trainer_cpu
  BUILD="./build.sh cpu" CXX=${CXX:-g++}
  TESTS=${GPU_SESSION_TESTS:-test_runtime test_gemm test_attention}
  REST=test_kernels  # (on the CPU: one, not every test)
  KERNELS="build/bench_gemm --tiny && build/bench_attention --tiny"
  AB="python3 tools/bench_ab.py --cpu --rounds 1 $TRAINER $TRAINER"
  SHAPE="--preset mini --seq 32 --batch 4"  # the whole steps' model and micro-batch (the ab stages, the matmul table's)
  AB_ARGS="-- $SHAPE --bench-steps 1 --bench-warmup 1"
  TUNE_ARGS="--iters 1"
  MIN_GAIN=-100  # (the CPU's timings say nothing: ab-matmul always runs, the test of its stage)
  PACK_FILES="trainer_cpu build/test_* build/bench_* build/cpu/*.d build/cpu/prebuilt.stamp" DEPS=build/cpu COMPILER="$CXX --version"
  PEER="EMU_DEVICE_BYTES=1110000000 PYTHON=${GPU_SESSION_PYTHON:-python3} tools/bench_vs_peer.sh --preset mini --seq 32 --steps 1"
  PEER_FLAGS="--batch 4 "
  PROFILE_ARGS="--tiny"
  SANITIZE_TESTS=test_runtime  # (on the CPU: one)
  declare -A EST=([build]=5 [tests]=20 [kernels]=30 [ab-mlp]=60 [ab-attention]=60 [peer]=5 [matmul]=30
    [ab-matmul]=60 [profile]=20 [sanitize]=30 [tests-rest]=10)
else
  BIN=build/gpu TRAINER=./trainer
  BUILD="./build.sh gpu" NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
  # the emulator's reading of the PTX ISA (TMA, wgmma layouts) first, then the candidates, the kernels, the model
  TESTS=${GPU_SESSION_TESTS:-test_runtime test_gemm test_attention test_kernels test_model}
  REST=ALL  # every other test binary built
  KERNELS="build/gpu/bench_gemm && build/gpu/bench_gemm --preset bert-large && build/gpu/bench_attention"
  AB="python3 tools/bench_ab.py --rounds 2 $TRAINER $TRAINER"
  SHAPE="--preset bert-base"
  AB_ARGS="-- $SHAPE"
  TUNE_ARGS=""
  MIN_GAIN=1  # percent of the step's matmul time that the tuned table must save by bench_matmul for ab-matmul to run
  PACK_FILES="trainer build/gpu" DEPS=build/gpu COMPILER="$NVCC --version"
  PEER="PYTHON=${GPU_SESSION_PYTHON:-python3} tools/bench_vs_peer.sh"
  PEER_FLAGS=""
  PROFILE_ARGS="--iters 1"
  SANITIZE_TESTS="test_runtime test_gemm test_attention"
  declare -A EST=([build]=300 [tests]=90 [kernels]=90 [ab-mlp]=200 [ab-attention]=200 [peer]=360 [matmul]=120
    [ab-matmul]=200 [profile]=150 [sanitize]=150 [tests-rest]=180)
fi

# tree_stamp DEPDIR: what the binaries were built from, as a hash: the compiler's release (nvcc's "release 13.0,",
# g++'s first line), build.sh, and the name and content of every file of this tree that DEPDIR's dependency files
# (the compilers' -MMD lists) name; a file missing here changes it too. The headers of the CUDA toolkit (absolute
# paths) go with the compiler's release.
tree_stamp() {
  local f v
  v=$($COMPILER 2>&1)
  { echo "$v" | grep -m 1 -o 'release [0-9.]*,' || echo "$v" | head -n 1; echo "ARCH=${ARCH:-sm_90a}"; cat build.sh
    for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$1"/*.d | tr ' ' '\n' | grep -v -e '^/' -e '^$' | sort -u); do
      echo "== $f"; cat "$f" 2>&1
    done; } | sha256sum | cut -c1-16
}
# --pack FILE: the build, its binaries and dependency files and their stamp, into FILE (written whole, then renamed)
if [ -n "$PACK" ]; then
  $BUILD || { echo "gpu_session.sh: --pack: the build failed" >&2; exit 1; }
  tree_stamp "$DEPS" >"$DEPS/prebuilt.stamp"
  mkdir -p "$(dirname "$PACK")" && XZ_OPT=${XZ_OPT:--T0} tar -cJf "$PACK.tmp" $PACK_FILES && mv "$PACK.tmp" "$PACK" ||
    { rm -f "$PACK.tmp"; echo "gpu_session.sh: --pack $PACK: cannot write it" >&2; exit 1; }
  echo "gpu_session: packed $(tar -tJf "$PACK" | grep -c -v '/$') files of this tree (stamp $(cat "$DEPS/prebuilt.stamp")) into" \
    "$PACK, $(du -k "$PACK" | cut -f1) KB: carry it, and run tools/gpu_session.sh --prebuilt $PACK there"
  exit 0
fi
# use_prebuilt: --prebuilt's binaries, where its stamp is this tree's: unpacked aside, compared, then moved in and
# touched (so that the incremental build finds them newer than their sources). One line says which.
use_prebuilt() {
  local d want have
  d=$(mktemp -d "${TMPDIR:-/tmp}/gpu_prebuilt_XXXXXX")
  if ! tar -xJf "$PREBUILT" -C "$d" 2>/dev/null || [ ! -f "$d/$DEPS/prebuilt.stamp" ]; then
    echo "prebuilt $PREBUILT: not a --pack archive of this mode ($DEPS/prebuilt.stamp): building here"
  else
    want=$(cat "$d/$DEPS/prebuilt.stamp") have=$(tree_stamp "$d/$DEPS")
    if [ "$want" != "$have" ]; then
      echo "prebuilt $PREBUILT: built from another tree or compiler (stamp $want, this tree's $have): building here"
    else
      cp -R "$d/." . && (cd "$d" && find . -type f) | xargs touch
      echo "prebuilt $PREBUILT: $(cd "$d" && find . -type f | wc -l) files built from this tree (stamp $have), taken"
    fi
  fi
  rm -rf "$d"
}

# state: DIR/summary.txt, one line a stage: "STAGE STATE SECONDS", STATE ok, failed, timed-out or skipped
state_of() { awk -v s="$1" '$1 == "--" { exit } $1 == s { st = $2 } END { print st }' "$DIR/summary.txt" 2>/dev/null; }
declare -A STATE SECS WHY
for s in $STAGES; do STATE[$s]=$(state_of "$s"); SECS[$s]=""; WHY[$s]=""; done
STATE[build]=""  # always again: the build is incremental, and a fresh machine has none

# run_tests LIST: the tests stages, each binary in turn, one line "NAME: N passed, N failed" (or why not) a binary
run_tests() {
  local t out last rc
  for t in $1; do
    [ -x "$BIN/$t" ] || { echo "$t: not built"; continue; }
    out=$(timeout "$(limit)" "$BIN/$t" 2>&1); rc=$?
    last=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    [[ "$last" == *" 0 failed" && $rc = 0 ]] || echo "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 30
    echo "$t: ${last:-no summary line} (exit $rc)"
    [ "$(left)" -gt 0 ] || { echo "out of time after $t"; return 124; }
  done
}
# run_sanitize LIST: each of compute-sanitizer's checks on each test binary of LIST, one line a run: "sanitize TOOL
# TEST: its summary (exit N)"; a hazard or error (--error-exitcode 99) or a failing test is a nonzero exit
SANITIZER=${GPU_SESSION_SANITIZER:-compute-sanitizer}
run_sanitize() {
  local t tool out rc
  for t in $1; do
    for tool in memcheck racecheck synccheck; do
      [ -x "$BIN/$t" ] || { echo "sanitize $tool $t: not built"; continue; }  # (no "exit 0": a failure)
      out=$(timeout "$(limit)" $SANITIZER --tool $tool --error-exitcode 99 "$BIN/$t" 2>&1); rc=$?
      [ $rc = 0 ] || echo "$out" | grep -v -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 30
      echo "sanitize $tool $t: $(echo "$out" | grep -E '^=+ [A-Z ]*SUMMARY' | tail -n 1 | sed 's/^=* //') (exit $rc)"
      [ "$(left)" -gt 0 ] || { echo "out of time after $tool $t"; return 124; }
    done
  done
}
# rest_of_tests: REST's binaries (ALL: every test built that TESTS does not name)
rest_of_tests() {
  [ "$REST" = ALL ] || { echo "$REST"; return; }
  (cd "$BIN" 2>/dev/null && ls test_* 2>/dev/null | grep -v '\.d$' | grep -v -x $(printf -- '-e %s ' $TESTS) | tr '\n' ' ')
}
# passed TEST: whether the tests stages' log shows TEST passing on this machine
passed() { grep -q -x "$1: [0-9]* passed, 0 failed (exit 0)" "$DIR/tests.log" 2>/dev/null; }

# best_flag KIND DEFAULT: the kernels stage's fastest way for the trainer's flag (the first bench-KIND-result line,
# bert-base's full rows: best=FLAG), or wgmma (every candidate) when it names none or the default
best_flag() {
  local f
  f=$(grep -h -m 1 -E "^bench-$1-result .* best=[a-z,]+" "$DIR/kernels.log" 2>/dev/null | sed 's/.* best=\([a-z,]*\).*/\1/')
  if [ -n "$f" ] && [ "$f" != "$2" ]; then echo "$f"; else echo wgmma; fi
}
# ab_winner STAGE: the candidate's flags of STAGE's whole steps (bench_ab's "B: ... with FLAGS") if they beat the
# default path there (the median tokens/s, B / A, above 1), else nothing
ab_winner() {
  local r
  r=$(grep -m 1 "tokens/s (each round)" "$DIR/$1.log" 2>/dev/null | awk '{ print $NF }')
  awk -v r="${r:-0}" 'BEGIN { exit !(r > 1) }' && sed -n 's/^B: .* with //p' "$DIR/$1.log" | head -n 1
}
# matmul_gain: how much less of the step's matmul time bench_matmul --tune found with the fastest algorithms, in
# percent (its bench-matmul-result line's step_ms and best_step_ms), or nothing
matmul_gain() {
  sed -n 's/^bench-matmul-result .* step_ms=\([0-9.]*\) best_step_ms=\([0-9.]*\).*/\1 \2/p' "$DIR/matmul.log" 2>/dev/null |
    awk '$1 > 0 { printf "%.2f", 100 * ($1 - $2) / $1 }'
}
# The profile: ncu on the second call of each kernel whose name holds one of these (the first of the benchmarks' two
# warm-up calls comes before it, and both benchmarks start with bert-base's full rows), with the sections that say
# where a kernel's time goes; --clock-control none leaves the clocks as the benchmarks ran them.
NCU=${GPU_SESSION_NCU:-ncu}
NCU_ARGS="--clock-control none --kernel-id '::regex:attention|gemm|gelu|nvjet:2' --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats"
command_of() {
  case "$1" in
    build) echo "$BUILD" ;;
    tests) echo "run_tests '$TESTS'" ;;
    tests-rest) echo "run_tests '$(rest_of_tests)'" ;;
    sanitize) echo "run_sanitize '$SANITIZE_TESTS'" ;;
    kernels) echo "$KERNELS" ;;
    ab-mlp) echo "$AB --b-flags '--mlp $(best_flag gemm cublaslt)' $AB_ARGS" ;;
    ab-attention) echo "$AB --b-flags '--attention $(best_flag attention mma)' $AB_ARGS" ;;
    matmul) echo "rm -rf $DIR/matmul-run && $TRAINER --bench $SHAPE --bench-warmup 1 --bench-steps 1 --out $DIR/matmul-run && $BIN/bench_matmul --tune $DIR/matmul-run/matmul_algos.txt --out $DIR/matmul_algos.txt $TUNE_ARGS" ;;
    ab-matmul) echo "$AB --b-flags '--matmul-algos $DIR/matmul_algos.txt' $AB_ARGS" ;;
    profile) echo "$NCU $NCU_ARGS $BIN/bench_attention $PROFILE_ARGS && $NCU $NCU_ARGS $BIN/bench_gemm $PROFILE_ARGS" ;;
    peer) echo "TRAINER=$TRAINER TRAINER_FLAGS='$PEER_FLAGS$(ab_winner ab-mlp) $(ab_winner ab-attention)' $PEER" ;;
  esac
}
# why_not STAGE: why the stage cannot run now (empty: it can)
why_not() {
  case "$1" in
    ab-mlp) passed test_gemm || { echo "test_gemm has not passed on this machine"; return; } ;;
    ab-attention) passed test_attention || { echo "test_attention has not passed on this machine"; return; } ;;
    ab-matmul)
      [ -s "$DIR/matmul_algos.txt" ] || { echo "no tuned table: the matmul stage has not passed"; return; }
      awk -v g="$(matmul_gain)" -v m=$MIN_GAIN 'BEGIN { exit !(g != "" && g + 0 >= m) }' ||
        { echo "bench_matmul's fastest algorithms save $(matmul_gain)% of the step's matmul time, under $MIN_GAIN%"; return; } ;;
    peer) [ $CPU = 0 ] || [ -n "${GPU_SESSION_PYTHON:-}" ] || { echo "needs a GPU"; return; } ;;
    profile)
      [ $CPU = 0 ] || [ -n "${GPU_SESSION_NCU:-}" ] || { echo "needs a GPU"; return; }
      command -v "$NCU" >/dev/null || { echo "$NCU: not found"; return; } ;;
    sanitize)
      [ $CPU = 0 ] || [ -n "${GPU_SESSION_SANITIZER:-}" ] || { echo "needs a GPU"; return; }
      command -v "$SANITIZER" >/dev/null || { echo "$SANITIZER: not found"; return; } ;;
  esac
  [ "$1" = build ] || [ "${STATE[build]}" = ok ] || { echo "the build did not pass"; return; }
  [ "$(left)" -ge "${EST[$1]}" ] || echo "needs about ${EST[$1]} s, $(left) s left"
}

# profile_table LOG: a line per kernel ncu profiled: its name and grid, then the figures that say what bounds it
profile_table() {
  awk '/, Context [0-9]+, Stream [0-9]+, Device [0-9]+/ {
         if (k != "") print k ":" v
         k = $0; sub(/^ +/, "", k); sub(/^void /, "", k); g = k
         sub(/\(.*/, "", k); sub(/.*\) \(/, "(", g); sub(/, Context.*/, "", g); k = k " " g; v = ""; next }
       k != "" && /^ +(Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread|Warp Cycles Per Issued Instruction) / {
         n = $0; sub(/^ +/, "", n); sub(/  +.*/, "", n); v = v " " n " " $NF " " $(NF - 1) ";" }
       END { if (k != "") print k ":" v }' "$1"
}
write_summary() {
  local s
  {
    for s in $STAGES; do [ -n "${STATE[$s]}" ] && echo "$s ${STATE[$s]} ${SECS[$s]:-0}"; done
    echo "--"
    for s in $STAGES; do [ -n "${WHY[$s]}" ] && echo "$s: ${WHY[$s]}"; done
    for s in $STAGES; do
      [ -f "$DIR/$s.log" ] && [ "$s" != build ] || continue
      echo "-- $s"
      case $s in
        tests) grep -h -E '^(sanitize [a-z]+ )?test_[a-z0-9_]+: ' "$DIR/$s.log" ;;
        kernels) grep -h -E '^(bert-|head size|tiny)|_wgmma|fastest|bench-(gemm|attention)-result' "$DIR/$s.log" ;;
        ab-*) grep -h -E '^B: |^ *(tokens/s|step ms|attention|matmuls|other kernels)' "$DIR/$s.log" ;;
        matmul) grep -h -E 'bench-matmul-result|^bench_matmul: wrote' "$DIR/$s.log" ;;
        peer) grep -h -E '^(device|running): ' "$DIR/$s.log"; sed -n '/^mlm.c vs the PyTorch peer/,$p' "$DIR/$s.log" ;;
        profile) profile_table "$DIR/$s.log" ;;
      esac
    done
  } > "$DIR/summary.txt.tmp" && mv "$DIR/summary.txt.tmp" "$DIR/summary.txt"
}

failed=0
for s in $STAGES; do
  [ -z "$ONLY" ] || [[ ",$ONLY," == *",$s,"* ]] || [ "$s" = build ] || continue
  [ "${STATE[$s]}" = ok ] && continue
  why=$(why_not "$s")
  if [ -n "$why" ]; then
    STATE[$s]=skipped WHY[$s]=$why
    echo "gpu_session: $s skipped: $why"
    write_summary
    continue
  fi
  echo "gpu_session: $s ($(left) s left): $(command_of "$s")"
  t0=$(date +%s)
  log=$DIR/$s.log
  if [ "$s" = build ] && [ -n "$PREBUILT" ]; then
    WHY[build]=$(use_prebuilt)
    echo "gpu_session: ${WHY[build]}"
  fi
  if [ "$s" = tests ] || [ "$s" = tests-rest ]; then  # (these two and sanitize write tests.log)
    log=$DIR/tests.log
    [ "$s" = tests ] && list=$TESTS || list=$(rest_of_tests)
    out=$(run_tests "$list" 2>&1); rc=$?
    echo "$out" | grep -q -v -E '^test_[a-z0-9_]+: [0-9]+ passed, 0 failed \(exit 0\)$' && [ $rc = 0 ] && rc=1
    if [ "$s" = tests ]; then echo "$out" > "$log"; else echo "$out" >> "$log"; fi
  elif [ "$s" = sanitize ]; then
    log=$DIR/tests.log
    out=$(run_sanitize "$SANITIZE_TESTS" 2>&1); rc=$?
    echo "$out" | grep -E '^sanitize [a-z]+ test_[a-z0-9_]+: ' | grep -q -v '(exit 0)$' && [ $rc = 0 ] && rc=1
    echo "$out" >> "$log"
  else
    timeout "$(limit)" bash -c "$(command_of "$s")" > "$log" 2>&1; rc=$?
  fi
  # ncu that could not read the counters (or profiled nothing) still runs the program: no profile is a failure
  [ "$s" = profile ] && [ $rc = 0 ] && [ -z "$(profile_table "$log")" ] && { echo "no kernel profiled" >>"$log"; rc=1; }
  SECS[$s]=$(($(date +%s) - t0))
  case $rc in
    0) STATE[$s]=ok ;;
    124 | 137) STATE[$s]=timed-out WHY[$s]="stopped at the budget's end" failed=1 ;;
    *) STATE[$s]=failed WHY[$s]="exit $rc: $(grep -v '^$' "$log" | tail -n 1 | cut -c1-200)" failed=1 ;;
  esac
  echo "gpu_session: $s ${STATE[$s]} in ${SECS[$s]} s"
  [ "$s" = build ] && [ $rc = 0 ] && rm -f "$log"  # (a passing build's log says nothing)
  write_summary
done
write_summary
echo "== gpu_session summary ($DIR/summary.txt; a stage's log is $DIR/STAGE.log)"
cat "$DIR/summary.txt"
exit $failed
