#!/usr/bin/env bash
# test_format.sh: every C/CUDA source follows .clang-format (one check per file). Run by tests/run.sh.
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "test_format: no clang-format here, nothing to check"
  echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
pass=0; fail=0
for f in $(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null); do
  if clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then pass=$((pass + 1))
  else fail=$((fail + 1)); echo "FAIL test_format: $f is not clang-formatted (clang-format -i $f)"; fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
