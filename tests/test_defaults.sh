#!/usr/bin/env bash
# test_defaults.sh: defaults that fit the machine the run is on, and validation that can be trusted (CPU build):
#   - on a device of unknown speed (the CPU runtime) a run's automatic micro-batch holds at most 4096 tokens, and
#     the plan line says why; --batch still plans more;
#   - --eval's automatic micro-batch is at most the validation split's rows;
#   - --val-batches N is a sample spread over the whole split: the log says so, it is the same at every validation
#     and in --eval (the same loss), and it is not the split's first N micro-batches;
#   - --device takes a short name (H100, h200, ...) and plans its memory with --plan-only; an unknown name is refused
#     with the known ones listed; --help lists them;
#   - a one-process run's timeout does not blame a dead rank, and without --nccl-timeout it has none;
#   - the ranks agree on --comm's value (onebit against bf16).
# Run by tests/run.sh; needs ./trainer_cpu and tools/requirements.txt. Prints "N passed, N failed" last.
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_defaults: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_defaults_XXXXXX)
trap 'rm -rf "$W"' EXIT
export EMU_THREADS=2

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ] && [ -f "$W/data/val_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
D=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --lr 5e-3 --warmup 1 --seed 7)

# 1. the automatic micro-batch on the CPU runtime: 4096 tokens (B=128 at T=32), said in the plan's line
./trainer_cpu "${D[@]}" --steps 1 --out "$W/a" >"$W/a.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -qE "total .* for B=128 \(4096 tokens: CPU runtime .*speed is unknown, and B=[0-9]+ would fit; --batch N plans more\)" "$W/a.log"' \
  "automatic B on the CPU runtime (exit $rc): $(grep -E "total .* for B=" "$W/a.log"; tail -n 2 "$W/a.log")"
./trainer_cpu "${D[@]}" --steps 1 --batch 200 --out "$W/b" >"$W/b.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -qE "total .* for B=200 \(--batch\)" "$W/b.log"' "--batch 200 (exit $rc): $(grep -E "for B=" "$W/b.log")"
# --plan-only still plans the device's memory (it predicts a GPU run)
./trainer_cpu "${D[@]}" --steps 1 --plan-only >"$W/p.log" 2>&1; rc=$?
pb=$(sed -n -E 's/.*total .* for B=([0-9]+) \(the largest that fits\).*/\1/p' "$W/p.log" | head -n 1)
check '[ $rc -eq 0 ] && [ -n "$pb" ] && [ "$pb" -gt 128 ]' "--plan-only: B '$pb' (want the largest that fits, > 128): $(tail -n 3 "$W/p.log")"

# 2. --val-batches: a sample spread over the split, the same at every validation and in --eval
./trainer_cpu "${D[@]}" --batch 8 --steps 4 --val "$W/data/val_*.bin" --val-every 2 --val-batches 3 --out "$W/v" >"$W/v.log" 2>&1; rc=$?
all=$(sed -n -E 's/^validation: a sample of 3 of the split.s ([0-9]+) micro-batches of B=8 rows, spread evenly over it.*/\1/p' "$W/v.log")
check '[ $rc -eq 0 ] && [ -n "$all" ] && [ "$all" -gt 30 ]' "--val-batches 3 (exit $rc): no sample line, or a split of '$all' micro-batches: $(grep -E "^validation|val loss" "$W/v.log" | head -n 3)"
check 'grep -E "val loss" "$W/v.log" | grep -q "a sample spread over it"' "the validation line does not say it is a sample: $(grep "val loss" "$W/v.log" | head -n 1)"
# the same sequences at every validation and in --eval (its weights, the export's fp32 ones, differ from the bf16
# copies training rounds stochastically: the loss may differ in its last digits, the tokens may not)
seen() { grep -oE "[0-9]+ masked tokens in [0-9]+ sequences" "$1"; }
./trainer_cpu --eval "$W/v" --val "$W/data/val_*.bin" --batch 8 --val-batches 3 >"$W/e.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && [ "$(seen "$W/v.log" | sort -u | wc -l)" = 1 ] && [ "$(seen "$W/v.log" | head -n 1)" = "$(seen "$W/e.log")" ]' \
  "the validations and --eval with the same --val-batches saw other tokens (exit $rc): $(seen "$W/v.log" | tr '\n' ';') eval: $(seen "$W/e.log")"
# 3. --eval's automatic micro-batch: at most the split's rows (a split of 5 samples: B <= 5)
python3 tools/prepare.py bytes --input examples .ci --out "$W/small" --seq-len 32 --val-fraction 0.6 --seed 1 >"$W/small.log" 2>&1  # 38 val samples
sm=$(python3 -c "
import sys; sys.path.insert(0, 'tools'); import prepare, glob
print(sum(int(prepare.read_shard(p)[0]['num_samples']) for p in glob.glob('$W/small/val_*.bin')))" 2>/dev/null)
./trainer_cpu --eval "$W/v" --val "$W/small/val_*.bin" >"$W/es.log" 2>&1; rc=$?
eb=$(sed -n -E 's/.*total .* for B=([0-9]+) .*/\1/p' "$W/es.log" | head -n 1)
check '[ $rc -eq 0 ] && [ -n "$eb" ] && [ -n "$sm" ] && [ "$eb" -le "$sm" ] && [ "$eb" -ge 1 ]' \
  "--eval on a split of '$sm' samples: B '$eb' (want 1..$sm; exit $rc): $(grep -E "for B=|trainer:" "$W/es.log" | head -n 2)"

# 4. --device: short names, memory with --plan-only, unknown names refused with the list, --help lists them
./trainer_cpu "${D[@]}" --steps 1 --plan-only --device h100 >"$W/d.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -qE "^device: .*80\.0 GB free of 80\.0 GB" "$W/d.log"' "--plan-only --device h100 (exit $rc): $(grep "^device:" "$W/d.log")"
./trainer_cpu "${D[@]}" --steps 1 --plan-only --device "NVIDIA H200" >"$W/d2.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -qE "^device: .*141\.0 GB free" "$W/d2.log"' "--device \"NVIDIA H200\" (exit $rc): $(grep "^device:" "$W/d2.log")"
./trainer_cpu "${D[@]}" --steps 1 --plan-only --device "H100" --device-mem 50 >"$W/d3.log" 2>&1; rc=$?
check '[ $rc -eq 0 ] && grep -qE "^device: .*50\.0 GB free" "$W/d3.log"' "--device-mem beats the name's memory (exit $rc): $(grep "^device:" "$W/d3.log")"
./trainer_cpu "${D[@]}" --steps 1 --plan-only --device "B300" >"$W/d4.log" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "trainer: --device B300: unknown; expected one of H100 NVL, H100 PCIe, H100, H200 NVL, H200, GH200, A100" "$W/d4.log"' \
  "--device B300 (exit $rc): $(cat "$W/d4.log")"
check './trainer_cpu --help | grep -q "H100 NVL (94 GB, 835 TFLOP/s)"' "--help does not list the known devices"

# 5. one process, a stalled step: the timeout names this process's device work, not a dead rank
MLM_TEST_STALL=2 timeout 120 ./trainer_cpu "${D[@]}" --batch 8 --steps 4 --out "$W/s" --nccl-timeout 3 >"$W/s.log" 2>&1; rc=$?
check '[ $rc -eq 1 ] && grep -q "this process.s own device work has not finished (one process" "$W/s.log" && ! grep -q "a rank died" "$W/s.log"' \
  "one process, stalled (exit $rc): $(grep -E "progress|trainer:" "$W/s.log" | head -n 2)"

# without --nccl-timeout one process has no deadline (no other rank can die; a slow step is no fault): still waiting
MLM_TEST_STALL=2 timeout -k 2 8 ./trainer_cpu "${D[@]}" --batch 8 --steps 4 --out "$W/s2" >"$W/s2.log" 2>&1; rc=$?
check '[ $rc = 124 ] || [ $rc = 137 ] && grep -q "MLM_TEST_STALL: step 2" "$W/s2.log" && ! grep -q "no progress" "$W/s2.log"' \
  "one process without --nccl-timeout, stalled (exit $rc, want the timeout's 124): $(tail -n 2 "$W/s2.log")"

# the ranks agree on --comm's value: onebit on one and bf16 on the other stop both at the start, naming it
for r in 0 1; do
  c=$([ $r = 0 ] && echo onebit || echo bf16)
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 timeout 120 ./trainer_cpu "${D[@]}" --batch 8 \
    --steps 6 --comm $c --out "$W/c" >"$W/c$r.log" 2>&1 &
done
wait
check 'grep -q -- "--comm" "$W/c0.log" && ! grep -qE "^step +[0-9]+/" "$W/c0.log" "$W/c1.log"' \
  "--comm onebit on rank 0, bf16 on rank 1: $(grep -h "trainer:" "$W/c0.log" "$W/c1.log" | head -n 2)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
