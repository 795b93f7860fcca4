#!/usr/bin/env bash
# test_matmul_algos.sh: matmul algorithm tables (kernels.cuh, BlasTable; README, Matmuls) as users see them, on the
# CPU runtime, whose cuBLASLt offers split-K algorithms for a deep k, which add in another order (cpu/cublas.cpp):
#   1. a training run writes DIR/matmul_algos.txt: every matmul shape of its step, each with the heuristic's first
#      algorithm (split-K 1);
#   2. --matmul-algos with that table: "18 of the step's 18 shapes", and the checkpoint of the run without a table,
#      byte for byte;
#   3. a table with split-K 2 for the weight gradients over all rows (k = B x T = 512): another checkpoint (the
#      algorithms ran), the same one again (repeatable), and the run's own record names split-K 2 for those shapes;
#   4. tests/bench_matmul --tune TABLE --out TUNED: TUNED lists the same shapes, and the trainer runs with it;
#   5. --bench --out DIR writes DIR/matmul_algos.txt, whose shapes --bench with --matmul-algos then all takes (and
#      says so after its steps);
#   6. bad tables stop the run, each with a message naming the flag, the file and the line: a missing file, a line
#      in no known form, an unknown epilogue, a shape listed twice, another GPU, an algorithm cuBLASLt does not offer;
#   7. two ranks with different tables both stop, naming --matmul-algos;
#   8. a run whose table cannot be written (a file size limit) says so and trains on.
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_matmul_algos: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/matmul_algos_XXXXXX)
trap 'rm -rf "$W"' EXIT

python3 tools/prepare.py bytes --input cpu tests --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
RUN=(--data "$W/data/train_*.bin" --preset tiny --seq 32 --batch 16 --lr 5e-3 --warmup 1 --seed 7 --steps 2)
shapes() { grep -c '^matmul ' "$1" 2>/dev/null; }
body() { grep '^matmul ' "$1" | sed 's/ calls=.*//'; }  # the shapes and algorithms, without calls and times

# 1. the record of a run without a table
EMU_THREADS=2 ./trainer_cpu "${RUN[@]}" --out "$W/plain" >"$W/plain.log" 2>&1
rc=$?
T0=$W/plain/matmul_algos.txt
n=$(shapes "$T0")
echo "a tiny step's matmul shapes: ${n:-none}"
check '[ $rc = 0 ] && [ -f "$T0" ] && [ "$n" -ge 10 ] && grep -q "^device CPU runtime" "$T0" && grep -q "^cublaslt [0-9]" "$T0"' \
  "the run (exit $rc) wrote no DIR/matmul_algos.txt with a device, a cuBLASLt version and the step's shapes: $(tail -n 2 "$W/plain.log")"
check '[ "$(grep -c " splitk=1 reduction=0 " "$T0")" = "$n" ]' "not every shape recorded the heuristic's first (split-K 1)"

# 2. the same table back: the same algorithms, the same bytes
EMU_THREADS=2 ./trainer_cpu "${RUN[@]}" --out "$W/same" --matmul-algos "$T0" >"$W/same.log" 2>&1
check 'grep -q "^matmul algorithms: $n of the step.s $n shapes from $T0$" "$W/same.log" && cmp -s "$W/plain/checkpoint.bin" "$W/same/checkpoint.bin"' \
  "with its own record the run is not the run without a table: $(grep 'matmul algorithms' "$W/same.log")"

# 3. split-K 2 for the weight gradients over the 512 rows (ta=0 tb=1 k=512): other bits, repeatable
sed -E '/^matmul ta=0 tb=1 .* k=512 /s/splitk=1 reduction=0/splitk=2 reduction=2/' "$T0" >"$W/split.txt"
nsplit=$(grep -c 'splitk=2' "$W/split.txt")
check '[ "$nsplit" -ge 2 ]' "the tiny step has no weight gradient over 512 rows to split ($nsplit)"
for r in s1 s2; do EMU_THREADS=2 ./trainer_cpu "${RUN[@]}" --out "$W/$r" --matmul-algos "$W/split.txt" >"$W/$r.log" 2>&1; done
check '[ -f "$W/s1/checkpoint.bin" ] && ! cmp -s "$W/plain/checkpoint.bin" "$W/s1/checkpoint.bin"' \
  "split-K 2 for $nsplit shapes left the checkpoint as it was: the table's algorithms did not run ($(tail -n 1 "$W/s1.log"))"
check 'cmp -s "$W/s1/checkpoint.bin" "$W/s2/checkpoint.bin"' "the same table twice gave two checkpoints"
check '[ "$(body "$W/s1/matmul_algos.txt")" = "$(body "$W/split.txt")" ]' \
  "the run's record is not the table it ran: $(diff <(body "$W/s1/matmul_algos.txt") <(body "$W/split.txt") | head -n 4)"

# 4. bench_matmul --tune: a table of the same shapes, which the trainer takes
./build/bench_matmul --tune "$W/split.txt" --out "$W/tuned.txt" --iters 2 >"$W/tune.log" 2>&1
rc=$?
check '[ $rc = 0 ] && [ "$(shapes "$W/tuned.txt")" = "$n" ] && grep -q "^bench-matmul-result table=$W/split.txt matmuls=" "$W/tune.log"' \
  "bench_matmul --tune (exit $rc) wrote no table of the $n shapes: $(tail -n 2 "$W/tune.log")"
check '[ "$(body "$W/tuned.txt" | sed "s/ algo .*//")" = "$(body "$T0" | sed "s/ algo .*//")" ]' "the tuned table's shapes are not the run's"
check '! grep -q " ms=0.0000$" "$W/tuned.txt"' "a shape of the tuned table has no time"
EMU_THREADS=2 ./trainer_cpu "${RUN[@]}" --out "$W/tuned" --matmul-algos "$W/tuned.txt" >"$W/tuned.log" 2>&1
rc=$?
check '[ $rc = 0 ] && grep -q "^matmul algorithms: $n of the step.s $n shapes" "$W/tuned.log"' \
  "the trainer did not run the tuned table: $(grep 'matmul algorithms' "$W/tuned.log"; tail -n 1 "$W/tuned.log")"
./build/bench_matmul --tune "$W/none.txt" --out "$W/x.txt" >"$W/tune_bad.log" 2>&1
rc=$?
check '[ $rc = 2 ] && grep -q "^bench_matmul: --tune $W/none.txt: cannot open" "$W/tune_bad.log"' \
  "bench_matmul --tune of a missing file: $(tail -n 1 "$W/tune_bad.log")"

# 5. --bench --out DIR: the benchmark's shapes, which --bench then takes from the table
BENCH=(--bench --preset tiny --seq 32 --batch 16 --bench-steps 1 --bench-warmup 1)
EMU_THREADS=2 ./trainer_cpu "${BENCH[@]}" --out "$W/bench" >"$W/bench.log" 2>&1
nb=$(shapes "$W/bench/matmul_algos.txt")
check '[ "${nb:-0}" -ge 10 ] && grep -q "^bench: the matmuls. algorithms written to $W/bench/matmul_algos.txt" "$W/bench.log"' \
  "--bench --out wrote no table: $(tail -n 2 "$W/bench.log")"
EMU_THREADS=2 ./trainer_cpu "${BENCH[@]}" --matmul-algos "$W/bench/matmul_algos.txt" >"$W/bench2.log" 2>&1
rc=$?
check '[ $rc = 0 ] && grep -q "^matmul algorithms: $nb shapes from" "$W/bench2.log" && grep -q "^matmul algorithms: $nb of the step.s $nb shapes from" "$W/bench2.log"' \
  "--bench did not take the table, or did not say its step took all of it: $(grep "matmul algorithms" "$W/bench2.log"; tail -n 2 "$W/bench2.log")"

# 6. bad tables: each stops the run with a message naming the file and the line
sed '5s/ ms=/ extra=1 ms=/' "$T0" >"$W/form.txt"
sed -E '0,/epi=none/s/epi=none/epi=gelu/' "$T0" >"$W/epi.txt"
(cat "$T0"; grep '^matmul ' "$T0" | tail -n 1) >"$W/dup.txt"
sed 's/^device .*/device NVIDIA H100 80GB HBM3/' "$T0" >"$W/dev.txt"
sed -E '0,/^matmul ta=0 tb=1 .* k=512 /s/splitk=1 reduction=0/splitk=3 reduction=2/' "$T0" >"$W/offer.txt"
dup_line=$(grep -c '' "$W/dup.txt")
epi_line=$(grep -n 'epi=gelu' "$W/epi.txt" | cut -d: -f1)
offer_line=$(grep -n 'splitk=3' "$W/offer.txt" | cut -d: -f1)
while IFS='|' read -r file want; do
  EMU_THREADS=2 ./trainer_cpu "${RUN[@]}" --out "$W/bad" --overwrite --matmul-algos "$W/$file" >"$W/bad.log" 2>&1
  rc=$?
  check '[ $rc = 1 ] && grep -q -- "$want" "$W/bad.log"' "--matmul-algos $file: exit $rc, not \"$want\": $(tail -n 1 "$W/bad.log")"
done <<EOF
missing.txt|trainer: --matmul-algos $W/missing.txt: cannot open the matmul algorithm table
form.txt|trainer: --matmul-algos $W/form.txt line 5: expected "device NAME", "cublaslt VERSION" or "matmul ta=
epi.txt|trainer: --matmul-algos $W/epi.txt line $epi_line: a value out of range
dup.txt|trainer: --matmul-algos $W/dup.txt line $dup_line: the same matmul shape as line
dev.txt|trainer: --matmul-algos $W/dev.txt: recorded on NVIDIA H100 80GB HBM3 with cuBLASLt
offer.txt|matmul algorithm table $W/offer.txt line $offer_line: cuBLASLt offers no algorithm with that configuration
EOF

# 7. two ranks, different tables: both stop, naming the flag
for r in 0 1; do
  t=$T0; [ $r = 1 ] && t=$W/split.txt
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu "${RUN[@]}" --out "$W/ranks" --matmul-algos "$t" >"$W/rank$r.log" 2>&1 &
done
wait
check 'grep -q "the ranks disagree on --matmul-algos (the table.s shapes and algorithms)" "$W/rank0.log" && grep -q "the ranks disagree on --matmul-algos" "$W/rank1.log"' \
  "two ranks with different tables did not both stop naming --matmul-algos: $(tail -n 1 "$W/rank0.log" "$W/rank1.log")"

# 8. a record that cannot be written (files over 2 KB refused: EFBIG) is said, and training goes on past step 1 (the
#    checkpoint, larger, then stops the run); no half-written table or .tmp is left
(trap '' XFSZ; ulimit -f 2; exec env EMU_THREADS=2 ./trainer_cpu "${RUN[@]}" --out "$W/full") >"$W/full.log" 2>&1
check 'grep -q "^trainer: warning: $W/full/matmul_algos.txt was not written; training goes on$" "$W/full.log" && grep -q "^step *2/2 " "$W/full.log" && [ ! -e "$W/full/matmul_algos.txt" ] && [ ! -e "$W/full/matmul_algos.txt.tmp" ]' \
  "a table that could not be written: $(grep -E "matmul|^step|trainer" "$W/full.log" | head -n 4)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
