#!/usr/bin/env bash
# test_bad_input.sh: bad input is refused before step 1, with one line naming the flag, file or value and
# a non-zero exit: a table of trainer flags, --out and --init-from directories, environment hooks, and
# tools/prepare.py inputs; and a stop (SIGTERM, SIGUSR1) during start-up exits at once with 128 + the signal.
# Run by tests/run.sh; needs tools/requirements.txt. TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_bad_input: $*"; }
W=$(mktemp -d /tmp/mlm_bad_XXXXXX)
MOUNTS=()
cleanup() { for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$W"; }
trap cleanup EXIT
export EMU_THREADS=1
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS

mkdir -p "$W/in"
for i in $(seq 1 40); do echo "alpha beta gamma delta $i kernel tensor shard" >>"$W/in/a.txt"; done
python3 tools/prepare.py bytes --input "$W/in" --out "$W/data" --seq-len 32 --val-fraction 0 >/dev/null 2>&1
D="$W/data/train_*.bin"
T=(--data "$D" --preset tiny --seq 32 --batch 4 --steps 2)
touch "$W/file"
# --init-from directories: config.json variants beside a valid model.safetensors would never be read
hf() {  # hf NAME JSON: a directory with that config.json
  mkdir -p "$W/hf_$1"; echo "$2" >"$W/hf_$1/config.json"
}
hf huge_vocab '{"vocab_size": 1000000000000, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}'
hf big_sizes '{"vocab_size": 30522, "hidden_size": 1024, "num_hidden_layers": 2000, "num_attention_heads": 16, "intermediate_size": 4096}'
hf many_params '{"vocab_size": 30522, "hidden_size": 4096, "num_hidden_layers": 1024, "num_attention_heads": 32, "intermediate_size": 16384}'
hf negative '{"vocab_size": -5, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}'
hf fraction '{"vocab_size": 260.5, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}'
hf malformed '{"vocab_size": 260, "hidden_size": '
hf string_hidden '{"vocab_size": 260, "hidden_size": "32", "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}'
hf no_weights '{"vocab_size": 260, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 40}'
hf bad_weights '{"vocab_size": 260, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 40}'
printf '\377\377\377\377\377\377\377\377{}' >"$W/hf_bad_weights/model.safetensors"
OVERCOMMIT=$(cat /proc/sys/vm/overcommit_memory 2>/dev/null || echo 1)

# The table: PATTERN the output must contain | the command (eval'ed)
CASES=$(cat <<EOF
are required|$TRAINER --data "$D" --steps 5
unknown flag|$TRAINER ${T[*]} --out $W/o --bogus 1
--steps five: expected an integer|$TRAINER ${T[*]} --out $W/o --steps five
--steps 0: expected an integer|$TRAINER ${T[*]} --out $W/o --steps 0
--seq 1: expected an integer|$TRAINER ${T[*]} --out $W/o --seq 1
--batch -1: expected an integer|$TRAINER ${T[*]} --out $W/o --batch -1
--lr nan: expected a number|$TRAINER ${T[*]} --out $W/o --lr nan
--lr -1: expected a number|$TRAINER ${T[*]} --out $W/o --lr -1
--keep 0: expected an integer in \[1, 1000\]|$TRAINER ${T[*]} --out $W/o --keep 0
--max-bad-steps 0: expected an integer|$TRAINER ${T[*]} --out $W/o --max-bad-steps 0
--ckpt-minutes -1: expected a number|$TRAINER ${T[*]} --out $W/o --ckpt-minutes -1
--ckpt-every x: expected an integer|$TRAINER ${T[*]} --out $W/o --ckpt-every x
--ring 1: expected an integer|$TRAINER ${T[*]} --out $W/o --ring 1
--attention: unknown flag|$TRAINER ${T[*]} --out $W/o --attention wgmma
--mlp: unknown flag|$TRAINER ${T[*]} --out $W/o --mlp wgmma
--matmul-algos: unknown flag|$TRAINER ${T[*]} --out $W/o --matmul-algos x.txt
EMU_COMPUTE_CAPABILITY=7: expected 8.0 or 9.0|EMU_COMPUTE_CAPABILITY=7 $TRAINER ${T[*]} --out $W/o
EMU_DEVICE_BYTES=nan is out of range: expected an integer from 1 to|EMU_DEVICE_BYTES=nan $TRAINER --info
EMU_DEVICE_BYTES=1e30 is out of range: expected an integer from 1 to 1152921504606846976|EMU_DEVICE_BYTES=1e30 $TRAINER --info
EMU_DEVICE_BYTES=inf is out of range|EMU_DEVICE_BYTES=inf $TRAINER --info
EMU_DEVICE_BYTES=1.5e3x is not a non-negative number|EMU_DEVICE_BYTES=1.5e3x $TRAINER --info
EMU_STREAM_DELAY_US=nan is out of range: expected an integer from 0 to 60000000|EMU_STREAM_DELAY_US=nan $TRAINER ${T[*]} --out $W/x1
EMU_STREAM_DELAY_US=inf is out of range: expected an integer from 0 to 60000000|EMU_STREAM_DELAY_US=inf $TRAINER ${T[*]} --out $W/x2
EMU_STREAM_DELAY_US=1e30 is out of range: expected an integer from 0 to 60000000|EMU_STREAM_DELAY_US=1e30 $TRAINER ${T[*]} --out $W/x3
EMU_STREAM_DELAY_US=4294967296 is out of range: expected an integer from 0 to 60000000|EMU_STREAM_DELAY_US=4294967296 $TRAINER ${T[*]} --out $W/x4
EMU_THREADS=1025 is out of range: expected an integer from 1 to 1024|EMU_THREADS=1025 $TRAINER ${T[*]} --out $W/x5
EMU_THREADS=2.5 is out of range: expected an integer from 1 to 1024|EMU_THREADS=2.5 $TRAINER ${T[*]} --out $W/x6
EMU_STACK_KB=nan is out of range: expected an integer from 16 to|EMU_STACK_KB=nan $TRAINER ${T[*]} --out $W/x7
NCCL_EMU_TIMEOUT_S=nan is out of range: expected 0 (no timeout) to 1e9 seconds|(SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1 NCCL_EMU_TIMEOUT_S=nan timeout 60 $TRAINER ${T[*]} --out $W/x8 --nccl-timeout 20 >/dev/null 2>&1 &); SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=nan timeout 60 $TRAINER ${T[*]} --out $W/x8 --nccl-timeout 20
NCCL_EMU_TIMEOUT_S=-1 is out of range|(SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1 NCCL_EMU_TIMEOUT_S=-1 timeout 60 $TRAINER ${T[*]} --out $W/x9 --nccl-timeout 20 >/dev/null 2>&1 &); SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=-1 timeout 60 $TRAINER ${T[*]} --out $W/x9 --nccl-timeout 20
--global-batch 8589934592: 2147483648 micro-batches of B=4 on each of 1 GPU(s), more than --grad-accum's limit of 1048576|$TRAINER ${T[*]} --out $W/x10 --global-batch 8589934592
--global-batch 17179869184: 4294967296 micro-batches of B=4 .*--grad-accum's limit|$TRAINER ${T[*]} --out $W/x11 --global-batch 17179869184
--global-batch 1099511627776: 274877906944 micro-batches of B=4 .*a smaller --global-batch (at most 4194304)|$TRAINER ${T[*]} --out $W/x12 --global-batch 1099511627776
--global-batch 1099511627776: .*more than --grad-accum's limit|$TRAINER ${T[*]} --out $W/x13 --global-batch 1099511627776 --plan-only
--steps ' 3': expected an integer in \[1, 1073741824\]|$TRAINER ${T[*]} --out $W/o --steps ' 3'
--lr ' 0.001': expected a number in \[0, 1\]|$TRAINER ${T[*]} --out $W/o --lr ' 0.001'
--tokens ' 5M': expected a count of tokens|$TRAINER ${T[*]} --out $W/o --tokens ' 5M'
--batch 1048576: 1048576 rows of 128 tokens = 134217728 tokens a micro-batch, more than 2^26|$TRAINER --preset mini --seq 128 --batch 1048576 --plan-only
--steps: 1073741824 steps of 8589934592 tokens .* more than 2^62 .*a smaller --grad-accum or --batch|timeout 60 $TRAINER --data "$D" --preset tiny --seq 32 --batch 256 --grad-accum 1048576 --steps 1073741824 --out $W/x14
SLURM_NNODES=2x: expected an integer in \[1, 65536\]|SLURM_NNODES=2x $TRAINER ${T[*]} --out $W/x15
MLM_TEST_INF_GRAD=2:: expected FIRST\[:COUNT\]|MLM_TEST_INF_GRAD=2: $TRAINER ${T[*]} --out $W/x16
MLM_TEST_CKPT_DELAY_MS=abc: expected an integer in \[0, 60000\]|MLM_TEST_CKPT_DELAY_MS=abc $TRAINER ${T[*]} --out $W/x17
MLM_TEST_SLOW_WRITE_S=nan: expected a number in \[0, 3600\]|MLM_TEST_SLOW_WRITE_S=nan $TRAINER ${T[*]} --out $W/x18
MLM_TEST_WEIGHTS_CRC=yes: expected an integer in \[0, 1\]|MLM_TEST_WEIGHTS_CRC=yes $TRAINER ${T[*]} --out $W/x19
environment variable SLURM_PROCID= 0 is not a non-negative integer|SLURM_NTASKS=1 SLURM_PROCID=' 0' $TRAINER ${T[*]} --out $W/x20
--comm: not with --eval, which ignores it|$TRAINER --eval $W/none.bin --val "$D" --comm bf16
--lr: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --lr 1e-3
--warmup: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --warmup 3
--wd: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --wd 0
--steps: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --steps 3
--run-steps: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --run-steps 3
--overwrite: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --overwrite
--grad-accum: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --grad-accum 2
--global-batch: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --global-batch 8
--max-global-batch: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --max-global-batch 8
--ckpt-every: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --ckpt-every 8
--ckpt-minutes: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --ckpt-minutes 8
--preset: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --preset tiny
--seed: not with --eval|$TRAINER --eval $W/none.bin --val "$D" --seed 3
--resume: not with --plan-only, which ignores it|$TRAINER ${T[*]} --out $W/o --plan-only --resume
--max-global-batch: only with --grad-accum auto|$TRAINER ${T[*]} --out $W/o --plan-only --max-global-batch 64
--max-global-batch: only with --grad-accum auto|$TRAINER ${T[*]} --out $W/x21 --grad-accum 2 --max-global-batch 64
--grad-accum auto: one micro-batch of --batch 4 on 1 GPU(s) is 4 sequences, above --max-global-batch 2: a --batch of at most 2|$TRAINER ${T[*]} --out $W/x22 --device H200 --grad-accum auto --max-global-batch 2
--steps: not with --bench, which ignores it|$TRAINER --bench --preset tiny --seq 32 --batch 2 --bench-warmup 0 --bench-steps 1 --steps 3
--data: not with --bench|$TRAINER --bench --preset tiny --seq 32 --batch 2 --bench-warmup 0 --bench-steps 1 --data "$D"
--plan-only: not with --bench|$TRAINER --bench --preset tiny --seq 32 --batch 2 --bench-warmup 0 --bench-steps 1 --plan-only
--bench-steps: only with --bench|$TRAINER ${T[*]} --out $W/x22 --bench-steps 3
missing its value|$TRAINER ${T[*]} --out
MLM_TEST_INF_GRAD=abc: expected FIRST\[:COUNT\]|MLM_TEST_INF_GRAD=abc $TRAINER ${T[*]} --out $W/o
MLM_TEST_INF_LOSS=0: expected FIRST\[:COUNT\]|MLM_TEST_INF_LOSS=0 $TRAINER ${T[*]} --out $W/o
--out $W/file: exists and is not a directory|$TRAINER ${T[*]} --out $W/file
--out $W/file/sub: cannot create the directory $W/file|$TRAINER ${T[*]} --out $W/file/sub
--data: .*no-such|$TRAINER --data "$W/no-such/*.bin" --preset tiny --seq 32 --out $W/o --steps 2
--data: .*$W/file|$TRAINER --data "$W/file" --preset tiny --seq 32 --out $W/o --steps 2
--preset huge: unknown; one of: tiny|$TRAINER --data "$D" --preset huge --out $W/o --steps 2
--seq 64 is longer than the model's 40 positions|$TRAINER --data "$D" --preset tiny --seq 64 --out $W/o --steps 2
needs .* GiB at B=1048576 .*--batch|EMU_DEVICE_BYTES=1e10 $TRAINER --data "$D" --preset tiny --seq 32 --batch 1048576 --out $W/o --steps 2
--resume: no intact checkpoint in $W/o (checkpoint.bin: cannot open|$TRAINER ${T[*]} --out $W/o --resume
vocab_size 1e+12: expected an integer in \[0, 2^30\]|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_huge_vocab
sizes beyond the limits|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_big_sizes
more than 2e10 parameters|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_many_params
vocab_size -5: expected an integer|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_negative
vocab_size 260.5: expected an integer|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_fraction
hf_malformed/config.json: malformed JSON|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_malformed
hf_string_hidden/config.json: hidden_size "32": expected a number, not a string|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_string_hidden
cannot open $W/hf_no_weights/model.safetensors|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_no_weights
hf_bad_weights/model.safetensors: not a safetensors file|$TRAINER ${T[*]} --out $W/o --init-from $W/hf_bad_weights
cannot open $W/no-hf/config.json|$TRAINER ${T[*]} --out $W/o --init-from $W/no-hf
--input $W/nothing: no such file or directory|python3 tools/prepare.py bytes --input $W/nothing --out $W/p1
--out $W/file: exists and is not a directory|python3 tools/prepare.py bytes --input $W/in --out $W/file
--out $W/file/x: cannot create or write|python3 tools/prepare.py bytes --input $W/in --out $W/file/x
--seq-len 2 (expected at least 3|python3 tools/prepare.py bytes --input $W/in --out $W/p2 --seq-len 2
--seq-len 1099511627776 (expected at most 16777216 = 2^24|python3 tools/prepare.py bytes --input $W/in --out $W/p2 --seq-len 1099511627776
--input /dev/zero: not a regular file or a directory|python3 tools/prepare.py bytes --input /dev/zero --out $W/p9
--val-fraction 1.0 (expected|python3 tools/prepare.py bytes --input $W/in --out $W/p3 --val-fraction 1
--shard-tokens 0 (expected at least 1)|python3 tools/prepare.py bytes --input $W/in --out $W/p4 --shard-tokens 0
--train-vocab 0 (expected more than the 5 special tokens|python3 tools/prepare.py text --input $W/in --out $W/p5 --train-vocab 0
--tokenizer $W/none.txt: no such file|python3 tools/prepare.py text --input $W/in --out $W/p6 --tokenizer $W/none.txt
--tokenizer $W/data/train_00000.bin: not a tokenizer.json or a UTF-8 BERT vocab.txt|python3 tools/prepare.py text --input $W/in --out $W/p7 --tokenizer $W/data/train_00000.bin
$W/in/bin.txt: not UTF-8 text|python3 tools/prepare.py text --input $W/in --out $W/p8 --train-vocab 100 --strict
$W/none.bin: no such file|python3 tools/prepare.py check $W/none.bin
$W/\*.zzz: no such file (or no file matches|python3 tools/prepare.py check "$W/*.zzz"
BAD  $W/file: truncated|python3 tools/prepare.py check $W/file
EOF
)
# bin.txt is added only now (the shards above were made without it)
printf 'text \377\376 then \200 not UTF-8\n' >"$W/in/bin.txt"
while IFS='|' read -r pat cmd; do
  [ -n "$pat" ] || continue
  start=$(date +%s%N)
  out=$(eval "$cmd" 2>&1); rc=$?
  [ -n "${TEST_VERBOSE:-}" ] && echo "  $(( ($(date +%s%N) - start) / 1000000 )) ms: $cmd"
  if [ $rc -ne 0 ] && echo "$out" | grep -q -- "$pat" && ! echo "$out" | grep -q "Traceback"; then ok; else
    bad "'$cmd' gave exit $rc and: $(echo "$out" | tail -n 2)"
  fi
done <<<"$CASES"

# no arguments: the usage and exit 1; --help: the usage and exit 0; --info: the device and exit 0
out=$("$TRAINER" 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q "^usage: trainer"; then ok; else bad "no arguments: exit $rc"; fi
out=$("$TRAINER" --help 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q -- "--max-bad-steps N" && echo "$out" | grep -q "^exit codes:"; then ok; else bad "--help: exit $rc"; fi
out=$("$TRAINER" --info 2>&1); rc=$?
if [ $rc = 0 ] && echo "$out" | grep -q "^rank 0 of 1 (local 0): "; then ok; else bad "--info: exit $rc, $out"; fi

# --out: the parents are created; a read-only directory is refused before anything is done
"$TRAINER" "${T[@]}" --out "$W/new/parents/run" --plan-only >/dev/null 2>&1
if [ -d "$W/new/parents/run" ]; then ok; else bad "--out with missing parents was not created"; fi
if [ "$(id -u)" = 0 ]; then  # root writes anywhere, except on a read-only mount
  mkdir -p "$W/ro" && mount -t tmpfs -o ro,size=64k tmpfs "$W/ro" 2>/dev/null && MOUNTS+=("$W/ro")
else
  mkdir -p "$W/ro" && chmod 555 "$W/ro"
fi
out=$("$TRAINER" "${T[@]}" --out "$W/ro" 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q -- "--out $W/ro: cannot write there" && ! echo "$out" | grep -q "^step"; then ok; else
  bad "a read-only --out: exit $rc, $(echo "$out" | tail -n 1)"
fi
# a plan that the device cannot allocate names --batch (on the CPU build a huge allocation fails at once;
# with overcommit_memory=1 it would succeed, so that case is skipped there)
if [ "$OVERCOMMIT" != 1 ]; then
  out=$(EMU_DEVICE_BYTES=1e16 "$TRAINER" --data "$D" --preset bert-base --seq 512 --batch 131072 --out "$W/o" --steps 2 2>&1); rc=$?
  if [ $rc = 1 ] && echo "$out" | grep -q "cannot allocate the .* GiB of device memory planned for B=131072: use a smaller --batch"; then ok; else
    bad "an allocation that fails: exit $rc, $(echo "$out" | tail -n 1)"
  fi
else
  echo "  (allocation failure: skipped, vm.overcommit_memory=1 lets any allocation succeed)"
fi

# a stop during start-up (here: rank 0 of 2 waits for its peer at the NCCL rendezvous) exits at once, for each
# signal that stops a run
for sig in TERM USR1 INT HUP; do  # Ctrl-C and a closed terminal too
  SLURM_NTASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 "$TRAINER" "${T[@]}" --out "$W/sig$sig" \
    --bootstrap file >"$W/sig$sig.log" 2>&1 &
  pid=$!
  for i in $(seq 1 600); do [ -e "$W/sig$sig/nccl_id.local.0.0" ] && break; sleep 0.05; done  # rank 0 waits for rank 1
  sleep 0.2
  kill -$sig $pid
  wait $pid; rc=$?
  want=$((128 + $(kill -l $sig)))
  if [ $rc = $want ] && grep -q "SIG$sig before step 1: stopping; no checkpoint or export was written (exit code $want)" "$W/sig$sig.log" &&
    [ ! -e "$W/sig$sig/checkpoint.bin" ]; then ok; else
    bad "SIG$sig during start-up: exit $rc (expected $want): $(tail -n 1 "$W/sig$sig.log")"
  fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
