#!/usr/bin/env bash
# test_mlm_head.sh: the MLM head's logits in chunks (model.h, bert_head_decoder) as users see it:
#   - the planner (--plan-only, bert-base on a 94 GB H100 NVL): the "MLM head:" line gives the chunk (R, Vp) with
#     R = min(M, 4096) and M the plan's masked rows, and its bytes, and what the whole (M, Vp) would take; the
#     planner's B is the largest that fits, and the whole (M, Vp) logits at that B would not fit: the memory
#     freed went to the micro-batch; a small M (tiny, B=8) takes R = M;
#   - a real run with M > 4096 (tiny, T=32, B=1000: M = 5344, two chunks, the last of 1248 rows, with more than
#     4096 masked tokens, so the second chunk holds real ones): the same run twice with 4 OS threads gives
#     byte-identical checkpoints, and its validation (chunked) gives the masked tokens, accuracy and loss of
#     --eval at B=125 (one chunk per micro-batch) over the same sequences (the whole validation split).
# No GPU needed. The C tests of the chunks themselves are in tests/test_model.cu (test_head_chunks).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_mlm_head: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_head_XXXXXX)
trap 'rm -rf "$W"' EXIT

# 1. the planner: bert-base, T=512, a 94 GB device (the reserve: 5% of it)
NVL=(--plan-only --preset bert-base --device "NVIDIA H100 NVL" --device-mem 94)
./trainer_cpu "${NVL[@]}" >"$W/auto.log" 2>&1
rc=$?
plan=$(sed -n -E 's/^memory plan \(B=([0-9]+), T=([0-9]+), M=([0-9]+),.*/\1 \2 \3/p' "$W/auto.log")
head=$(sed -n -E 's/^  MLM head: logits in chunks of \(R, Vp\) = \(([0-9]+), ([0-9]+)\) x ([0-9]+) bytes, ([0-9.]+) GiB; the whole \(M, Vp\) = \(([0-9]+), ([0-9]+)\) would take ([0-9.]+) GiB$/\1 \2 \3 \4 \5 \6 \7/p' "$W/auto.log")
total=$(sed -n -E 's/^  batch buffers .* total ([0-9.]+) GiB for B=.*/\1/p' "$W/auto.log")
echo "bert-base, H100 NVL 94 GB: $(grep -E '^memory plan|MLM head' "$W/auto.log" | tr -s ' ')"
check '[ $rc -eq 0 ] && [ -n "$plan" ] && [ -n "$head" ] && [ -n "$total" ]' \
  "--plan-only gave no plan or no MLM head line (exit $rc): $(head -n 8 "$W/auto.log")"
read -r B T M <<<"$plan"
read -r R Vp X head_gib M2 Vp2 whole_gib <<<"$head"
check '[ "$T" = 512 ] && [ "$M" = $(awk -v b="$B" "BEGIN { print int(1.1 * 0.15 * b * 512) + 64 }") ]' \
  "M=$M is not the plan's cap int(1.1 x 0.15 x B x T) + 64 at B=$B"
check '[ "$R" = 4096 ] && [ "$Vp" = 30528 ] && [ "$X" = 2 ] && [ "$M2" = "$M" ] && [ "$Vp2" = 30528 ]' \
  "the chunk is not (4096, 30528) x 2 bytes of the whole ($M, 30528): $head"
check 'awk -v r="$R" -v m="$M" -v v="$Vp" -v h="$head_gib" -v w="$whole_gib" "BEGIN { G = 2^30; exit !(h - r * v * 2 / G < 6e-4 && r * v * 2 / G - h < 6e-4 && w - m * v * 2 / G < 6e-4 && m * v * 2 / G - w < 6e-4) }"' \
  "the head's GiB $head_gib / $whole_gib are not R x Vp x 2 / M x Vp x 2"
# the largest B that fits: B+1 does not; the whole logits at B would not fit either (the freed bytes went to B)
./trainer_cpu "${NVL[@]}" --batch $((B + 1)) >"$W/b1.log" 2>&1
total1=$(sed -n -E 's/^  batch buffers .* total ([0-9.]+) GiB for B=.*/\1/p' "$W/b1.log")
budget=$(awk 'BEGIN { printf "%.4f", (94e9 - 94e9 / 20) / 2^30 }')
check 'awk -v a="$total" -v b="$total1" -v c="$budget" "BEGIN { exit !(a <= c && b > c) }"' \
  "B=$B is not the largest that fits $budget GiB: total $total GiB at B, $total1 GiB at B+1"
check 'awk -v a="$total" -v h="$head_gib" -v w="$whole_gib" -v c="$budget" "BEGIN { exit !(a + w - h > c) }"' \
  "at B=$B the whole (M, Vp) logits would fit too ($total + $whole_gib - $head_gib GiB <= $budget): the planner did not use the freed memory"
echo "bert-base: B=$B; the whole logits would take $(awk -v a="$total" -v h="$head_gib" -v w="$whole_gib" 'BEGIN { printf "%.3f", a + w - h }') GiB of the $budget GiB budget"
# a small M: one chunk of all M rows
./trainer_cpu --plan-only --preset tiny --seq 32 --batch 8 >"$W/tiny.log" 2>&1
check 'grep -q "^  MLM head: logits in chunks of (R, Vp) = (106, 216) x [24] bytes, .* the whole (M, Vp) = (106, 216)" "$W/tiny.log"' \
  "tiny, B=8, T=32 (M=106): not one chunk of all 106 rows: $(grep 'MLM head' "$W/tiny.log")"

# 2. a run with two chunks: bitwise repeatable, and its validation equals --eval's at a B of one chunk
python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ] && [ -f "$W/data/val_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
RUN=(--data "$W/data/train_*.bin" --val "$W/data/val_*.bin" --preset tiny --seq 32 --batch 1000 --lr 5e-3 --warmup 1
  --seed 7 --steps 1 --val-every 1)
for r in a b; do EMU_THREADS=4 ./trainer_cpu "${RUN[@]}" --out "$W/$r" >"$W/$r.log" 2>&1; done
check 'grep -q "^  MLM head: logits in chunks of (R, Vp) = (4096, 264) x [24] bytes, .* the whole (M, Vp) = (5344, 264)" "$W/a.log"' \
  "tiny, B=1000, T=32: not chunks of 4096 of 5344 rows: $(grep 'MLM head' "$W/a.log")"
check '[ -f "$W/a/checkpoint.bin" ] && cmp -s "$W/a/checkpoint.bin" "$W/b/checkpoint.bin"' \
  "two chunks: the same run twice (EMU_THREADS=4) gave different checkpoints: $(tail -n 2 "$W/a.log")"
./trainer_cpu --eval "$W/a/checkpoint.bin" --val "$W/data/val_*.bin" --seq 32 --batch 125 \
  --out "$W/e" >"$W/e.log" 2>&1
field() { grep "\"kind\":\"$1\"" "$2" | tail -n 1 | tr ',{}' '\n\n\n' | sed -n "s/^\"$3\"://p"; }
v="$(field val "$W/a/metrics.jsonl" val_masked) $(field val "$W/a/metrics.jsonl" val_sequences) $(field val "$W/a/metrics.jsonl" val_accuracy)"
e="$(field eval "$W/e/metrics.jsonl" val_masked) $(field eval "$W/e/metrics.jsonl" val_sequences) $(field eval "$W/e/metrics.jsonl" val_accuracy)"
echo "validation in two chunks (B=1000): masked, sequences, accuracy $v; --eval at B=125: $e"
check '[ "$(field val "$W/a/metrics.jsonl" val_masked)" -gt 4096 ] && [ "$v" = "$e" ]' \
  "the chunked validation's masked tokens (want > 4096), sequences and accuracy ($v) are not --eval's at B=125 ($e)"
check 'awk -v a="$(field val "$W/a/metrics.jsonl" val_loss)" -v b="$(field eval "$W/e/metrics.jsonl" val_loss)" "BEGIN { exit !(a > 0 && (a - b) / a < 1e-5 && (b - a) / a < 1e-5) }"' \
  "the chunked validation's loss $(field val "$W/a/metrics.jsonl" val_loss) is not --eval's $(field eval "$W/e/metrics.jsonl" val_loss)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
