#!/usr/bin/env bash
# test_kernel_report.sh: tools/kernel_report.py --all on the tiny preset (needs nvcc, as ./build.sh all does):
#   - every kernel of a training step in the table, with its launches per step as the CPU runtime counted them
#     (EMU_LAUNCH_STATS=2): no GELU kernel (GELU runs in cuBLASLt's epilogues), the column sums once a layer and
#     once for the decoder, the weights' copy only at start-up (0), 46 launches in all;
#   - ptxas's registers joined to them (sm_90), no kernel spilling, blocks per SM >= 1 for each; (with cuobjdump) no
#     wgmma kernel with a copy of its shuffles for a diverged warp;
#   - the attention-only default still prints its table, and (with cuobjdump) the wgmma kernels' exponentials
#     overlap their products in the SASS.
# Run by tests/run.sh; prints "N passed, N failed" last.
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_kernel_report: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_kernel_report_XXXXXX)
trap 'rm -rf "$W"' EXIT

python3 tools/kernel_report.py --all --preset tiny --seq 32 --batch 8 >"$W/all.log" 2>&1; rc=$?
col() { awk -v k="$1" -v c="$2" '$1 == k { print $c }' "$W/all.log"; }  # col KERNEL N: the row's Nth field
check '[ $rc -eq 0 ]' "kernel_report.py --all failed (exit $rc): $(tail -n 5 "$W/all.log")"
check '[ -z "$(col gelu_forward 2)" ] && [ -z "$(col gelu_backward 2)" ] && [ "$(col column_sums 2)" = 3 ] && [ "$(col copy_to_floatX 2)" = 0 ]' \
  "launches per step: gelu_forward '$(col gelu_forward 2)' and gelu_backward '$(col gelu_backward 2)' (want none: GELU is in cuBLASLt's epilogues), column_sums $(col column_sums 2) (want 3: b1 of each layer, the decoder bias), copy_to_floatX $(col copy_to_floatX 2) (want 0)"
check '[ "$(col column_sums 3)" = 256 ] && [ "$(col column_sums 4)" -gt 0 ] 2>/dev/null' \
  "column_sums: $(col column_sums 3) threads (want 256), $(col column_sums 4) registers (want > 0)"
check 'grep -q "^kernel launches per step: 46; kernels with spills: none; " "$W/all.log"' \
  "the summary line: $(grep '^kernel launches per step' "$W/all.log")"
att=$(awk '$1 ~ /^attention_forward</ { print $2, $7 }' "$W/all.log")
check '[ -n "$att" ] && [ "${att% *}" -gt 0 ] && [ "${att#* }" -ge 1 ]' \
  "attention_forward: launches and blocks per SM '$att' (want > 0 and >= 1)"
rows=$(awk 'NF >= 10 && $2 ~ /^[0-9.]+$/ && $7 ~ /^[0-9]+$/' "$W/all.log" | wc -l)
zero=$(awk 'NF >= 10 && $2 ~ /^[0-9.]+$/ && $7 == 0' "$W/all.log" | wc -l)
check '[ "$rows" -ge 20 ] && [ "$zero" -eq 0 ]' "$rows kernel rows (want >= 20), $zero with 0 blocks per SM"

# the Hopper kernels' shuffles run after mbarrier spin loops in inline PTX: without a __syncwarp after the wait, ptxas
# adds a copy of the code for a diverged warp
coll=$(grep "^kernels with a diverged-warp copy of their shuffles" "$W/all.log")
if [ -n "$coll" ]; then
  check '! echo "$coll" | grep -q "wgmma"' "a wgmma kernel has a diverged-warp copy: $coll"
fi
python3 tools/kernel_report.py >"$W/att.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -qE "^attention_forward<64> +[0-9]+ +0 " "$W/att.log"' \
  "kernel_report.py (attention) failed (exit $rc): $(tail -n 3 "$W/att.log")"
# the wgmma kernels' overlap, where the SASS can be read (cuobjdump, tools/requirements.txt): the forward's
# exponentials of a tile (64 for P and 2 for the rescale) and dK dV's (32 for P^T) run while the previous tile's
# products may (EX2 async, the last column); ptxas once placed the wait above them, which this catches
ex2() { awk -v k="$1" '$1 == k { print $NF }' "$W/att.log"; }
if grep -q "no SASS counts" "$W/att.log"; then
  echo "test_kernel_report: no cuobjdump/nvdisasm, the SASS checks are skipped"
else
  check '[ "$(ex2 "attention_forward_wgmma<64>")" -ge 64 ] 2>/dev/null && [ "$(ex2 "attention_backward_dkdv_wgmma<64>")" -ge 32 ] 2>/dev/null' \
    "EX2 async: attention_forward_wgmma<64> $(ex2 "attention_forward_wgmma<64>") (want >= 64), attention_backward_dkdv_wgmma<64> $(ex2 "attention_backward_dkdv_wgmma<64>") (want >= 32)"
fi
python3 tools/kernel_report.py --all --preset nope >"$W/bad.log" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "kernel_report.py: .*--bench failed" "$W/bad.log"' \
  "a bad --preset: exit $rc, $(tail -n 2 "$W/bad.log")"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
