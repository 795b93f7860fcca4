#!/usr/bin/env bash
# test_bench.sh: ./trainer_cpu --bench (the timed training step on synthetic data) on the tiny preset,
# and the benchmark tools' parts that run without a GPU:
#   - the table has every phase, positive times where work is done, phases that add up to the step,
#     tokens/s > 0 consistent with the step time, the CPU runtime reported as an unknown peak (no MFU),
#     the planner's largest micro-batch following the device memory, 2 ranks timing their all-reduce;
#   - the training log has no MFU on a device not in the peak table (no number divided by another GPU's peak);
#   - bad flag values give one clear error; tools/bench_peer.py's search for the largest micro-batch;
#     compare_hf.py's attention masks for transformers 4.x and 5.x; tools/bench_vs_peer.sh's table
#     (with a stand-in peer) and its one-line errors without a GPU or without torch;
#   - tests/bench_kernels.cu --tiny: every memory-bound kernel timed, with its bytes.
# Run by tests/run.sh; prints "N passed, N failed" last.
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_bench: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_bench_test_XXXXXX)
trap 'rm -rf "$W"' EXIT
export TMPDIR="$W"  # the synthetic shard goes here (and is removed by the trainer itself)
BENCH=(./trainer_cpu --bench --preset tiny --seq 32 --batch 8 --bench-warmup 1 --bench-steps 3)
row() { sed -n -E "s/^  $2 +([0-9.]+).*/\1/p" "$1" | head -n 1; }    # row LOG NAME: the first figure of a row
result() { sed -n 's/^bench-result .* '"$2"'=\([^ ]*\).*/\1/p' "$1" | head -n 1; }  # result LOG KEY

# 1. the table, on the tiny preset
"${BENCH[@]}" >"$W/a.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -q "^bench tiny: T=32, B=8 " "$W/a.log"' "--bench failed (exit $rc): $(tail -n 3 "$W/a.log")"
sum=0
for p in "data wait" "embedding" "attention forward" "attention backward" "matmuls" "other kernels" "optimizer" \
         "gradient all-reduce"; do
  v=$(row "$W/a.log" "$p")
  check '[ -n "$v" ]' "no row '$p' in the table"
  sum=$(awk -v a="$sum" -v b="${v:-0}" 'BEGIN { print a + b }')
  case "$p" in data*|gradient*) ;; *) check 'awk -v v="${v:-0}" "BEGIN { exit !(v > 0) }"' "phase '$p' took ${v:-?} ms: expected > 0" ;; esac
done
total=$(row "$W/a.log" "sum of phases"); phased=$(row "$W/a.log" "step with phase events \(wall clock\)")
step=$(row "$W/a.log" "step \(wall clock\)")
check 'awk -v a="$sum" -v b="$total" "BEGIN { d = a - b; exit !(b > 0 && d < 0.02 && d > -0.02) }"' \
  "the phase rows add up to $sum ms, the table says $total"
check 'awk -v a="$total" -v b="$phased" "BEGIN { exit !(a > 0 && a <= b * 1.001 + 0.01 && a >= 0.8 * b) }"' \
  "the phases add up to $total ms, the same steps took $phased ms by the wall clock"
check 'awk -v a="$step" "BEGIN { exit !(a > 0) }"' "step time '$step'"
tps=$(result "$W/a.log" tokens_per_s); sms=$(result "$W/a.log" step_ms)
real=$(sed -n -E 's/^  tokens\/s .*real tokens: ([0-9.]+)% of positions.*/\1/p' "$W/a.log")
check 'awk -v t="$tps" -v s="$sms" -v r="$real" "BEGIN { e = r / 100 * 8 * 32 / (s / 1000); exit !(t > 0 && r > 50 && t > 0.97 * e && t < 1.03 * e) }"' \
  "tokens/s $tps does not match ${real}% real tokens of 8 x 32 in $sms ms"
check 'grep -q "unknown dense bf16 peak" "$W/a.log" && grep -q "^  MFU  *n/a" "$W/a.log" && [ "$(result "$W/a.log" mfu)" = na ]' \
  "the CPU runtime is not reported as a device of unknown peak without MFU"
check '[ "$(result "$W/a.log" batch)" = 8 ] && [ "$(result "$W/a.log" world)" = 1 ]' "bench-result line: $(grep bench-result "$W/a.log")"
check '! ls "$W"/mlm_bench_* >/dev/null 2>&1' "the synthetic shard was left in $W"

# 2. the planner's largest micro-batch follows the device memory (the CPU runtime's EMU_DEVICE_BYTES)
EMU_DEVICE_BYTES=1110000000 "${BENCH[@]}" --bench-steps 1 >"$W/m1.log" 2>&1
EMU_DEVICE_BYTES=1120000000 "${BENCH[@]}" --bench-steps 1 >"$W/m2.log" 2>&1
b1=$(result "$W/m1.log" max_batch); b2=$(result "$W/m2.log" max_batch)
check '[ -n "$b1" ] && [ -n "$b2" ] && [ "$b1" -ge 8 ] && [ "$b2" -gt "$b1" ]' \
  "largest micro-batch $b1 at 1.11 GB, $b2 at 1.12 GB: expected it to grow with memory"
check 'grep -q "largest micro-batch (planner) *$b1 " "$W/m1.log"' "the table's largest micro-batch is not the result line's $b1"
EMU_DEVICE_BYTES=1110000000 ./trainer_cpu --bench --preset tiny --seq 32 --batch 100000 >"$W/m3.log" 2>&1; rc=$?
check '[ $rc -ne 0 ] && grep -q "needs .* GiB at B=100000, T=32 but .* GiB are free" "$W/m3.log"' \
  "a --batch that does not fit: exit $rc, $(tail -n 1 "$W/m3.log")"

# 3. two presets in one run, and two ranks (NCCL over shared memory) timing their all-reduce
./trainer_cpu --bench --preset tiny,tiny --seq 16 --batch 4 --bench-warmup 0 --bench-steps 1 >"$W/p.log" 2>&1
check '[ "$(grep -c "^bench-result preset=tiny T=16 batch=4 " "$W/p.log")" = 2 ]' "--preset tiny,tiny did not give two results"
mkdir -p "$W/nccl"
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 "${BENCH[@]}" --out "$W/nccl" >"$W/r$r.log" 2>&1 &
done
wait
ar=$(row "$W/r0.log" "gradient all-reduce")
check '[ "$(result "$W/r0.log" world)" = 2 ] && awk -v v="${ar:-0}" "BEGIN { exit !(v > 0) }"' \
  "2 ranks: world $(result "$W/r0.log" world), all-reduce ${ar:-?} ms: $(tail -n 2 "$W/r0.log" "$W/r1.log")"

# 4. the training log: MFU of an unknown device is not a number divided by some other GPU's peak
python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
./trainer_cpu --data "$W/data/train_*.bin" --out "$W/run" --preset tiny --seq 32 --batch 8 --steps 2 >"$W/t.log" 2>&1
check 'grep -qE "^step +2/2 .*tok/s \| data wait" "$W/t.log" && ! grep -E "^step +2/2" "$W/t.log" | grep -q MFU' "training log: $(grep -E '^step +2/' "$W/t.log")"

# 5. bad flag values: one clear error, non-zero exit
expect_error() {  # expect_error PATTERN ARGS...: the trainer fails with a message matching PATTERN
  local pat=$1; shift
  out=$("$@" 2>&1); rc=$?
  check '[ $rc -ne 0 ] && echo "$out" | grep -q -- "$pat"' "$* gave exit $rc: $(echo "$out" | tail -n 1)"
}
expect_error "--bench-steps 0: expected an integer" ./trainer_cpu --bench --preset tiny --seq 32 --bench-steps 0
expect_error "--bench-warmup x: expected an integer" ./trainer_cpu --bench --preset tiny --seq 32 --bench-warmup x
expect_error "unknown preset nope" ./trainer_cpu --bench --preset tiny,nope --seq 32
check '! echo "$out" | grep -q "^bench tiny"' "--preset tiny,nope ran tiny before rejecting nope"
expect_error "--seq 512 is longer than tiny's 40 positions" ./trainer_cpu --bench --preset tiny
SLURM_NTASKS=2 SLURM_PROCID=0 expect_error "and --bootstrap file needs --out DIR" ./trainer_cpu --bench --bootstrap file --preset tiny --seq 32

# 6. the peer's search for its largest micro-batch, and the micro-batches it times (no torch needed)
out=$(cd tools && python3 -c '
import bench_peer as p
for n in [1, 2, 7, 8, 9, 100, 213, 1000, 65535, 65536, 99999]:
    calls = []
    got = p.find_largest(lambda b: calls.append(b) or b <= n)
    assert got == min(n, 1 << 16) and len(calls) < 40, (n, got, calls)
assert p.find_largest(lambda b: False) == 0
assert p.candidates(588) == [64, 128, 256, 512, 588] and p.candidates(1) == [1]
print("ok")' 2>&1)
check '[ "$out" = ok ]' "bench_peer.find_largest / candidates: $out"

# 7. compare_hf.py's masks: 3-D 1/0 for transformers 4.x, 4-D additive float for 5.x (no torch needed)
out=$(cd tools && python3 -c '
import numpy as np, compare_hf as c
lo = np.array([[0, 0, 2, 2, 2, 5]]); hi = np.array([[2, 2, 5, 5, 5, 5]])  # samples [0,2) [2,5), padding at 5
want = np.zeros((1, 6, 6), bool); want[0, :2, :2] = True; want[0, 2:5, 2:5] = True
m4, m5 = c.packed_attention_mask(lo, hi, 4), c.packed_attention_mask(lo, hi, 5)
assert m4.shape == (1, 6, 6) and m4.dtype == np.int64 and (m4 == want).all(), m4
lowest = np.finfo(np.float32).min
assert m5.shape == (1, 1, 6, 6) and m5.dtype == np.float32, (m5.shape, m5.dtype)
assert (m5[:, 0] == np.where(want, 0, lowest)).all(), m5
print("ok")' 2>&1)
check '[ "$out" = ok ]' "compare_hf.packed_attention_mask: $out"

# 8. without torch or a GPU, the tools stop with one line and a non-zero exit
one_line_error() {  # one_line_error PATTERN CMD...: exit != 0, stderr exactly one line matching PATTERN
  local pat=$1; shift
  "$@" >"$W/o.out" 2>"$W/o.err"; rc=$?
  check '[ $rc -ne 0 ] && [ "$(grep -c . "$W/o.err")" = 1 ] && grep -q -- "$pat" "$W/o.err"' \
    "$* gave exit $rc, stderr: $(head -c 300 "$W/o.err")"
}
if python3 -c "import torch, transformers" 2>/dev/null; then
  echo "test_bench: torch and transformers are installed here: their missing-package errors are not checked"
else
  one_line_error "needs PyTorch and transformers" python3 tools/bench_peer.py --preset tiny
  : >"$W/batch_and_logits.bin"  # what test_model_fp32 writes beside its export: compare_hf.py then needs torch
  one_line_error "needs PyTorch and transformers" python3 tools/compare_hf.py "$W"
  one_line_error "the peer cannot run: .*needs PyTorch" env TRAINER=./trainer_cpu tools/bench_vs_peer.sh
fi
if [ -x ./trainer ] && ! ./trainer --info >/dev/null 2>&1; then  # a GPU build on a machine without a GPU
  one_line_error "no usable GPU: ./trainer --info says" tools/bench_vs_peer.sh
fi
one_line_error "is not built" env TRAINER="$W/none" tools/bench_vs_peer.sh
one_line_error "--seq x: expected a positive integer" tools/bench_vs_peer.sh --seq x

# 9. tools/bench_vs_peer.sh's table, with ./trainer_cpu and a stand-in for the peer's Python (the figures
#    of a real peer need a GPU): mlm.c's line comes from the real --bench, the ratios from both.
cat >"$W/fake_python" <<'EOF'
#!/usr/bin/env bash
case " $* " in
  *" --check "*) echo "bench_peer.py: torch 0.0 (stand-in), transformers 0.0, no GPU" ;;
  *) echo "peer: a stand-in"; echo 'peer-result preset=tiny T=32 batch=16 max_batch=14 tokens_per_s=1000 step_ms=1 device="none"' ;;
esac
EOF
chmod +x "$W/fake_python"
#    TRAINER_FLAGS reach the trainer's --bench (here --batch 8: the step's micro-batch, not the planner's largest);
#    the MFU column is n/a on the CPU runtime (no known peak).
EMU_DEVICE_BYTES=1110000000 TRAINER=./trainer_cpu PYTHON="$W/fake_python" LOG_DIR="$W/vs" TRAINER_FLAGS="--batch 8" \
  tools/bench_vs_peer.sh --preset tiny --seq 32 --steps 1 >"$W/vs.log" 2>&1; rc=$?
mt=$(result "$W/vs/mlmc.log" tokens_per_s); mb=$(result "$W/vs/mlmc.log" max_batch)
want=$(awk -v mt="$mt" -v mb="$mb" 'BEGIN { printf "%.2fx %.2fx", mt / 1000, mb / 14 }')
check '[ $rc -eq 0 ] && [ -n "$mt" ] && grep -qE "^tiny +[0-9]+ +$mb +n/a +1000 +14 \(16\) +${want% *} +${want#* }$" "$W/vs.log"' \
  "bench_vs_peer.sh (exit $rc) did not print tiny | $mt | $mb | n/a | 1000 | 14 (16) | $want: $(tail -n 4 "$W/vs.log")"
check '[ "$(result "$W/vs/mlmc.log" batch)" = 8 ] && grep -q "^mlm.c with --batch 8$" "$W/vs.log" && grep -q "^running: .* --batch 8$" "$W/vs.log"' \
  "TRAINER_FLAGS=\"--batch 8\" did not reach the trainer or the table: batch $(result "$W/vs/mlmc.log" batch)"

# tests/bench_kernels.cu on the CPU runtime (--tiny): every kernel's line with its bytes and a time, and its result
# line for scripts; a bad option refused with exit 2
build/bench_kernels --tiny >"$W/bk.log" 2>&1; rc=$?
rows=$(grep -cE '^bench-kernels-result kernel=[a-z0-9_]+ bytes=[0-9]+ ms=[0-9.]+ ' "$W/bk.log")
check '[ $rc -eq 0 ] && [ "$rows" -eq 5 ] && grep -q "kernel=layernorm_backward " "$W/bk.log" && grep -q "kernel=column_sums_fc1 " "$W/bk.log"' \
  "bench_kernels --tiny (exit $rc): $rows of 5 result lines: $(tail -n 3 "$W/bk.log")"
build/bench_kernels --rows >"$W/bk2.log" 2>&1; rc=$?
check '[ $rc -eq 2 ] && grep -q "bench_kernels: unknown or incomplete option" "$W/bk2.log"' "bench_kernels --rows: exit $rc (want 2): $(cat "$W/bk2.log")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
