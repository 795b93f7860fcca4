#!/usr/bin/env bash
# build.sh: builds mlm.c: with no argument, what this machine can run; `./build.sh all`, everything.
#
#   ./trainer        the GPU trainer (nvcc, sm_90a by default: the H100's wgmma needs the "a"; ARCH=sm_80 ./build.sh to change)
#   ./trainer_cpu    the same trainer.cu compiled by g++ against cpu/ (the CPU runtime)
#   build/test_*     the tests on the CPU runtime; build/asan/test_* the same under AddressSanitizer
#   build/gpu/test_* the portable tests compiled by nvcc, to run on a real GPU (and build/gpu/bench_attention)
#
# Usage: ./build.sh [cpu|gpu|all]
#   (none)  what this machine can run: ./trainer_cpu, and with a GPU here (see has_gpu) also ./trainer; no tests
#   cpu     the CPU runtime, ./trainer_cpu and the tests (plain and under ASan)
#   gpu     the nvcc side: ./trainer and build/gpu/test_*
#   all     both (the test command: ./build.sh all && tests/run.sh); gpu parts are skipped with a note
#           when nvcc is missing
# Incremental: a target is rebuilt only when a file it includes (from the compiler's -MMD list) changed.
set -euo pipefail
cd "$(dirname "$0")"

WHAT=${1:-auto}
case "$WHAT" in auto | cpu | gpu | all) ;; *) echo "build.sh: $WHAT: expected cpu, gpu, all or nothing (what this machine can run)" >&2; exit 1 ;; esac
ARCH=${ARCH:-sm_90a}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CXX=${CXX:-g++}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
JOBS=${JOBS:-$(nproc)}

die() { echo "build.sh: $*" >&2; exit 1; }
[ -f "$CUDA_HOME/include/cuda_runtime_api.h" ] ||
  die "no CUDA headers in $CUDA_HOME/include (set CUDA_HOME to the CUDA toolkit; the CPU build needs its headers too)"
NCCL_INC=""
for d in "$CUDA_HOME/include" /usr/include /usr/local/include; do [ -f "$d/nccl.h" ] && { NCCL_INC=$d; break; }; done
[ -n "$NCCL_INC" ] || die "nccl.h not found in $CUDA_HOME/include, /usr/include or /usr/local/include (install NCCL's development package)"

CPU_FLAGS="-std=c++17 -O2 -g -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -Wno-psabi -Icpu/include -I$CUDA_HOME/include -I$NCCL_INC -pthread"
ASAN_FLAGS="-O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
# ptxas: a kernel that spills registers fails the build
# -Igpu: gpu/ptx.h (inline PTX) is the GPU build's <ptx.h>, as cpu/include/ptx.h is the CPU build's
GPU_FLAGS="-std=c++17 -O3 -arch=$ARCH -lineinfo -Xcompiler -Wall -Xptxas --warn-on-spills,--warning-as-error -Igpu -I$NCCL_INC"
GPU_LIBS="-lcublasLt -lcublas -lnccl"

mkdir -p build/cpu build/asan build/gpu

# has_gpu: 0 when this machine has an NVIDIA GPU that ./trainer could run on: `nvidia-smi -L` (installed with
# the driver) lists one, or, without nvidia-smi, the driver's device file /dev/nvidia0 exists. No CUDA probe:
# compiling one takes nvcc as long as a small test, and without a driver there is nothing to probe.
has_gpu() {
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>/dev/null | grep -q '^GPU '; else [ -e /dev/nvidia0 ]; fi
}
# No argument: the trainers this machine can run, without the tests (the Quick start's first command).
TESTS_TOO=1
if [ "$WHAT" = auto ]; then
  TESTS_TOO=0
  if has_gpu; then
    WHAT=all
    echo "build: a GPU is here (nvidia-smi -L): ./trainer_cpu and ./trainer, no tests (./build.sh all builds them)"
  else
    WHAT=cpu
    echo "build: no GPU here (nvidia-smi -L lists none, or no /dev/nvidia0): ./trainer_cpu only; ./build.sh all" \
      "also builds the tests and the GPU binaries"
  fi
fi

# stale OUT DEPFILE: true when OUT is missing or older than any file listed in its dependency file
stale() {
  local out=$1 dep=$2 f
  [ -f "$out" ] && [ -f "$dep" ] || return 0
  [ build.sh -nt "$out" ] && return 0  # flags may have changed
  for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep"); do
    [ "$f" -nt "$out" ] && return 0
  done
  return 1
}

# Jobs run in the background, at most JOBS at once; any failure fails the build.
pids=()
run_job() {
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || die "a compile failed (see above)"; done
  echo "  $1"; shift
  "$@" &
  pids+=($!)
}
wait_all() { local p; for p in "${pids[@]}"; do wait "$p" || die "a compile failed (see above)"; done; pids=(); }

# cpu_obj SRC OUT EXTRA_FLAGS: compile one CPU-runtime or test source with g++
cpu_obj() {
  local src=$1 out=$2; shift 2
  stale "$out" "${out%.o}.d" || return 0
  run_job "g++   $src -> $out" $CXX $CPU_FLAGS "$@" -x c++ -c "$src" -MMD -MF "${out%.o}.d" -o "$out"
}

CPU_SRCS=$(ls cpu/*.cpp)
TESTS=$(ls tests/test_*.cu 2>/dev/null || true)
BENCHES=$(ls tests/bench_*.cu 2>/dev/null || true)   # programs that print figures (CPU build)
GPU_BENCHES="tests/bench_attention.cu tests/bench_kernels.cu"  # ... of which these are also built for the GPU
# tests that only make sense on the CPU runtime (they provoke deadlocks and the like); the rest also build for the GPU
CPU_ONLY_TESTS="tests/test_emulator.cu tests/test_emulated_network.cu tests/test_fuzz_load.cu tests/test_optim.cu"  # (the last two include trainer.cu)
[ $TESTS_TOO = 1 ] || TESTS="" BENCHES="" GPU_BENCHES=""  # no argument: the trainers only

if [ "$WHAT" = all ] || [ "$WHAT" = cpu ]; then
  echo "build: CPU runtime, trainer_cpu$([ $TESTS_TOO = 1 ] && echo " and tests")"
  for s in $CPU_SRCS; do
    b=$(basename "${s%.cpp}")
    cpu_obj "$s" "build/cpu/$b.o"
    [ $TESTS_TOO = 0 ] || cpu_obj "$s" "build/asan/$b.o" $ASAN_FLAGS
  done
  cpu_obj trainer.cu build/cpu/trainer.o
  for t in $TESTS; do
    b=$(basename "${t%.cu}")
    cpu_obj "$t" "build/cpu/$b.o"
    cpu_obj "$t" "build/asan/$b.o" $ASAN_FLAGS
  done
  for t in $BENCHES; do cpu_obj "$t" "build/cpu/$(basename "${t%.cu}").o"; done
  wait_all
  RT_OBJS=$(for s in $CPU_SRCS; do echo "build/cpu/$(basename "${s%.cpp}").o"; done)
  RT_ASAN=$(for s in $CPU_SRCS; do echo "build/asan/$(basename "${s%.cpp}").o"; done)
  link() { # link OUT OBJS... : relink when any object is newer
    local out=$1 o need=0; shift
    [ -f "$out" ] || need=1
    for o in "$@"; do [ "$o" -nt "$out" ] && need=1; done
    [ $need = 1 ] && run_job "link  $out" $CXX -pthread -rdynamic "$@" -o "$out" ${LINK_EXTRA:-} -lrt -ldl
    return 0
  }
  link trainer_cpu build/cpu/trainer.o $RT_OBJS
  for t in $TESTS; do
    b=$(basename "${t%.cu}")
    link "build/$b" "build/cpu/$b.o" $RT_OBJS
    LINK_EXTRA="-fsanitize=address,undefined" link "build/asan/$b" "build/asan/$b.o" $RT_ASAN
  done
  for t in $BENCHES; do b=$(basename "${t%.cu}"); link "build/$b" "build/cpu/$b.o" $RT_OBJS; done
  wait_all
fi

if [ "$WHAT" = all ] || [ "$WHAT" = gpu ]; then
  if ! command -v "$NVCC" >/dev/null 2>&1 && [ ! -x "$NVCC" ]; then
    [ "$WHAT" = gpu ] && die "nvcc not found at $NVCC (set CUDA_HOME or NVCC)"
    echo "build: nvcc not found at $NVCC: skipping the GPU build (set CUDA_HOME or NVCC)"
  else
    for lib in cublasLt cublas nccl; do
      found=""
      for f in "$CUDA_HOME"/lib64/lib$lib.so /usr/lib/*/lib$lib.so /usr/local/lib/lib$lib.so; do [ -e "$f" ] && found=$f; done
      [ -n "$found" ] || die "lib$lib.so not found in $CUDA_HOME/lib64, /usr/lib/* or /usr/local/lib (needed by the GPU build)"
    done
    echo "build: GPU ($ARCH) trainer$([ $TESTS_TOO = 1 ] && echo " and tests")"
    gpu_bin() { # gpu_bin SRC OUT
      local src=$1 out=$2 dep=build/gpu/$(basename "$2").d
      stale "$out" "$dep" || return 0
      run_job "nvcc  $src -> $out" $NVCC $GPU_FLAGS "$src" -MMD -MF "$dep" -o "$out" $GPU_LIBS
    }
    gpu_bin trainer.cu trainer
    for t in $TESTS; do
      case " $CPU_ONLY_TESTS " in *" $t "*) continue ;; esac
      gpu_bin "$t" "build/gpu/$(basename "${t%.cu}")"
    done
    for t in $GPU_BENCHES; do gpu_bin "$t" "build/gpu/$(basename "${t%.cu}")"; done
    wait_all
  fi
fi
echo "build: done"
