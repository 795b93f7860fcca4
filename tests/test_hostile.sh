#!/usr/bin/env bash
# test_hostile.sh: hostile files the trainer reads, end to end on the CPU build (./trainer_cpu), tiny model: each
# must be refused with exit 1 and a message naming the file and what is wrong, never a crash or a hang. The cases
# the other tests do not have (test_state_gate.sh: a negative AdamW v, NaN 1-bit Adam errors, a token count of 2^63;
# test_hf_io.cu: bad dtypes, shapes, offsets; build/test_fuzz_load: thousands of mutated checkpoints,
# model.safetensors and config.json files, calling the loaders directly):
#   - --eval of a checkpoint (CRC made right) whose sequence length is 0 (was SIGFPE), or whose layer_norm_eps is
#     +Inf (was evaluated: every LayerNorm output 0);
#   - --init-from a model.safetensors whose __metadata__ is nested a million deep (was SIGSEGV: the JSON reader
#     recursed), whose header lists 200,000 empty tensors from the last offset down (was a minute in a quadratic
#     sort: here within 20 s), or whose header has a trailing comma (was taken);
#   - --init-from a config.json that is not a JSON object (was refused without a word why), or has no
#     intermediate_size (was read as 0: a model without its MLP).
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_hostile: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_hostile_XXXXXX)
[ -n "${KEEP:-}" ] || trap 'rm -rf "$W"' EXIT
export EMU_THREADS=1

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 32 --val-fraction 0 >"$W/prep.log" 2>&1 ||
  { echo "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"; echo "0 passed, 1 failed"; exit 1; }
DATA="$W/data/train_*.bin"
timeout 120 "$TRAINER" --data "$DATA" --preset tiny --seq 32 --batch 8 --steps 2 --seed 7 --loader-threads 1 \
  --out "$W/r" >"$W/r.log" 2>&1
[ -f "$W/r/checkpoint.bin" ] && [ -f "$W/r/model.safetensors" ] ||
  { echo "FAIL test_hostile: the run to start from: $(tail -n 2 "$W/r.log")"; echo "0 passed, 1 failed"; exit 1; }

# refused NAME LOG RC SECS PATTERN: the run ended with exit 1 (not a signal, not the timeout) within SECS, and its
# output matches PATTERN (grep -E)
refused() {
  check "[ $3 = 1 ] && [ $4 -le $5 ] && grep -qE \"$6\" \"$2\"" \
    "$1: exit $3 after ${4}s (want 1 within $5 s) and a message matching '$6': $(tail -n 2 "$2" | tr '\n' ' ')"
}
# run_timed LOG ARGS...: runs the trainer (at most 100 s); sets rc and secs
run_timed() {
  local log=$1; shift
  local t0=$SECONDS
  timeout 100 "$TRAINER" "$@" >"$log" 2>&1
  rc=$? secs=$((SECONDS - t0))
}

# ckpt_set FILE OFFSET FORMAT VALUE: one header field of a checkpoint (CkptHeader, checkpoint.h: cfg at 16, its
# layer_norm_eps at 44, T at 48), the CRC made right again
ckpt_set() {
  python3 - "$@" <<'EOF'
import struct, sys, zlib
p, off, fmt, v = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
d = bytearray(open(p, "rb").read())
struct.pack_into("<" + fmt, d, off, float(v) if fmt == "f" else int(v))
struct.pack_into("<I", d, len(d) - 8, zlib.crc32(bytes(d[:-8])))
open(p, "wb").write(d)
EOF
}
VAL=(--val "$DATA" --batch 8 --val-batches 1)
cp "$W/r/checkpoint.bin" "$W/t0.bin" && ckpt_set "$W/t0.bin" 48 i 0
run_timed "$W/t0.log" --eval "$W/t0.bin" "${VAL[@]}"
refused "--eval, a checkpoint of sequence length 0" "$W/t0.log" $rc $secs 60 "t0.bin: its sequence length 0 is out of range"
cp "$W/r/checkpoint.bin" "$W/eps.bin" && ckpt_set "$W/eps.bin" 44 f inf
run_timed "$W/eps.log" --eval "$W/eps.bin" "${VAL[@]}"
refused "--eval, a checkpoint with layer_norm_eps +Inf" "$W/eps.log" $rc $secs 60 "eps.bin: .*layer_norm_eps inf"

# st_forge DIR MODE: DIR's model.safetensors (and config.json) made hostile; MODE: nest, many, comma, array, no_mlp
st_forge() {
  python3 - "$@" <<'EOF'
import json, struct, sys
d, mode = sys.argv[1], sys.argv[2]
raw = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + n]), raw[8 + n:]
head.pop("__metadata__", None)
ents = sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0])
body = ",".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in ents)
text = "{" + body + "}"
if mode == "nest":
    text = '{"__metadata__":' + "[" * 1000000 + "]" * 1000000 + "," + body + "}"
elif mode == "many":
    top = ents[-1][1]["data_offsets"][1]
    at = [top - i % top for i in range(200000)]
    text = "{" + body + "," + ",".join('"x%d":{"dtype":"U8","shape":[0],"data_offsets":[%d,%d]}' % (i, a, a)
                                       for i, a in enumerate(at)) + "}"
elif mode == "comma":
    text = "{" + body + ",}"
elif mode == "array":
    open(d + "/config.json", "w").write("[" + open(d + "/config.json").read() + "]")
elif mode == "no_mlp":
    cfg = json.load(open(d + "/config.json"))
    del cfg["intermediate_size"]
    json.dump(cfg, open(d + "/config.json", "w"), indent=2)
text += " " * (-(8 + len(text)) % 8)
open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text.encode() + data)
EOF
}
TRAIN=(--data "$DATA" --seq 32 --batch 8 --steps 1 --loader-threads 1)
for mode in nest many comma array no_mlp; do
  D="$W/init_$mode"
  mkdir -p "$D" && cp "$W/r/config.json" "$W/r/model.safetensors" "$D/" && st_forge "$D" $mode
  run_timed "$W/$mode.log" --init-from "$D" "${TRAIN[@]}" --out "$W/o_$mode"
  case $mode in
    nest) refused "--init-from, __metadata__ nested a million deep" "$W/$mode.log" $rc $secs 60 \
            "init_nest/model.safetensors: malformed header" ;;
    many) refused "--init-from, 200,000 empty tensors from the last offset down" "$W/$mode.log" $rc $secs 20 \
            "init_many/model.safetensors: x[0-9]+ .*overlaps" ;;
    comma) refused "--init-from, a header with a trailing comma" "$W/$mode.log" $rc $secs 60 \
             "init_comma/model.safetensors: malformed header" ;;
    array) refused "--init-from, a config.json that is a JSON array" "$W/$mode.log" $rc $secs 60 \
             "init_array/config.json: malformed JSON" ;;
    no_mlp) refused "--init-from, a config.json without intermediate_size" "$W/$mode.log" $rc $secs 60 \
              "init_no_mlp/config.json: intermediate_size 0 \(or none\)" ;;
  esac
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
