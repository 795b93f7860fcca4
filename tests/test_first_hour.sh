#!/usr/bin/env bash
# test_first_hour.sh: what a new user sees in a first run, on the CPU build (./trainer_cpu), tiny model:
#   - progress: each step's line gives the epoch fraction, elapsed time and ETA; the start gives the global
#     batch and the steps per epoch; --tokens and --epochs become steps; --help lists the presets' shapes;
#   - DIR/metrics.jsonl (created with --out's parents): a "train" record per logged step, a "val" record per
#     validation, with every field of README's format; a resume leaves no step twice and continues the
#     token count and the elapsed time;
#   - validation: the same masked samples whatever the number of ranks (1 and 2 give the same bits), loss
#     and accuracy; --eval on a checkpoint gives the run's last validation exactly, on an export nearly;
#     by default every validation sequence exactly once (the last micro-batch partial, never wrapped), the
#     same sequences and masked tokens whatever --batch, and said; --val-batches beyond the split is said;
#   - the export: config.json with the shards' pad id and no dropout, and the tokenizer (byte shards:
#     byte_tokenizer.json, and a byte-level tokenizer.json; both kinds: tokenizer.json + what AutoTokenizer
#     needs, model_max_length the trained --seq, [CLS] text [SEP] added as in the shards);
#   - bad input: one clear line; ./trainer (the GPU build) on this machine without a GPU says so in one line.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py, tokenizers).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_first_hour: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_first_hour_XXXXXX)
trap 'rm -rf "$W"' EXIT
export EMU_THREADS=2
json() { python3 -c "$@"; }  # json 'python code' ARGS...: a check written in Python, exit 0 when it holds

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0.3 >"$W/prep.log" 2>&1
check '[ -f "$W/data/train_00000.bin" ] && [ -f "$W/data/val_00000.bin" ]' "tools/prepare.py made no shards: $(tail -n 3 "$W/prep.log")"
COMMON=(--data "$W/data/train_*.bin" --val "$W/data/val_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2
  --seed 7 --val-every 6 --val-batches 3)

# 1. progress in the log, metrics.jsonl, the export (with --out's parents created)
A="$W/runs/a/nested"
./trainer_cpu "${COMMON[@]}" --out "$A" --steps 12 >"$W/a.log" 2>&1
check '[ -f "$A/metrics.jsonl" ] && [ -f "$A/model.safetensors" ]' "the run failed: $(tail -n 3 "$W/a.log")"
check 'grep -qE "^global batch: 8 sequences of 32 tokens \(1 process\(es\) x 1 micro-batch\(es\) x B=8\) = 256 tokens per step; an epoch \([0-9]+ tokens in the training shards\) is [0-9.]+ steps$" "$W/a.log"' \
  "no global batch / steps per epoch line: $(grep -m1 "global batch" "$W/a.log")"
check 'grep -qE "^step +12/12 \| loss [0-9.]+ \| .* \| epoch [0-9]\.[0-9]{3} \| elapsed [0-9]+s \| ETA 0s$" "$W/a.log"' \
  "the last step's line has no epoch / elapsed / ETA: $(grep -E "^step +12/" "$W/a.log")"
check 'grep -qE "^step +6 \| val loss [0-9.]+ \| accuracy 0\.[0-9]{4} \| [0-9]+ masked tokens in [0-9]+ sequences \(3 micro-batches of B=8: a sample spread over it, [0-9]+ of the split.s [0-9]+ sequences\)$" "$W/a.log"' \
  "no validation line with loss and accuracy: $(grep "val loss" "$W/a.log" | head -n 1)"
epoch_tokens=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["splits"][0]["tokens"])' "$W/data/meta.json")
json '
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
train = [r for r in recs if r["kind"] == "train"]; val = [r for r in recs if r["kind"] == "val"]
keys = ["kind", "step", "tokens", "epoch", "elapsed_s", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait_ms",
        "comm_bytes"]
assert [r["step"] for r in train] == list(range(1, 13)), [r["step"] for r in train]
assert all(sorted(r) == sorted(keys) for r in train), train[0]
assert all(r["mfu"] is None for r in train)  # the CPU: no known peak
assert all(0 < a["tokens"] < b["tokens"] <= 256 * b["step"] for a, b in zip(train, train[1:]))
assert all(abs(r["epoch"] - r["tokens"] / int(sys.argv[2])) < 1e-6 for r in train)
assert all(a["elapsed_s"] <= b["elapsed_s"] for a, b in zip(train, train[1:])) and train[0]["elapsed_s"] > 0
assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["tokens_per_s"] > 0 and r["data_wait_ms"] >= 0
           for r in train)
assert all(r["lr"] > 0 for r in train[:-1]) and train[-1]["lr"] == 0, [r["lr"] for r in train]  # decays to 0
assert train[-1]["loss"] < train[0]["loss"] - 0.5, (train[0]["loss"], train[-1]["loss"])
assert [r["step"] for r in val] == [6, 12], val
vkeys = ["kind", "step", "tokens", "elapsed_s", "val_loss", "val_accuracy", "val_masked", "val_sequences", "val_split"]
assert all(sorted(r) == sorted(vkeys) for r in val), val[0]
assert all(0 <= r["val_accuracy"] <= 1 and r["val_masked"] > 0 and r["val_loss"] > 0 for r in val), val
assert val[1]["tokens"] == train[-1]["tokens"] and val[1]["val_loss"] < val[0]["val_loss"], val
' "$A/metrics.jsonl" "$epoch_tokens" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "metrics.jsonl of the run: $(tail -n 2 "$W/err.txt")"
json '
import json, sys
c = json.load(open(sys.argv[1] + "/config.json")); m = json.load(open(sys.argv[2]))["special_ids"]
t = json.load(open(sys.argv[1] + "/byte_tokenizer.json"))
assert c["pad_token_id"] == m["pad"] == 256 and c["hidden_dropout_prob"] == 0 and c["attention_probs_dropout_prob"] == 0, c
assert t["type"] == "bytes" and t["vocab_size"] == 260 and "byte b" in t["bytes"], t
assert t["special_tokens"] == {"[PAD]": m["pad"], "[CLS]": m["cls"], "[SEP]": m["sep"], "[MASK]": m["mask"]}, t
from tokenizers import Tokenizer
h = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
assert h.encode("A\u00e9[MASK]").ids == [m["cls"], 65, 0xC3, 0xA9, m["mask"], m["sep"]], h.encode("A\u00e9[MASK]").ids
tc = json.load(open(sys.argv[1] + "/tokenizer_config.json"))
assert tc["tokenizer_class"] == "PreTrainedTokenizerFast" and tc["model_max_length"] == 32 and tc["mask_token"] == "[MASK]", tc
' "$A" "$W/data/meta.json" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "the byte export's config.json / byte_tokenizer.json / tokenizer.json: $(tail -n 2 "$W/err.txt")"
check '! ls "$A"/*.tmp >/dev/null 2>&1' "temporary files left in the export: $(ls "$A")"

# 2. resume: 6 steps, a record beyond the checkpoint and a partial line (a crash after the checkpoint), then
#    --resume: every step once, the same records as the uninterrupted run, token count and time continued
B="$W/b"
./trainer_cpu "${COMMON[@]}" --out "$B" --steps 12 --run-steps 6 >"$W/b1.log" 2>&1
printf '{"kind":"train","step":7,"tokens":1,"loss":9}\n{"kind":"val","step":' >>"$B/metrics.jsonl"
./trainer_cpu "${COMMON[@]}" --out "$B" --steps 12 --resume >"$W/b2.log" 2>&1
json '
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
key = lambda r: (r["kind"], r["step"], r["tokens"], r.get("loss"), r.get("val_loss"), r.get("val_accuracy"))
assert [key(r) for r in a] == [key(r) for r in b], ([key(r) for r in a], [key(r) for r in b])
t = [r for r in b if r["kind"] == "train"]
assert t[6]["elapsed_s"] >= t[5]["elapsed_s"], (t[5], t[6])
' "$A/metrics.jsonl" "$B/metrics.jsonl" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "resumed metrics.jsonl differs from the uninterrupted run's: $(tail -n 2 "$W/err.txt") $(tail -n 2 "$W/b2.log")"

# 3. --tokens and --epochs become steps of the global batch (256 tokens here)
./trainer_cpu "${COMMON[@]}" --out "$W/t" --tokens 1K >"$W/t.log" 2>&1
check 'grep -q "^--tokens 1000: 4 steps$" "$W/t.log" && grep -qE "^step +4/4 " "$W/t.log"' \
  "--tokens 1K is not 4 steps of 256 tokens: $(grep -E "tokens|^step" "$W/t.log" | tail -n 3)"
./trainer_cpu "${COMMON[@]}" --out "$W/t" --steps 2 --val-every 0 --overwrite >"$W/t2.log" 2>&1  # a new run there: a new log
check '[ "$(python3 -c "import json,sys; print([json.loads(l)[\"step\"] for l in open(sys.argv[1])])" "$W/t/metrics.jsonl")" = "[1, 2]" ]' \
  "a new run in a used --out did not start metrics.jsonl anew: $(cut -c 1-40 "$W/t/metrics.jsonl" | tr '\n' ' ')"
want=$(python3 -c 'import math,sys; print(math.ceil(0.25 * int(sys.argv[1]) / 256))' "$epoch_tokens")
./trainer_cpu "${COMMON[@]}" --out "$W/e" --epochs 0.25 --run-steps 1 >"$W/e.log" 2>&1
check 'grep -q "^--epochs 0.25: $want steps$" "$W/e.log" && grep -qE "^step +1/$want " "$W/e.log"' \
  "--epochs 0.25 is not $want steps: $(grep -E "epochs|^step" "$W/e.log" | tail -n 3)"

# 4. --eval: on the checkpoint, exactly the run's last validation; on the export, nearly (its fp32 weights
#    rounded to bf16 to nearest, where training's bf16 weights were rounded stochastically); with 2 ranks,
#    the same bits as with 1 (3 micro-batches: rank 0 takes two, rank 1 one)
EV=(--val "$W/data/val_*.bin" --batch 8 --val-batches 3)
./trainer_cpu --eval "$A/checkpoint.bin" "${EV[@]}" --out "$A" >"$W/ev1.log" 2>&1
./trainer_cpu --eval "$A" "${EV[@]}" --seq 32 >"$W/ev2.log" 2>&1
mkdir -p "$W/ev"
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu --eval "$A/checkpoint.bin" "${EV[@]}" --out "$W/ev" >"$W/ev3_$r.log" 2>&1 &
done
wait
line1=$(grep "^eval:" "$W/ev1.log"); line2=$(grep "^eval:" "$W/ev2.log"); line3=$(grep "^eval:" "$W/ev3_0.log")
check 'echo "$line1" | grep -qE "^eval: loss [0-9.]+ \| accuracy 0\.[0-9]{4} \| [0-9]+ masked tokens in [0-9]+ sequences \(3 micro-batches of B=8: a sample spread over it, [0-9]+ of the split.s [0-9]+ sequences\)$"' \
  "--eval of a checkpoint: $line1 $(tail -n 2 "$W/ev1.log")"
check '[ -n "$line3" ] && [ "$line3" = "$line1" ] && ! grep -q "^eval:" "$W/ev3_1.log"' \
  "--eval with 2 ranks: '$line3', with 1: '$line1' $(tail -n 2 "$W/ev3_0.log" "$W/ev3_1.log")"
json '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
val = [r for r in recs if r["kind"] == "val"][-1]; ev = recs[-1]
assert ev["kind"] == "eval" and ev["step"] == 12 and ev["source"] == sys.argv[1].rsplit("/", 1)[0] + "/checkpoint.bin", ev
assert (ev["val_loss"], ev["val_accuracy"], ev["val_masked"]) == (val["val_loss"], val["val_accuracy"], val["val_masked"]), (ev, val)
line = sys.argv[2].split()
loss, acc, masked = float(line[2]), float(line[5]), int(line[7])
assert abs(loss - val["val_loss"]) < 2e-2 * val["val_loss"] and abs(acc - val["val_accuracy"]) < 0.05 and masked == val["val_masked"], (line, val)
' "$A/metrics.jsonl" "$line2" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "--eval against the last validation (checkpoint exactly, export nearly): $(tail -n 2 "$W/err.txt")"
# 4b. validation inside a 2-rank run: one metrics.jsonl (rank 0's), and its validation is what 1 rank's --eval
#     of the run's checkpoint gives, bit for bit
mkdir -p "$W/d"
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu "${COMMON[@]}" --out "$W/d" --steps 6 >"$W/d$r.log" 2>&1 &
done
wait
./trainer_cpu --eval "$W/d/checkpoint.bin" "${EV[@]}" --out "$W/d" >"$W/d_ev.log" 2>&1
json '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6], recs
val = [r for r in recs if r["kind"] == "val"]; ev = recs[-1]
assert len(val) == 1 and ev["kind"] == "eval" and ev["step"] == 6, recs
assert (ev["val_loss"], ev["val_accuracy"], ev["val_masked"]) == (val[0]["val_loss"], val[0]["val_accuracy"], val[0]["val_masked"]), (ev, val)
' "$W/d/metrics.jsonl" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "2-rank validation against 1-rank --eval of its checkpoint: $(tail -n 2 "$W/err.txt") $(tail -n 2 "$W/d0.log" "$W/d1.log")"
echo "  (last validation: $(grep "val loss" "$W/a.log" | tail -n 1 | sed "s/.*| val //"); --eval of the export: ${line2#eval: })"

# 4c. the default: every validation sequence exactly once (val_samples of them; B=8 leaves the last micro-batch
#     partial), in the run and in --eval of its export at another --batch (the same sequences and masked
#     tokens, nearly the same loss), and with 2 ranks the same bits as with 1; --val-batches beyond the split
#     is said and cut to it
val_samples=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["splits"][1]["samples"])' "$W/data/meta.json")
FULL=(--data "$W/data/train_*.bin" --val "$W/data/val_*.bin" --preset tiny --seq 32 --batch 8 --lr 5e-3 --warmup 2 --seed 7)
./trainer_cpu "${FULL[@]}" --val-every 2 --steps 2 --out "$W/v" >"$W/v.log" 2>&1
nb=$(grep -o "^data: $W/data/val_\*.bin: .*epoch 0: [0-9]* rows" "$W/v.log" | grep -o "[0-9]* rows$" | cut -d" " -f1)
nb=$(( (${nb:-0} + 7) / 8 ))  # micro-batches of 8 rows that cover the split's rows (packed samples)
check 'grep -qE "^step +2 \| val loss [0-9.]+ \| accuracy 0\.[0-9]{4} \| [0-9]+ masked tokens in $val_samples sequences \($nb micro-batches of B=8: every validation sequence once\)$" "$W/v.log"' \
  "the run's validation is not every one of the $val_samples sequences once: $(grep "val loss" "$W/v.log") $(tail -n 2 "$W/v.log")"
./trainer_cpu --eval "$W/v" --val "$W/data/val_*.bin" --batch 5 --out "$W/v" >"$W/v_ev.log" 2>&1
check 'grep -qE "^eval: .* in $val_samples sequences \([0-9]+ micro-batches of B=5: every validation sequence once\)$" "$W/v_ev.log"' \
  "--eval of the export at --batch 5 is not every sequence once: $(tail -n 2 "$W/v_ev.log")"
mkdir -p "$W/v2"
for r in 0 1; do
  SLURM_NTASKS=2 SLURM_PROCID=$r SLURM_LOCALID=0 NCCL_EMU_TIMEOUT_S=60 \
    ./trainer_cpu --eval "$W/v/checkpoint.bin" --val "$W/data/val_*.bin" --batch 8 --out "$W/v2" >"$W/v2_$r.log" 2>&1 &
done
wait
json '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]; n = int(sys.argv[3])
val = [r for r in recs if r["kind"] == "val"][-1]; ev = recs[-1]
ev2 = [json.loads(l) for l in open(sys.argv[2])][-1]
assert val["val_sequences"] == val["val_split"] == n and ev["val_sequences"] == ev["val_split"] == n, (val, ev, n)
assert ev["kind"] == "eval" and ev["val_masked"] == val["val_masked"], (ev, val)
assert abs(ev["val_loss"] - val["val_loss"]) < 2e-2 * val["val_loss"], (ev, val)
k = lambda r: (r["val_loss"], r["val_accuracy"], r["val_masked"], r["val_sequences"])
assert ev2["kind"] == "eval" and k(ev2) == k(val), (ev2, val)
' "$W/v/metrics.jsonl" "$W/v2/metrics.jsonl" "$val_samples" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "the whole-split validation, --eval of the export, 2-rank --eval: $(tail -n 2 "$W/err.txt") $(tail -n 1 "$W/v2_0.log")"
./trainer_cpu --eval "$W/v/checkpoint.bin" --val "$W/data/val_*.bin" --batch 8 --val-batches 100000 >"$W/v3.log" 2>&1
check 'grep -q "^note: --val-batches 100000: the validation split holds $nb micro-batches of B=8 rows ($val_samples sequences); validating those, each sequence once$" "$W/v3.log" && grep -q "in $val_samples sequences ($nb micro-batches" "$W/v3.log"' \
  "--val-batches beyond the split: $(tail -n 2 "$W/v3.log")"

# 5. text shards: the export carries their tokenizer, loadable as it is
python3 tools/prepare.py text --input README.md tools --train-vocab 400 --out "$W/text" --seq-len 32 --val-fraction 0.2 \
  >"$W/tprep.log" 2>&1
./trainer_cpu --data "$W/text/train_*.bin" --preset tiny --seq 32 --batch 4 --steps 2 --out "$W/tx" >"$W/tx.log" 2>&1
json '
import json, sys
d, m = sys.argv[1], json.load(open(sys.argv[2] + "/meta.json"))["special_ids"]
assert open(d + "/tokenizer.json", "rb").read() == open(sys.argv[2] + "/tokenizer.json", "rb").read()
c = json.load(open(d + "/config.json")); tc = json.load(open(d + "/tokenizer_config.json"))
sm = json.load(open(d + "/special_tokens_map.json"))
names = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
assert c["pad_token_id"] == m["pad"] and c["vocab_size"] == json.load(open(sys.argv[2] + "/meta.json"))["vocab_size"], c
assert tc["tokenizer_class"] == "PreTrainedTokenizerFast" and tc["model_max_length"] == 32, tc  # the trained --seq
assert all(tc[k] == v and sm[k] == v for k, v in names.items()), (tc, sm)
from tokenizers import Tokenizer
t = Tokenizer.from_file(d + "/tokenizer.json")
for k in ("pad", "unk", "cls", "sep", "mask"):
    assert t.token_to_id(names[k + "_token"]) == m[k], (k, t.token_to_id(names[k + "_token"]), m[k])
e = t.encode("the [MASK]").ids  # [CLS] ... [SEP], as the shards samples are (what AutoTokenizer gives a pipeline)
assert e[0] == m["cls"] and e[-1] == m["sep"] and m["mask"] in e, e
' "$W/tx" "$W/text" 2>"$W/err.txt"
rc=$?  # (before the message: its $(...) would reset $?)
check '[ $rc = 0 ]' "the text export's tokenizer files: $(tail -n 2 "$W/err.txt") $(tail -n 2 "$W/tx.log")"

# 6. --help shows every preset's shape and positions
help=$(./trainer_cpu --help)
check 'echo "$help" | grep -qE "^ +mini +2 x +128,  2 heads of 64, FFN  512, 512 positions" && echo "$help" | grep -q -- "--tokens N" && echo "$help" | grep -q -- "--eval SRC"' \
  "--help lacks the presets' shapes, --tokens or --eval: $(echo "$help" | grep -A2 -- --preset)"

# 7. bad input: one clear line naming the problem, exit 1
expect_error() {  # expect_error PATTERN ARGS... : the run fails with exit 1 (RC) and a single line saying PATTERN
  local pat=$1; shift
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq "${RC:-1}" ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q -- "$pat"; then ok; else bad "'$*' gave exit $rc and: $(echo "$out" | tail -n 3)"; fi
}
expect_error "alternatives: give one of them" ./trainer_cpu "${COMMON[@]}" --out "$W/x" --steps 5 --tokens 1M
expect_error "alternatives: give one of them" ./trainer_cpu "${COMMON[@]}" --out "$W/x" --epochs 1 --tokens 1M
expect_error "--tokens 5X: expected a count of tokens" ./trainer_cpu "${COMMON[@]}" --out "$W/x" --tokens 5X
expect_error "--eval $W/none.bin: No such file or directory (expected a checkpoint file" \
  ./trainer_cpu --eval "$W/none.bin" --val "$W/data/val_*.bin"
expect_error "needs --val GLOB" ./trainer_cpu --eval "$A/checkpoint.bin"
head -c 3000 "$A/checkpoint.bin" >"$W/cut.bin"
expect_error "--eval $W/cut.bin: truncated" ./trainer_cpu --eval "$W/cut.bin" --val "$W/data/val_*.bin"
RC=2 expect_error "compare_hf.py: $A has no batch_and_logits.bin: this tool compares the export that MLM_EXPORT_DIR=" \
  python3 tools/compare_hf.py "$A"  # a run's export: not what compare_hf.py compares (no traceback)
if [ -x ./trainer ] && ! nvidia-smi >/dev/null 2>&1; then  # the GPU build, on a machine without a GPU
  expect_error "no usable GPU here (.*); ./trainer_cpu is the same trainer on the CPU" ./trainer --data x --out "$W/x" --steps 1
  if [ ! -e /proc/driver/nvidia/version ]; then  # no driver at all: said so, not "driver version is insufficient"
    expect_error "no usable GPU here (no NVIDIA driver is loaded: no /proc/driver/nvidia/version)" ./trainer --data x --out "$W/x" --steps 1
  fi
else
  echo "  (./trainer without a GPU: not checked here: $( [ -x ./trainer ] && echo "this machine has a GPU" || echo "no ./trainer built"))"
fi

# 8. ./build.sh with no argument builds what this machine can run: with a GPU (a stand-in nvidia-smi -L lists
#    one) the trainers of both kinds, without one only ./trainer_cpu; never the tests (./build.sh all does)
mkdir -p "$W/gpu" "$W/nogpu"
printf '#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n' >"$W/gpu/nvidia-smi"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." >&2; exit 9\n' >"$W/nogpu/nvidia-smi"
chmod +x "$W/gpu/nvidia-smi" "$W/nogpu/nvidia-smi"
out=$(PATH="$W/gpu:$PATH" NVCC=/nonexistent/nvcc ./build.sh 2>&1); rc=$?
check '[ $rc -eq 0 ] && echo "$out" | grep -q "^build: a GPU is here (nvidia-smi -L): ./trainer_cpu and ./trainer, no tests" && echo "$out" | grep -q "^build: CPU runtime, trainer_cpu$" && echo "$out" | grep -q "nvcc not found at /nonexistent/nvcc: skipping"' \
  "./build.sh with a GPU listed: exit $rc: $out"
out=$(PATH="$W/nogpu:$PATH" ./build.sh 2>&1); rc=$?
check '[ $rc -eq 0 ] && echo "$out" | grep -q "^build: no GPU here (.*): ./trainer_cpu only; ./build.sh all" && ! echo "$out" | grep -qE "^build: GPU|test_"' \
  "./build.sh without a GPU: exit $rc: $out"
expect_error "build.sh: bogus: expected cpu, gpu, all or nothing" ./build.sh bogus
readme_cmd=$(grep "# the test command" README.md | sed -e 's/ *#.*//')
ci_cmd=$(grep -v '^ *#' .ci/run | grep -v '^ *$' | tail -n 1)
check '[ "$readme_cmd" = "./build.sh all && tests/run.sh" ] && [ "$ci_cmd" = "$readme_cmd" ]' \
  "README's test command ('$readme_cmd') is not ./build.sh all && tests/run.sh, or not what .ci/run runs ('$ci_cmd')"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
