#!/usr/bin/env bash
# test_plan_scaling.sh: the scaling predictor as users see it (./trainer_cpu --plan-only, --grad-accum auto,
# --global-batch):
#   - the seed paper's cluster (1..128 nodes x 2 H100 NVL, 25 Gb/s), --global-batch 65536: one table per
#     communication mode (fp32, bf16, onebit), one row per node count, each row's global batch GPUs x accum x B
#     at most 65,536 with B at most the planner's; one `scaling-result` line per mode, whose bytes_per_step is
#     the ring all-reduce's 2 (P-1)/P x 4 bytes per gradient (fp32), half of it (bf16), 1/28 (onebit with --comm-refresh 0: a sign bit and 1/256 of an fp32 scale per parameter;
#     about 1/25 with its default refresh, one bf16 step in 100), and
#     whose efficiencies rank onebit > bf16 > fp32; 22 collectives per fp32 step at the default --bucket-mb,
#     more with smaller buckets, and --zero 1's reduce-scatter + all-gather costs more than the all-reduce;
#   - onebit's whole-run average: 20% of the steps at fp32 (the default --comm-warmup), or a run's own share
#     (--steps 1000 --comm-warmup 100: 10%, a higher average);
#   - --grad-accum auto: every row at >= 95% efficiency or marked (cap) by --max-global-batch, which it names;
#   - a real run resolves auto and --global-batch as --plan-only predicts for the same layout;
#   - every start-up line is out before step 1 (stdout to a file, a step that never ends);
#   - an unknown device peak: --plan-only says so (exit 0), --grad-accum auto refuses (exit 1, names --device);
#   - bad values: one clear error each, before step 1, nothing written.
# No GPU needed: --device and --device-mem plan for another device.
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_plan_scaling: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_plan_scaling_XXXXXX)
PID=
trap '[ -n "$PID" ] && kill -KILL $PID 2>/dev/null; rm -rf "$W"' EXIT
PAPER=(--plan-only --device "NVIDIA H100 NVL" --device-mem 94 --nodes 128 --gpus-per-node 2 --net-gbps 25)
# table rows of mode $2 in log $1: nodes GPUs B accum seqs compute collectives comm exposed step efficiency ...
rows() { awk -v m="--comm $2:" 'index($0, m) == 1 { on = 1; next } /^--comm / { on = 0 } on && /^\| [0-9]+ \|/' "$1" |
  sed 's/ (cap)/ cap/' | tr -d '|%' | awk '{$1=$1; print}'; }
result() { grep "^scaling-result .* comm=$2 " "$1" | tr ' ' '\n' | sed -n "s/^$3=//p"; }   # result LOG MODE FIELD

# 1. the paper's cluster, paper-120m, --global-batch 65536
./trainer_cpu "${PAPER[@]}" --preset paper-120m --global-batch 65536 >"$W/gb.log" 2>&1
rc=$?
B=$(sed -n -E 's/^memory plan \(B=([0-9]+), T=([0-9]+).*/\1/p' "$W/gb.log")
check '[ $rc -eq 0 ] && [ -n "$B" ]' "--plan-only on the paper cluster failed (exit $rc): $(tail -n 2 "$W/gb.log")"
numel=$(sed -n -E 's/^scaling prediction: .* ([0-9]+) gradients in ([0-9]+) buckets.*/\1/p' "$W/gb.log")
for m in fp32 bf16 onebit; do
  rows "$W/gb.log" $m >"$W/$m.rows"
  check '[ "$(awk "{print \$1}" "$W/$m.rows" | tr "\n" " ")" = "1 2 4 8 16 32 64 128 " ]' \
    "$m: node counts in the table: $(awk '{print $1}' "$W/$m.rows" | tr '\n' ' ')"
  check 'awk -v B="$B" "{ if (\$2 != 2 * \$1 || \$3 > B || \$5 != \$2 * \$3 * \$4 || \$5 > 65536 || \$5 < 65536 - \$2 * \$4) exit 1 }" "$W/$m.rows"' \
    "$m: a row's global batch is not GPUs x B x accum within 65,536 sequences, B <= $B: $(cat "$W/$m.rows")"
  check '[ "$(result "$W/gb.log" $m nodes) $(result "$W/gb.log" $m gpus) $(result "$W/gb.log" $m global_batch)" = "128 256 65536" ]' \
    "$m: scaling-result line: $(grep "comm=$m " "$W/gb.log")"
  check '[ "$(result "$W/gb.log" $m preset)" = paper-120m ]' "$m: scaling-result names no preset paper-120m"
done
e32=$(result "$W/gb.log" fp32 efficiency); e16=$(result "$W/gb.log" bf16 efficiency); e1=$(result "$W/gb.log" onebit after_warmup)
ew=$(result "$W/gb.log" onebit efficiency)
b32=$(result "$W/gb.log" fp32 bytes_per_step); b16=$(result "$W/gb.log" bf16 bytes_per_step); b1=$(result "$W/gb.log" onebit bytes_per_step)
echo "paper-120m, 256 GPUs, global batch 65,536: efficiency fp32 $e32, bf16 $e16, onebit $ew over the whole run, $e1 after its warm-up"
# onebit's headline is the whole run's (paper_cluster.sbatch's 100,000 steps): its AdamW steps (the warm-up, 1,000
# steps: --warmup's default 1%; then 16 variance steps at each spacing 1, 2, ..., 64 over 2,032 steps, then one in
# 100: 2,081 in all) at bf16's step time, the rest at a compressed step's (the steady state's one step in K = 100
# taken out of the after-the-warm-up figure: 1/e = ((K - 1)/e_compressed + 1/e_bf16)/K)
share=$(sed -n -E 's/^onebit at 256 GPUs: .* over the whole run \(100000 steps, ([0-9.]+)% of them AdamW steps.*/\1/p' "$W/gb.log")
check '[ "$share" = 2.1 ]' "the whole run's AdamW steps: '$share'% of 100,000 (want 2.1: 2,081): $(grep '^onebit at 256' "$W/gb.log")"
check 'awk -v w="$ew" -v b="$e16" -v c="$e1" "BEGIN { k = 100; s = 0.02081; ic = (k / c - 1 / b) / (k - 1); x = 1 / (s / b + (1 - s) * ic); exit !(w > 0.999 * x && w < 1.001 * x) }"' \
  "onebit's whole-run efficiency $ew is not 1 / (0.02081 / bf16's $e16 + 0.97919 / a compressed step's (from $e1))"
check 'awk -v a="$e32" -v b="$e16" -v c="$e1" "BEGIN { exit !(a > 0 && a < b && b < c && c < 1) }"' \
  "efficiencies do not rank fp32 < bf16 < onebit: $e32 $e16 $e1"
# onebit after its warm-up well above bf16 on the seed cluster (88.7% at the measured MFU; 90.7% at 2026-11-23's)
check 'awk -v c="$e1" -v b="$e16" "BEGIN { exit !(c >= 0.85 && c > b + 0.2) }"' "onebit: efficiency $e1 (want >= 0.85, well above bf16's $e16)"
# fp32: every gradient (the slab's numel) 2 x 255/256 x 4 bytes, and the host sync's 32 bytes
check 'awk -v b="$b32" -v n="$numel" "BEGIN { w = 2 * 255 / 256 * (4 * n + 32); exit !(b >= w - 1 && b <= w + 1) }"' \
  "fp32 bytes_per_step $b32 is not 2 x 255/256 x (4 x $numel + 32)"
check 'awk -v a="$b32" -v b="$b16" "BEGIN { r = a / b; exit !(r > 1.99 && r < 2.01) }"' "fp32 / bf16 bytes: $b32 / $b16"
# onebit: 1/28 of fp32 on its compressed steps, and (--comm-refresh, default 100) one bf16 step in K:
# (K-1)/K x 1/28 + 1/K x 1/2 of fp32's bytes, about 25x fewer at K = 100
check 'awk -v a="$b32" -v b="$b1" "BEGIN { k = 100; w = a * ((k - 1) / k / 28.36 + 0.5 / k); r = a / b; exit !(r > 24 && r < 26 && b > 0.98 * w && b < 1.02 * w) }"' \
  "fp32 / onebit bytes with the default refresh: $b32 / $b1 (want 25x)"
./trainer_cpu "${PAPER[@]}" --preset paper-120m --global-batch 65536 --comm onebit --comm-refresh 0 >"$W/r0.log" 2>&1
b0=$(result "$W/r0.log" onebit bytes_per_step); e0=$(result "$W/r0.log" onebit after_warmup)
check 'awk -v a="$b32" -v b="$b0" -v e="$e0" -v f="$e1" "BEGIN { r = a / b; exit !(r > 27 && r < 29 && e > f) }"' \
  "--comm-refresh 0: fp32 / onebit bytes $b32 / $b0 (want 28x), efficiency $e0 (want above the default's $e1)"
check '[ "$(awk "{print \$7}" "$W/fp32.rows" | sort -u)" = 22 ]' \
  "fp32 collectives per step at --bucket-mb 25: $(awk '{print $7}' "$W/fp32.rows" | sort -u | tr '\n' ' ') (want 22)"
# ... a run's own schedule: --steps 1000 --comm-warmup 100: 100 + 92 variance steps (16 at each spacing 1 to 16,
# 12 at 32) of 1,000 are AdamW's, 19.2%, a lower whole-run average than the default's
./trainer_cpu "${PAPER[@]}" --preset paper-120m --global-batch 65536 --comm onebit --steps 1000 --comm-warmup 100 >"$W/w10.log" 2>&1
run_default=$(sed -n -E 's/^onebit at 256 GPUs: ([0-9.]+)% over the whole run.*/\1/p' "$W/gb.log")
run10=$(sed -n -E 's/^onebit at 256 GPUs: ([0-9.]+)% over the whole run \(1000 steps, 19.2% of them AdamW .*/\1/p' "$W/w10.log")
check 'awk -v a="$run10" -v b="$run_default" "BEGIN { exit !(a + 0 < b + 0 && a + 0 > 0) }"' \
  "--comm-warmup 100 of 1000 steps: whole-run '$run10'% (want 19.2% of the steps AdamW's, below the default's '$run_default'%): $(grep '^onebit at 256' "$W/w10.log")"
# the communication grows with the nodes
check 'awk "NR > 1 && \$8 <= prev { exit 1 } { prev = \$8 }" "$W/fp32.rows"' "fp32 comm time does not grow with the nodes"
# smaller buckets: more collectives, each with its latency, so more time; ZeRO-1 costs an all-gather more
./trainer_cpu "${PAPER[@]}" --preset paper-120m --global-batch 65536 --bucket-mb 5 >"$W/b5.log" 2>&1
c5=$(rows "$W/b5.log" fp32 | awk '$1 == 128 { print $7, $8 }')
c25=$(awk '$1 == 128 { print $7, $8 }' "$W/fp32.rows")
check 'awk -v a="$c5" -v b="$c25" "BEGIN { split(a, x, \" \"); split(b, y, \" \"); exit !(x[1] > 4 * y[1] && x[2] > y[2]) }"' \
  "--bucket-mb 5: collectives and ms '$c5' against '$c25' at --bucket-mb 25"
./trainer_cpu "${PAPER[@]}" --preset paper-120m --global-batch 65536 --zero 1 >"$W/z.log" 2>&1
check 'grep -q "ZeRO-1: reduce-scatter" "$W/z.log" && awk -v a="$(result "$W/z.log" fp32 efficiency)" -v b="$e32" "BEGIN { exit !(a < b) }"' \
  "--zero 1 is not predicted slower than the all-reduce: $(result "$W/z.log" fp32 efficiency) vs $e32"

# 2. --grad-accum auto: >= 95% or capped by --max-global-batch (and it says so)
./trainer_cpu "${PAPER[@]}" --preset paper-120m --grad-accum auto >"$W/auto.log" 2>&1
rows "$W/auto.log" fp32 >"$W/auto.rows"
check '[ $(wc -l <"$W/auto.rows") -eq 8 ] && awk "\$5 != \"cap\" && (\$(NF-2) < 95 || \$5 > 65536) { bad = 1 } END { exit bad }" "$W/auto.rows"' \
  "--grad-accum auto left a row below 95% or above 65,536 sequences without the cap: $(cat "$W/auto.rows")"
check 'grep -q "^fp32 at 256 GPUs: --max-global-batch 65536 keeps --grad-accum auto at" "$W/auto.log"' \
  "auto does not say that --max-global-batch capped it"
./trainer_cpu "${PAPER[@]}" --preset paper-120m --grad-accum auto --max-global-batch 100000000 >"$W/auto2.log" 2>&1
check 'rows "$W/auto2.log" fp32 | awk "{ if (\$(NF-2) < 95) exit 1 }"' \
  "without the cap, auto left a row below 95%: $(rows "$W/auto2.log" fp32)"

# 3. a real run resolves auto and --global-batch as --plan-only predicts for the same layout (tiny, 1 process)
python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
LAYOUT=(--preset tiny --seq 32 --batch 8 --device "NVIDIA H100 NVL" --nodes 4 --gpus-per-node 2 --mfu 1e-4)
./trainer_cpu --plan-only "${LAYOUT[@]}" --grad-accum auto >"$W/tiny_plan.log" 2>&1
want=$(rows "$W/tiny_plan.log" fp32 | awk '$1 == 4 { print $4 }')
./trainer_cpu "${LAYOUT[@]}" --grad-accum auto --data "$W/data/train_*.bin" --out "$W/run" --steps 1 >"$W/run.log" 2>&1
rc=$?
got=$(sed -n -E 's/^--grad-accum auto: ([0-9]+) .*/\1/p' "$W/run.log")
check '[ $rc -eq 0 ] && [ -n "$want" ] && [ "$want" -gt 1 ] && [ "$got" = "$want" ]' \
  "training with --grad-accum auto chose '$got', --plan-only predicts '$want' (exit $rc): $(tail -n 2 "$W/run.log")"
check 'grep -q "(1 process(es) x $want micro-batch(es) x B=8)" "$W/run.log"' \
  "the run did not train with $want micro-batches: $(grep '^global batch:' "$W/run.log")"
check 'grep -qE "global batch $((want * 8)) sequences, $((want * 8 * 32)) tokens" "$W/run.log"' \
  "the global batch line is wrong: $(grep 'grad-accum auto' "$W/run.log")"
./trainer_cpu --preset tiny --seq 32 --batch 8 --global-batch 24 --data "$W/data/train_*.bin" --out "$W/gbr" --steps 1 \
  >"$W/gbr.log" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "^--global-batch 24: 3 micro-batch(es) of B=8 on each of 1 GPU(s)" "$W/gbr.log" && grep -q "(1 process(es) x 3 micro-batch(es) x B=8)" "$W/gbr.log"' \
  "--global-batch 24 at B=8 did not train with 3 micro-batches (exit $rc): $(grep -E 'global' "$W/gbr.log")"

# --micro-ms: the compute column is the measured micro-batch (no device peak needed)
./trainer_cpu --plan-only --preset tiny --seq 32 --batch 16 --nodes 4 --micro-ms 300 >"$W/micro.log" 2>&1
check 'grep -q "a micro-batch of B=16 in 300.0 ms (--micro-ms)" "$W/micro.log" && [ "$(rows "$W/micro.log" fp32 | awk "\$1 == 4 { print \$6 }")" = 300.0 ]' \
  "--micro-ms 300: $(rows "$W/micro.log" fp32 | tail -n 1)"

# 4. the start-up lines are flushed: stdout to a file, a first step that takes hours, the lines there at once
./trainer_cpu --preset tiny --seq 32 --batch 8 --grad-accum 100000 --data "$W/data/train_*.bin" --out "$W/slow" \
  --steps 1 >"$W/slow.log" 2>&1 &
PID=$!
for i in $(seq 1 120); do grep -qs '^global batch:' "$W/slow.log" && break; sleep 0.5; done
kill -KILL $PID 2>/dev/null; wait $PID 2>/dev/null; PID=
check 'grep -q "^memory plan" "$W/slow.log" && grep -q "^global batch:" "$W/slow.log"' \
  "start-up lines not out within 60 s before step 1: $(cat "$W/slow.log" | head -n 3)"

# 5. an unknown device peak (the CPU runtime)
./trainer_cpu --plan-only --preset tiny --seq 32 --batch 8 --nodes 2 >"$W/unk.log" 2>&1
rc=$?
check '[ $rc -eq 0 ] && grep -q "peak of device .* is unknown; --device NAME" "$W/unk.log"' \
  "--plan-only on an unknown device (exit $rc): $(tail -n 1 "$W/unk.log")"
./trainer_cpu --preset tiny --seq 32 --batch 8 --grad-accum auto --data "$W/data/train_*.bin" --out "$W/run2" \
  --steps 1 >"$W/unk2.log" 2>&1
rc=$?
check '[ $rc -eq 1 ] && grep -q "grad-accum auto: the bf16 peak of device .* is unknown; name a known one with --device" "$W/unk2.log"' \
  "--grad-accum auto on an unknown device (exit $rc): $(tail -n 1 "$W/unk2.log")"

# 6. bad values: one line naming the flag, exit 1, no checkpoint or log written (DIR/lock, the run lock taken
#    before the ranks meet, is the one file there: it holds nothing of a run)
bad_flag() {  # bad_flag "expected message" flags...
  local want=$1; shift
  rm -rf "$W/bad"
  ./trainer_cpu "$@" >"$W/bad.log" 2>&1
  local rc=$?
  check '[ $rc -eq 1 ] && grep -q -- "$want" "$W/bad.log" && [ -z "$(ls "$W/bad" 2>/dev/null | grep -v -e "^\." -e "^lock$")" ]' \
    "$* gave exit $rc and '$(tail -n 1 "$W/bad.log")' ($(ls "$W/bad" 2>/dev/null | tr '\n' ' ')), expected '$want'"
}
bad_flag "--net-gbps 0: expected a number" --plan-only --preset tiny --net-gbps 0
bad_flag "--grad-accum autox: expected an integer" --plan-only --preset tiny --grad-accum autox
bad_flag "--nodes 0: expected an integer" --plan-only --preset tiny --nodes 0
bad_flag "--mfu 2: expected a number" --plan-only --preset tiny --mfu 2
bad_flag "--link-efficiency 1.5: expected a number" --plan-only --preset tiny --link-efficiency 1.5
bad_flag "--link-efficiency 0: expected a number" --plan-only --preset tiny --link-efficiency 0
bad_flag "--alpha-us x: expected a number" --plan-only --preset tiny --alpha-us x
bad_flag "--global-batch 0: expected an integer" --plan-only --preset tiny --global-batch 0
bad_flag "--max-global-batch 1e3: expected an integer" --plan-only --preset tiny --max-global-batch 1e3
bad_flag "--global-batch and --grad-accum are alternatives" --plan-only --preset tiny --global-batch 64 --grad-accum 2
bad_flag "--global-batch 20: not a multiple of 1 GPU(s) x B=8 = 8 sequences; --batch 5 divides it" --preset tiny --seq 32 --batch 8 \
  --global-batch 20 --data "$W/data/train_*.bin" --out "$W/bad" --steps 1
bad_flag "--device-mem: only with --plan-only" --preset tiny --device-mem 80 --data "$W/data/train_*.bin" --out "$W/bad" --steps 1
bad_flag "--grad-accum auto: not with --bench" --bench --preset tiny --grad-accum auto

# a run whose global batch is below one automatic micro-batch on every GPU takes a smaller micro-batch (not a
# silent larger global batch): --grad-accum auto with --max-global-batch 4, --global-batch 6
python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
RUN=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --steps 1)
./trainer_cpu "${RUN[@]}" --out "$W/ga" --device H200 --grad-accum auto --max-global-batch 4 >"$W/ga.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -q "for B=4 (--max-global-batch 4 sequences on 1 GPU(s))" "$W/ga.log" && grep -q "global batch 4 sequences" "$W/ga.log"' \
  "--grad-accum auto --max-global-batch 4 (exit $rc): $(grep -E "B=|global batch" "$W/ga.log" | head -n 3)"
./trainer_cpu "${RUN[@]}" --out "$W/gb6" --global-batch 6 >"$W/gb6.log" 2>&1; rc=$?
check '[ $rc = 0 ] && grep -q "for B=6 (--global-batch 6 sequences on 1 GPU(s))" "$W/gb6.log"' \
  "--global-batch 6 (exit $rc): $(grep -E "B=|global" "$W/gb6.log" | head -n 3)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
