#!/usr/bin/env bash
# test_loader_auto.sh: --loader-threads auto (the default) through ./trainer_cpu, tiny model:
#   - it prints how many loader threads it chose and why (one thread's measured fill time, the predicted
#     micro-batch time, the cap), and the number follows the rule ceil(1.5 fill / micro), 1 .. cap:
#     an unknown peak (the CPU runtime) keeps 2 (at most the cap); a fast GPU (--device "NVIDIA H100 NVL",
#     tiny batches) takes the cap; a slow one (--micro-ms 1e6) takes 1;
#   - --loader-threads N overrides it (no auto line), and every choice trains the same bits;
#   - a bad value names the flag and what it takes.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_loader_auto: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_loader_XXXXXX)
trap 'rm -rf "$W"' EXIT
python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 8 --steps 4 --lr 5e-3 --warmup 1 --seed 3)

run() {  # run NAME ARGS...: a 4-step run into $W/NAME, its log in $W/NAME.log; its auto line in $line
  name=$1
  ./trainer_cpu "${COMMON[@]}" --out "$W/$name" "${@:2}" >"$W/$name.log" 2>&1
  rc=$?
  check '[ $rc = 0 ] && [ -f "$W/$name/checkpoint.bin" ]' "$name: the run failed (exit $rc): $(tail -n 2 "$W/$name.log")"
  line=$(grep '^loader: ' "$W/$name.log")
}
threads() { sed -E -n 's/^loader: ([0-9]+) thread.*/\1/p' <<<"$line"; }
cap() { sed -E -n 's/.*at most ([0-9]+) here.*/\1/p' <<<"$line"; }

run unknown
n=$(threads); c=$(cap)
check '[ -n "$n" ] && [ -n "$c" ] && grep -q "is unknown" <<<"$line" && [ "$n" = $((c < 2 ? c : 2)) ]' \
  "unknown peak: expected min(2, cap) threads with the reason: $line"
check 'grep -qE "fills a micro-batch of 8 x 32 in [0-9.e+-]+ ms" <<<"$line"' "no measured fill time: $line"

run fast --device "NVIDIA H100 NVL"
n=$(threads); c=$(cap); want=$(sed -E -n 's/.*\) = ([0-9]+), at most.*/\1/p' <<<"$line")
check '[ -n "$want" ] && [ "$n" = $((want < c ? want : c)) ] && [ "$want" -ge 1 ]' "a fast GPU: $n thread(s), rule gives min($want, $c): $line"
check 'grep -q "NVIDIA H100 NVL takes one every" <<<"$line"' "the demand is not named: $line"

run slow --micro-ms 1000000
check '[ "$(threads)" = 1 ] && grep -q "(--micro-ms)" <<<"$line"' "a slow GPU (--micro-ms 1e6): expected 1 thread: $line"

run fixed --loader-threads 3
check '[ -z "$line" ]' "--loader-threads 3 still tuned: $line"
for r in fast slow fixed; do
  check 'cmp -s "$W/unknown/checkpoint.bin" "$W/$r/checkpoint.bin"' "the $r run's checkpoint differs from the unknown run's"
done

out=$(./trainer_cpu "${COMMON[@]}" --out "$W/bad" --loader-threads 0 2>&1); rc=$?
check '[ $rc = 1 ] && grep -q -- "--loader-threads 0: expected an integer in \[1, 256\]" <<<"$out"' "--loader-threads 0: exit $rc: $out"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
