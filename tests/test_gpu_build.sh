#!/usr/bin/env bash
# test_gpu_build.sh: the GPU build (nvcc) compiled and linked what it must. Run by tests/run.sh.
# Checks ./trainer and every build/gpu/test_* : an x86-64 executable with device code for $ARCH
# (default sm_90a) embedded, linked against the libraries its source uses. Register spills fail the
# build itself (build.sh passes ptxas --warn-on-spills --warning-as-error).
cd "$(dirname "$0")/.."
ARCH=${ARCH:-sm_90a}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_gpu_build: $*"; }
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "test_gpu_build: no nvcc here, nothing to check"
  echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
bins="trainer $(ls build/gpu/test_* 2>/dev/null | grep -v '\.d$')"
[ -n "$(ls build/gpu/test_* 2>/dev/null)" ] && ok || bad "no GPU test binaries in build/gpu (./build.sh gpu)"
for b in $bins; do
  if [ ! -x "$b" ]; then bad "$b is missing (./build.sh gpu)"; continue; fi
  src=tests/$(basename "$b").cu; [ "$b" = trainer ] && src=trainer.cu
  [ ! "$src" -nt "$b" ] && ok || bad "$b is older than $src (./build.sh gpu)"
  readelf -h "$b" 2>/dev/null | grep -q 'X86-64' && ok || bad "$b is not an x86-64 executable"
  readelf -S "$b" 2>/dev/null | grep -q '\.nv_fatbin' && ok || bad "$b carries no device code (.nv_fatbin)"
  strings -a "$b" | grep -q -- "-arch $ARCH" && ok || bad "$b was not built for $ARCH"
  needed=$(readelf -d "$b" | grep NEEDED)
  if grep -q -E 'cublasLt[A-Za-z]*\(' "$src" kernels.cuh 2>/dev/null && grep -q 'cublasLt' "$src"; then
    echo "$needed" | grep -q libcublasLt && ok || bad "$b uses cuBLASLt but does not link libcublasLt"
  fi
  if grep -q -E 'nccl[A-Z][A-Za-z]*\(' "$src"; then
    echo "$needed" | grep -q libnccl && ok || bad "$b uses NCCL but does not link libnccl"
  fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
