#!/usr/bin/env bash
# test_coverage_paths.sh: the trainer's less travelled paths, each with the outcome it must have:
#   - AdamW and logging flags out of range, an empty --out, an unusable --val, rows too short for the shards,
#     SLURM/torchrun variables that make no sense, a job script that runs the trainer without srun, --bench
#     without a temporary directory or its --out: one line naming the flag, variable or file, and exit 1
#   - the NCCL bootstrap (comm.h): a bad MASTER_PORT or node list; over TCP, a rank 0 or a rank 1 alone (the
#     --nccl-timeout deadline, naming the address and port); --bootstrap file: an id file rank 0 cannot
#     write, a truncated one, one that rank 0 never wrote
#   - --stage-dir: with --val (both splits copied, the run trains and evaluates from the copies), and a
#     staging directory that cannot be made, a path too long, two sources with the same file name, a shard
#     that cannot be renamed into place, a marker that cannot be written
#   - shard headers that are consistent (checksums right) but wrong: token width, ids outside the vocabulary,
#     no ordinary tokens, max_len 0
#   - --resume with a checkpoint.bin that is a directory, shorter than a header, or (checksum right) saved by
#     a trainer with other weights
# Run by tests/run.sh; needs tools/requirements.txt (tools/prepare.py). TRAINER overrides ./trainer_cpu.
cd "$(dirname "$0")/.."
TRAINER=${TRAINER:-./trainer_cpu}
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_coverage_paths: $*"; }
W=$(mktemp -d /tmp/mlm_paths_XXXXXX)
trap 'chmod -R u+w "$W" 2>/dev/null; rm -rf "$W"' EXIT
export EMU_THREADS=1
unset MLM_TEST_INF_GRAD MLM_TEST_INF_LOSS SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_JOB_ID SLURM_STEP_ID

# 12 documents (files), a few of them in the validation split
mkdir -p "$W/in"
for i in $(seq 1 12); do echo "document $i alpha beta gamma delta $i kernel tensor $i" >"$W/in/f$i.txt"; done
python3 tools/prepare.py bytes --input "$W/in" --out "$W/data" --seq-len 32 --val-fraction 0.3 >/dev/null 2>&1
if [ ! -f "$W/data/train_00000.bin" ] || [ ! -f "$W/data/val_00000.bin" ]; then
  bad "tools/prepare.py made no train and val shards"; echo "$pass passed, $((fail + 1)) failed"; exit 1
fi
D="$W/data/train_*.bin"
V="$W/data/val_*.bin"
T=(--data "$D" --preset tiny --seq 32 --batch 4 --steps 2)
touch "$W/file"
mkdir -p "$W/d1" "$W/d2"  # two directories holding a shard of the same name
cp "$W/data/train_00000.bin" "$W/d1/" && cp "$W/data/train_00000.bin" "$W/d2/"
LONG=$W/$(printf 'x%.0s' $(seq 1 4100))
# --bootstrap file: rank 0 cannot write its NCCL id (the temporary name is a directory); rank 1 finds a
# truncated id file, and one of the right size that rank 0 never wrote
mkdir -p "$W/c0/nccl_id.j0.0.0.tmp" "$W/c1" "$W/c2"
head -c 10 /dev/zero >"$W/c1/nccl_id.j1.0.0"
head -c 160 /dev/zero >"$W/c2/nccl_id.j2.0.0"
# staging: the shard's local name is a non-empty directory; the marker's temporary name is a directory
mkdir -p "$W/st_ren/train_00000.bin/x" "$W/st_mark/.staged-train_00000.bin.tmp"  # (the table's commands expand --data's glob)

# shards with a header that is self-consistent (CRC recomputed) but wrong: FIELD=VALUE ... at byte offsets
shard() {  # shard NAME OFFSET:FMT:VALUE ...
  mkdir -p "$W/$1"
  python3 - "$W/data/train_00000.bin" "$W/$1/train_00000.bin" "${@:2}" <<'EOF'
import struct, sys, zlib
src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
b = bytearray(open(src, "rb").read())
for e in edits:
    off, fmt, val = e.split(":")
    struct.pack_into("<" + fmt, b, int(off), int(val))
struct.pack_into("<I", b, 68, 0)
struct.pack_into("<I", b, 68, zlib.crc32(bytes(b[:128])))
open(dst, "wb").write(b)
EOF
}
shard width3 20:I:3
shard unk_out 60:i:999
shard few_tokens 16:I:5 44:i:0 48:i:1 52:i:2 56:i:3 60:i:-1
shard max_len0 40:I:0

# The table: PATTERN the output must contain | the command (eval'ed); each must exit 1
CASES=$(cat <<EOF
--wd 2: expected a number in \[0, 1\]|$TRAINER ${T[*]} --out $W/o --wd 2
--beta1 1: expected a number in \[0, 0.999999\]|$TRAINER ${T[*]} --out $W/o --beta1 1
--beta2 -0.5: expected a number|$TRAINER ${T[*]} --out $W/o --beta2 -0.5
--eps 0: expected a number in \[1e-30, 1\]|$TRAINER ${T[*]} --out $W/o --eps 0
--clip -1: expected a number|$TRAINER ${T[*]} --out $W/o --clip -1
--log-every 0: expected an integer in \[1,|$TRAINER ${T[*]} --out $W/o --log-every 0
--out '': expected a directory path|$TRAINER ${T[*]} --out ''
trainer: --val: data: $W/none/\*.bin: no shard files match|$TRAINER ${T[*]} --out $W/o --val "$W/none/*.bin"
samples of up to 32 tokens do not fit rows of T=16|$TRAINER ${T[*]} --out $W/o --seq 16
started by a Slurm job script (SLURM_JOB_ID=7, SLURM_NTASKS=2) but not by srun|SLURM_JOB_ID=7 SLURM_NTASKS=2 $TRAINER ${T[*]} --out $W/o
RANK=3 is not below WORLD_SIZE=2|WORLD_SIZE=2 RANK=3 $TRAINER ${T[*]} --out $W/o
--bootstrap udp: expected tcp or file|$TRAINER ${T[*]} --out $W/o --bootstrap udp
--nccl-timeout 0: expected a number in \[0.1,|$TRAINER ${T[*]} --out $W/o --nccl-timeout 0
MASTER_PORT=99999: expected a TCP port in \[1, 65535\]|MASTER_PORT=99999 SLURM_NTASKS=2 SLURM_PROCID=0 $TRAINER ${T[*]} --out $W/o
SLURM_JOB_NODELIST=node\[01-: not a Slurm host list (set MASTER_ADDR)|SLURM_JOB_NODELIST='node[01-' SLURM_NTASKS=2 SLURM_PROCID=1 $TRAINER ${T[*]} --out $W/o
rank 1 got no NCCL id from rank 0 at 127.0.0.1:[0-9]* in 1 s|SLURM_NTASKS=2 SLURM_PROCID=1 $TRAINER ${T[*]} --out $W/o --nccl-timeout 1
rank 0 (TCP port [0-9]*) heard from 0 of the 1 other ranks in 1 s|SLURM_NTASKS=2 SLURM_PROCID=0 $TRAINER ${T[*]} --out $W/o --nccl-timeout 1
environment variable SLURM_NTASKS=two is not a non-negative integer|SLURM_NTASKS=two $TRAINER ${T[*]} --out $W/o
SLURM_PROCID=2 is not below SLURM_NTASKS=2|SLURM_NTASKS=2 SLURM_PROCID=2 $TRAINER ${T[*]} --out $W/o
--bench: cannot create a temporary directory $W/no-tmp/mlm_bench_|TMPDIR=$W/no-tmp $TRAINER --bench --preset tiny --seq 32 --batch 2 --bench-steps 1
--out $W/file/sub: cannot create the directory|SLURM_NTASKS=2 SLURM_PROCID=0 $TRAINER --bench --bootstrap file --preset tiny --seq 32 --out $W/file/sub
bootstrap (the NCCL id): cannot write the NCCL id to $W/c0/nccl_id.j0.0.0 |SLURM_JOB_ID=j0 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=0 $TRAINER ${T[*]} --out $W/c0 --bootstrap file
rank 1 waited 1 s for the NCCL id in $W/c1/nccl_id.j1.0.0 (truncated;|SLURM_JOB_ID=j1 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=1 $TRAINER ${T[*]} --out $W/c1 --bootstrap file --nccl-timeout 1
rank 1 waited 1 s for the NCCL id in $W/c2/nccl_id.j2.0.0 (not an NCCL id file;|SLURM_JOB_ID=j2 SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_PROCID=1 $TRAINER ${T[*]} --out $W/c2 --bootstrap file --nccl-timeout 1
--stage-dir: data: $W/file/sub: cannot create the staging directory|$TRAINER ${T[*]} --out $W/o --stage-dir $W/file/sub
--stage-dir: data: staging directory of 41[0-9][0-9] characters too long (at most 40[0-9][0-9] here): $W/xxxx|$TRAINER ${T[*]} --out $W/o --stage-dir $LONG
same file name, cannot both be staged into $W/st_dup|$TRAINER --data "$W/d[12]/train_*.bin" --preset tiny --seq 32 --batch 4 --steps 2 --out $W/o --stage-dir $W/st_dup
data: $W/st_ren/train_00000.bin: cannot rename into place|$TRAINER ${T[*]} --out $W/o --stage-dir $W/st_ren
data: $W/st_mark/.staged-train_00000.bin: cannot write the staging marker|$TRAINER ${T[*]} --out $W/o --stage-dir $W/st_mark
width3/train_00000.bin: token width 3 bytes (expected 2 or 4)|$TRAINER --data "$W/width3/*.bin" --preset tiny --seq 32 --out $W/o --steps 2
unk_out/train_00000.bin: unk_id 999 is outside the vocabulary|$TRAINER --data "$W/unk_out/*.bin" --preset tiny --seq 32 --out $W/o --steps 2
few_tokens/train_00000.bin: vocab size 5 leaves no ordinary tokens|$TRAINER --data "$W/few_tokens/*.bin" --preset tiny --seq 32 --out $W/o --steps 2
max_len0/train_00000.bin: max_len 0 (expected 1..|$TRAINER --data "$W/max_len0/*.bin" --preset tiny --seq 32 --out $W/o --steps 2
EOF
)
while IFS='|' read -r pat cmd; do
  [ -n "$pat" ] || continue
  out=$(eval "$cmd" 2>&1); rc=$?
  if [ $rc -eq 1 ] && echo "$out" | grep -q -- "$pat"; then ok; else
    bad "'${cmd:0:200}' gave exit $rc (want 1 and '$pat'): $(echo "$out" | tail -n 2)"
  fi
done <<<"$CASES"
# the failed stagings left no temporary files behind
if ! ls -a "$W/st_ren" | grep -q '\.tmp$'; then ok; else bad "a failed rename left $(ls -a "$W/st_ren" | grep tmp)"; fi

# --stage-dir with --val: both splits are copied and the run trains and evaluates from the copies
out=$("$TRAINER" "${T[@]}" --out "$W/s" --stage-dir "$W/stage" --val "$V" --val-every 1 --val-batches 1 2>&1); rc=$?
if [ $rc = 0 ] && cmp -s "$W/stage/train_00000.bin" "$W/data/train_00000.bin" &&
  cmp -s "$W/stage/val_00000.bin" "$W/data/val_00000.bin" && [ -f "$W/stage/.staged-val_*.bin" ] &&
  echo "$out" | grep -q "^data: $W/stage/val_\*.bin: 1 shards" && echo "$out" | grep -q "^step      2 | val loss"; then
  ok
else
  bad "--stage-dir with --val: exit $rc, $(echo "$out" | tail -n 2)"
fi

# --resume refuses a checkpoint.bin that is a directory, or shorter than a header, and says why
mkdir -p "$W/r1/checkpoint.bin" "$W/r2"
head -c 20 /dev/zero >"$W/r2/checkpoint.bin"
out=$("$TRAINER" "${T[@]}" --out "$W/r1" --resume 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q "trainer: --out $W/r1: $W/r1/checkpoint.bin is a directory, not a file"; then ok; else
  bad "checkpoint.bin a directory: exit $rc, $(echo "$out" | tail -n 1)"
fi
out=$("$TRAINER" "${T[@]}" --out "$W/r2" --resume 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q "checkpoint.bin: truncated: 20 bytes, shorter than a header"; then ok; else
  bad "a 20-byte checkpoint.bin: exit $rc, $(echo "$out" | tail -n 1)"
fi
# a checkpoint (CRC recomputed) of 4-byte weights (an fp32 build's): x_bytes at offset 56, body_bytes at 72
mkdir -p "$W/r3" && cp "$W/s/checkpoint.bin" "$W/r3/"
python3 - "$W/r3/checkpoint.bin" <<'EOF'
import struct, sys, zlib
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
assert struct.unpack_from("<i", b, 56)[0] == 2, "x_bytes (2: bf16) not at offset 56"
hb, = struct.unpack_from("<I", b, 12)
numel, body = struct.unpack_from("<QQ", b, 64)
struct.pack_into("<i", b, 56, 4)  # 4-byte weights: an fp32 build keeps no bf16 copy after its fp32 arrays
del b[hb + 12 * numel:hb + 14 * numel]
struct.pack_into("<Q", b, 72, body - 2 * numel)
struct.pack_into("<II", b, len(b) - 8, zlib.crc32(bytes(b[:-8])), 0)
open(p, "wb").write(b)
EOF
out=$("$TRAINER" "${T[@]}" --out "$W/r3" --resume 2>&1); rc=$?
if [ $rc = 1 ] && echo "$out" | grep -q -- "--resume: $W/r3/checkpoint.bin: saved by a trainer with [24]-byte weights; this one is"; then
  ok
else
  bad "a checkpoint with other weights: exit $rc, $(echo "$out" | tail -n 1)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
