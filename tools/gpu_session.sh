#!/usr/bin/env bash
# gpu_session.sh: what a session with a lent GPU runs, as one script that fits the device's calls (at most 10
# minutes each). Stages, in this order (the most valuable measurements first: a session's device time does not
# reach the end), each with the estimate it needs left of the budget to start (H200, --prebuilt):
#   build       ./build.sh gpu (incremental; run at every call, so a fresh machine rebuilds): 300 s, or 20 s where
#               the binaries here are this tree's (--prebuilt's, or a build here that passed: it compiles nothing)
#   tests       the GPU tests of what the benchmarks run: the emulator's reading of the PTX ISA (TMA, wgmma
#               layouts: test_runtime), the attention kernels, the other kernels and the model: 120 s
#   bench       ./trainer --bench, bert-base and bert-large at T=512, default flags: whole steps, tokens/s, MFU and
#               each phase's time (the figures README quotes): 90 s
#   peer        tools/bench_vs_peer.sh: mlm.c against PyTorch + transformers, bert-base and bert-large (issue 16's
#               targets), mlm.c's side taken from the bench stage's log (not run again), the peer timed at
#               micro-batches 64, 128 and 256 only (its search for its largest still runs): 150 s (240 s where
#               the bench stage has not passed: then it runs mlm.c's --bench itself)
#   kernels     build/gpu/bench_attention and build/gpu/bench_kernels (LayerNorm and the like against a device
#               copy's bandwidth): 60 s
#   profile     Nsight Compute (ncu) on each kernel of bench_attention and bench_kernels, once: time, throughputs,
#               occupancy, stalls and ncu's own advice, so that a session without a GPU can tune from it: 150 s
#   sanitize    compute-sanitizer's memcheck, racecheck and synccheck on test_runtime and test_attention (the
#               emulator's layouts and the attention kernels); its lines go into tests.log: 180 s
#   tests-rest  every other GPU test binary (its lines go into tests.log too): 180 s
# A benchmark whose binary is not built and whose source (tests/NAME.cu) is not in this tree says "NAME: skipped:
# not built" and the stage goes on; one whose source is here and binary is not fails it.
#
#   tools/gpu_session.sh [--budget SECONDS] [--dir DIR] [--only STAGE,STAGE] [--prebuilt FILE] [--cpu]
#   tools/gpu_session.sh --pack FILE [--cpu]
#
# --pack FILE builds here (where nvcc is, without a GPU) and writes FILE (tar.xz): ./trainer, build/gpu/ (binaries and
# nvcc's dependency files) and a stamp, a hash of every file of this tree those dependency files name, of the names
# of the sources build.sh builds, of build.sh and of `nvcc --version`. --prebuilt FILE, on the GPU, unpacks it and,
# where this tree's stamp is the same, takes its binaries (the build stage then compiles nothing: a fresh machine
# saves the 5 minutes of the GPU build); where it is not (another commit, an edit since, another nvcc), it says so
# and builds here. The device tool's carry takes FILE. A build stage that passes writes the same stamp, so a later
# call on the same machine knows its binaries are this tree's too. Where they are (by either stamp), the build's
# estimate is 20 s, not 300; where the build is skipped all the same (a budget under that), the other stages run
# the binaries there; where they are not this tree's, the other stages are skipped and say why.
#
# A stage starts only while its estimate fits the time left of --budget (default 540 s), and runs under a timeout
# of what is left, so the script ends inside the call. A stage whose log says it passed is not run again: a second
# call with the same --dir (default runs/gpu_session) goes on where the first stopped. Each stage writes
# DIR/STAGE.log; DIR/summary.txt holds each stage's state, time and result lines, and is printed last (the device
# tool brings back 8 files: `tar czf $OUT/gpu_session.tgz -C runs gpu_session` brings DIR as one). --cpu runs the
# same stages on the CPU runtime at tiny sizes (the CPU build's binaries): the script's own test,
# tests/test_gpu_session.sh. GPU_SESSION_TESTS="test_a test_b" names the test binaries instead; GPU_SESSION_PYTHON
# the peer's Python (with --cpu, a stand-in, without which the peer is skipped there); GPU_SESSION_NCU the profiler
# and GPU_SESSION_SANITIZER compute-sanitizer (likewise). The build's log is kept only when it fails (it runs at
# every call). Exit code 0 when no stage that ran failed, 1 when one did, 2 for a bad argument.
set -uo pipefail
cd "$(dirname "$0")/.."
die() { echo "gpu_session.sh: $*" >&2; exit 2; }

BUDGET=540 DIR=runs/gpu_session ONLY="" CPU=0 PACK="" PREBUILT=""
STAGES="build tests bench peer kernels profile sanitize tests-rest"
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) [ $# -ge 2 ] || die "--budget needs a value"; BUDGET=$2; shift 2 ;;
    --dir) [ $# -ge 2 ] || die "--dir needs a value"; DIR=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || die "--only needs a value"; ONLY=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --pack) [ $# -ge 2 ] || die "--pack needs a file"; PACK=$2; shift 2 ;;
    --prebuilt) [ $# -ge 2 ] || die "--prebuilt needs a file"; PREBUILT=$2; shift 2 ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) die "$1: unknown argument (--budget SECONDS --dir DIR --only STAGE,STAGE --prebuilt FILE --pack FILE --cpu)" ;;
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

# The binaries and sizes of each mode. The estimates (seconds) are what a stage is given room for before it starts;
# BUILD_CURRENT is the build's where the binaries here are already this tree's (it compiles nothing).
if [ $CPU = 1 ]; then
  BIN=build TRAINER=./trainer_cpu
  BUILD="./build.sh cpu" CXX=${CXX:-g++}
  TESTS=${GPU_SESSION_TESTS:-test_runtime test_attention}
  REST=test_kernels  # (on the CPU: one, not every test)
  BENCH_ARGS="--tiny"  # bench_attention's and bench_kernels'
  # the whole steps (the bench stage's, and the peer's when that stage has not passed): presets, T, timed steps,
  # more trainer flags, the environment; the peer's micro-batches
  PRESETS=mini SEQ=32 STEPS=1 TRAINER_MORE="--batch 4 --bench-warmup 1" RUN_ENV="EMU_DEVICE_BYTES=1110000000 "
  PEER_BATCH=4
  PACK_FILES="trainer_cpu build/test_* build/bench_* build/cpu/*.d build/cpu/prebuilt.stamp" DEPS=build/cpu COMPILER="$CXX --version"
  BUILT="trainer_cpu build/cpu build/asan build/test_* build/bench_*"  # what a build here makes (touched when current)
  PROFILE_ARGS="--tiny"
  SANITIZE_TESTS=test_runtime  # (on the CPU: one)
  BUILD_CURRENT=5
  declare -A EST=([build]=60 [tests]=20 [bench]=20 [peer]=5 [kernels]=30 [profile]=20 [sanitize]=30 [tests-rest]=10)
else
  BIN=build/gpu TRAINER=./trainer
  BUILD="./build.sh gpu" NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
  # the emulator's reading of the PTX ISA (TMA, wgmma layouts) first, then the attention, the kernels, the model
  TESTS=${GPU_SESSION_TESTS:-test_runtime test_attention test_kernels test_model}
  REST=ALL  # every other test binary built
  BENCH_ARGS=""  # (bert-base and bert-large, by default)
  PRESETS=bert-base,bert-large SEQ=512 STEPS=10 TRAINER_MORE="" RUN_ENV=""
  PEER_BATCH=64,128,256  # the peer's fastest on the H200 were 256 (bert-base) and 128 (bert-large; 256 runs out)
  PACK_FILES="trainer build/gpu" DEPS=build/gpu COMPILER="$NVCC --version"
  BUILT="trainer build/gpu"
  PROFILE_ARGS="--iters 1"
  SANITIZE_TESTS="test_runtime test_attention"
  # H200, 2026-11-28: the GPU tests 1-2 minutes, a --bench of bert-base or bert-large under a minute each (26 steps
  # of 0.77 and 0.88 s, the synthetic shard and the planner), the peer several minutes when it also ran mlm.c and
  # timed 5 micro-batches a preset, ncu a few minutes; the build 5 minutes on a fresh machine
  BUILD_CURRENT=20
  declare -A EST=([build]=300 [tests]=120 [bench]=90 [peer]=150 [kernels]=60 [profile]=150 [sanitize]=180
    [tests-rest]=180)
fi

# tree_stamp DEPDIR: what the binaries were built from, as a hash: the compiler's release (nvcc's "release 13.0,",
# g++'s first line), build.sh, the names of the sources build.sh builds (a source added since is a binary missing),
# and the name and content of every file of this tree that DEPDIR's dependency files (the compilers' -MMD lists)
# name; a file missing here changes it too. The headers of the CUDA toolkit (absolute paths) go with the compiler's
# release.
tree_stamp() {
  local f v LC_ALL=C  # (ls and sort in one collation here and there: the H200's locale ordered them otherwise)
  v=$($COMPILER 2>&1)
  { echo "$v" | grep -m 1 -o 'release [0-9.]*,' || echo "$v" | head -n 1; echo "ARCH=${ARCH:-sm_90a}"; cat build.sh
    ls tests/*.cu cpu/*.cpp 2>/dev/null
    for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$1"/*.d 2>/dev/null | tr ' ' '\n' | grep -v -e '^/' -e '^$' | sort -u); do
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
# current_stamp: the stamp of the binaries here when it is this tree's (they were built from it: --prebuilt's, or a
# build stage that passed wrote it), else nothing
current_stamp() {
  local want
  [ -f "$DEPS/prebuilt.stamp" ] || return 0
  want=$(cat "$DEPS/prebuilt.stamp")
  [ "$want" = "$(tree_stamp "$DEPS")" ] && echo "$want"
}

# state: DIR/summary.txt, one line a stage: "STAGE STATE SECONDS", STATE ok, failed, timed-out or skipped
state_of() { awk -v s="$1" '$1 == "--" { exit } $1 == s { st = $2 } END { print st }' "$DIR/summary.txt" 2>/dev/null; }
declare -A STATE SECS WHY
for s in $STAGES; do STATE[$s]=$(state_of "$s"); SECS[$s]=""; WHY[$s]=""; done
STATE[build]=""  # always again: the build is incremental, and a fresh machine has none

# Before the build: --prebuilt's binaries, where they are this tree's; then whether the binaries here are (the build
# then compiles nothing, once they are touched newer than their sources: its estimate is BUILD_CURRENT).
t_prep=$(date +%s)
if [ -n "$PREBUILT" ]; then
  WHY[build]=$(use_prebuilt)
  echo "gpu_session: ${WHY[build]}"
fi
CURRENT=$(current_stamp)
if [ -n "$CURRENT" ]; then
  find $BUILT -type f -exec touch {} + 2>/dev/null
  EST[build]=$BUILD_CURRENT
  echo "gpu_session: the binaries here are this tree's (stamp $CURRENT): the build should compile nothing"
fi
t_prep=$(($(date +%s) - t_prep))

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
# (the stage judges the summaries: below)
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
# bench_cmd PREFIX NAME ARGS: the command line that runs $BIN/NAME ARGS (after PREFIX, a profiler or nothing); where
# NAME is not built and this tree has no tests/NAME.cu (a benchmark not written yet), a line that says it is skipped
bench_cmd() {
  local prefix=$1 name=$2; shift 2
  if [ ! -x "$BIN/$name" ] && [ ! -f "tests/$name.cu" ]; then
    echo "echo '$name: skipped: not built (no tests/$name.cu in this tree)'"
  else
    echo "$prefix${prefix:+ }$BIN/$name${*:+ $*}"
  fi
}
# The profile: ncu on the second call of each kernel whose name holds one of these (the first of the benchmarks'
# warm-up calls comes before it), with the sections that say where a kernel's time goes; --clock-control none leaves
# the clocks as the benchmarks ran them.
NCU=${GPU_SESSION_NCU:-ncu}
NCU_ARGS="--clock-control none --kernel-id '::regex:attention|layernorm|partials_sum|gelu|column_sums:2' --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats"
# the whole steps: the bench stage's, and the peer's mlm.c side (from the bench stage's log where it passed)
WHOLE_STEPS="--preset $PRESETS --seq $SEQ"
command_of() {
  case "$1" in
    build) echo "$BUILD" ;;
    tests) echo "run_tests '$TESTS'" ;;
    tests-rest) echo "run_tests '$(rest_of_tests)'" ;;
    sanitize) echo "run_sanitize '$SANITIZE_TESTS'" ;;
    bench) echo "$RUN_ENV$TRAINER --bench $WHOLE_STEPS --bench-steps $STEPS${TRAINER_MORE:+ $TRAINER_MORE}" ;;
    peer)
      if [ "${STATE[bench]}" = ok ] && [ -s "$DIR/bench.log" ]; then
        echo "${RUN_ENV}TRAINER=$TRAINER PYTHON=${GPU_SESSION_PYTHON:-python3} tools/bench_vs_peer.sh $WHOLE_STEPS --steps $STEPS --peer-batch $PEER_BATCH --mlmc-log $DIR/bench.log"
      else
        echo "${RUN_ENV}TRAINER=$TRAINER TRAINER_FLAGS='$TRAINER_MORE' PYTHON=${GPU_SESSION_PYTHON:-python3} tools/bench_vs_peer.sh $WHOLE_STEPS --steps $STEPS --peer-batch $PEER_BATCH"
      fi ;;
    kernels) echo "$(bench_cmd "" bench_attention $BENCH_ARGS) && $(bench_cmd "" bench_kernels $BENCH_ARGS)" ;;
    profile) echo "$(bench_cmd "$NCU $NCU_ARGS" bench_attention $PROFILE_ARGS) && $(bench_cmd "$NCU $NCU_ARGS" bench_kernels $BENCH_ARGS)" ;;
  esac
}
# why_not STAGE: why the stage cannot run now (empty: it can)
why_not() {
  case "$1" in
    peer) [ $CPU = 0 ] || [ -n "${GPU_SESSION_PYTHON:-}" ] || { echo "needs a GPU"; return; } ;;
    profile)
      [ $CPU = 0 ] || [ -n "${GPU_SESSION_NCU:-}" ] || { echo "needs a GPU"; return; }
      command -v "$NCU" >/dev/null || { echo "$NCU: not found"; return; } ;;
    sanitize)
      [ $CPU = 0 ] || [ -n "${GPU_SESSION_SANITIZER:-}" ] || { echo "needs a GPU"; return; }
      command -v "$SANITIZER" >/dev/null || { echo "$SANITIZER: not found"; return; } ;;
  esac
  if [ "$1" != build ]; then
    case "${STATE[build]}" in
      ok) ;;
      skipped) [ -n "$CURRENT" ] ||
        { echo "the build was skipped, and the binaries here are not this tree's (no stamp of it: --pack and --prebuilt)"; return; } ;;
      *) echo "the build did not pass"; return ;;
    esac
  fi
  local est=${EST[$1]}
  [ "$1" = peer ] && [ "${STATE[bench]}" != ok ] && est=$((est + EST[bench]))  # (it runs mlm.c's --bench itself)
  [ "$(left)" -ge "$est" ] || echo "needs about $est s, $(left) s left"
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
        bench) grep -h -E '^bench [a-z0-9-]+: |^  (attention forward|attention backward|matmuls|other kernels|step \(wall clock\)|tokens/s|MFU) |^bench-result ' "$DIR/$s.log" ;;
        kernels) grep -h -E '^(bert-|head size|tiny)|_wgmma|GB/s|bench-[a-z]+-result|: skipped: not built' "$DIR/$s.log" ;;
        peer) grep -h -E '^(device|running|mlm.c): ' "$DIR/$s.log"; sed -n '/^mlm.c vs the PyTorch peer/,$p' "$DIR/$s.log" ;;
        profile) profile_table "$DIR/$s.log"; grep -h ': skipped: not built' "$DIR/$s.log" ;;
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
    [ "$s" = build ] && [ -n "$CURRENT" ] && why="$why (the binaries here are this tree's, stamp $CURRENT: the stages run them)"
    STATE[$s]=skipped WHY[$s]="$why${WHY[$s]:+; ${WHY[$s]}}"
    echo "gpu_session: $s skipped: $why"
    write_summary
    continue
  fi
  echo "gpu_session: $s ($(left) s left): $(command_of "$s")"
  t0=$(date +%s)
  log=$DIR/$s.log
  if [ "$s" = tests ] || [ "$s" = tests-rest ]; then  # (these two and sanitize write tests.log)
    log=$DIR/tests.log
    [ "$s" = tests ] && list=$TESTS || list=$(rest_of_tests)
    out=$(run_tests "$list" 2>&1); rc=$?
    [ -n "$out" ] || out="(no test binaries to run)"  # (tests-rest where every test built is in TESTS)
    echo "$out" | grep -v -x '(no test binaries to run)' | grep -q -v -E '^test_[a-z0-9_]+: [0-9]+ passed, 0 failed \(exit 0\)$' &&
      [ $rc = 0 ] && rc=1
    if [ "$s" = tests ]; then echo "$out" > "$log"; else echo "$out" >> "$log"; fi
  elif [ "$s" = sanitize ]; then
    log=$DIR/tests.log
    out=$(run_sanitize "$SANITIZE_TESTS" 2>&1); rc=$?
    # a run passes when the sanitizer found nothing (its summary says 0 errors or 0 hazards, and it did not exit
    # 99); the test's own checks may fail (exit 1) under it: the sanitizer runs kernels one at a time, so
    # test_runtime's checks that a spinning kernel leaves its stream busy cannot hold there (the tests stage runs
    # them without it)
    echo "$out" | grep -E '^sanitize [a-z]+ test_[a-z0-9_]+: ' |
      grep -q -v -E ': (ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors, [0-9]+ warnings\)) \(exit [01]\)$' &&
      [ $rc = 0 ] && rc=1
    echo "$out" >> "$log"
  else
    # the build: no stamp while it runs (one stopped halfway leaves binaries of no known tree); a new one if it passes
    [ "$s" = build ] && rm -f "$DEPS/prebuilt.stamp"
    timeout "$(limit)" bash -c "$(command_of "$s")" > "$log" 2>&1; rc=$?
    if [ "$s" = build ]; then
      CURRENT=""
      [ $rc = 0 ] && tree_stamp "$DEPS" >"$DEPS/prebuilt.stamp" && CURRENT=$(cat "$DEPS/prebuilt.stamp")
    fi
  fi
  # ncu that could not read the counters (or profiled nothing) still runs the program: no profile is a failure
  [ "$s" = profile ] && [ $rc = 0 ] && [ -z "$(profile_table "$log")" ] && { echo "no kernel profiled" >>"$log"; rc=1; }
  SECS[$s]=$(($(date +%s) - t0))
  [ "$s" = build ] && SECS[$s]=$((SECS[$s] + t_prep))  # (with --prebuilt's unpacking and the stamps)
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
