#!/usr/bin/env bash
# tools/coverage.sh: line coverage of the trainer's sources by the test suite, on the CPU build.
#
#   tools/coverage.sh            build with gcov into build/coverage/, run the tests, print a table
#   tools/coverage.sh report     print the table again from the last run's counts
#
# The working tree (tracked and untracked files, not the ignored ones) is copied to build/coverage/src so
# that the instrumented trainer_cpu and tests replace nothing of the normal build. trainer.cu and every
# tests/test_*.cu are compiled with --coverage (the CPU runtime in cpu/ without: it is not measured here),
# then build/test_* and the test scripts (tests/test_*.sh, but the format and GPU-build checks) run there.
# A line counts as covered when any test executed it in any translation unit. Printed per file:
# trainer.cu, kernels.cuh, attention.cuh, model.h, data.h, comm.h (executable lines, covered, percent).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/build/coverage
SRC=$OUT/src
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
JOBS=${JOBS:-$(nproc)}
FILES="trainer.cu kernels.cuh attention.cuh model.h data.h comm.h"

report() {
  cd "$SRC" || exit 1
  rm -rf "$OUT/gcov" && mkdir -p "$OUT/gcov"
  for gcda in build/cpu/*.gcda; do
    [ -e "$gcda" ] || continue
    (cd "$OUT/gcov" && gcov --json-format --stdout "$SRC/$gcda" >"$(basename "${gcda%.gcda}").json" 2>/dev/null)
  done
  python3 - "$OUT/gcov" $FILES <<'EOF'
import glob, json, os, sys
d, files = sys.argv[1], sys.argv[2:]
lines = {f: {} for f in files}  # file -> line -> executed at least once
for p in glob.glob(os.path.join(d, "*.json")):
    for doc in open(p):  # one JSON document per line (one per object file)
        doc = doc.strip()
        if not doc:
            continue
        for fi in json.loads(doc).get("files", []):
            name = os.path.basename(fi["file"])
            if name not in lines:
                continue
            for ln in fi["lines"]:
                n = ln["line_number"]
                lines[name][n] = lines[name].get(n, False) or ln["count"] > 0
print(f"{'file':16} {'lines':>7} {'covered':>8} {'coverage':>9}")
for f in files:
    total, hit = len(lines[f]), sum(lines[f].values())
    print(f"{f:16} {total:7} {hit:8} {100.0 * hit / total if total else 0:8.1f}%")
EOF
}
[ "${1:-}" = report ] && { report; exit; }

echo "coverage: copying the working tree to $SRC"
rm -rf "$SRC" && mkdir -p "$SRC"
git ls-files -co --exclude-standard -z | grep -zv '^build/' | tar --null -T - -cf - | tar -xf - -C "$SRC" || exit 1
cd "$SRC"
NCCL_INC=""
for d in "$CUDA_HOME/include" /usr/include /usr/local/include; do [ -f "$d/nccl.h" ] && { NCCL_INC=$d; break; }; done
FLAGS="-std=c++17 -O1 -g -Wno-unknown-pragmas -Icpu/include -I$CUDA_HOME/include -I${NCCL_INC:-$CUDA_HOME/include} -pthread"
mkdir -p build/cpu
compile() {  # compile SRC OBJ EXTRA...: in the background, at most JOBS at once
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  local src=$1 obj=$2; shift 2
  echo "  g++ $src"
  g++ $FLAGS "$@" -x c++ -c "$src" -o "$obj" &
}
for s in cpu/*.cpp; do compile "$s" "build/cpu/$(basename "${s%.cpp}").o" -O2; done
compile trainer.cu build/cpu/trainer.o --coverage
for t in tests/test_*.cu; do compile "$t" "build/cpu/$(basename "${t%.cu}").o" --coverage; done
wait
RT=$(ls build/cpu/{cublas,nccl,runtime}.o)
g++ -pthread -rdynamic --coverage build/cpu/trainer.o $RT -o trainer_cpu -lrt -ldl || exit 1
for t in tests/test_*.cu; do
  b=$(basename "${t%.cu}")
  [ -f "build/cpu/$b.o" ] && g++ -pthread -rdynamic --coverage "build/cpu/$b.o" $RT -o "build/$b" -lrt -ldl
done

echo "coverage: running the tests"
for b in build/test_* tests/test_*.sh; do
  case "$b" in *test_format.sh | *test_gpu_build.sh | *.d) continue ;; esac
  [ -x "$b" ] || [[ "$b" == *.sh ]] || continue
  start=$(date +%s)
  last=$(timeout 1200 bash -c "$( [[ "$b" == *.sh ]] && echo bash) $b" 2>&1 | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  printf '  %-34s %-24s %4ds\n' "$b" "${last:-no summary}" $(($(date +%s) - start))
done
report
