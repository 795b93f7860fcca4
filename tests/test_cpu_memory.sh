#!/usr/bin/env bash
# test_cpu_memory.sh: ./trainer_cpu's emulated device fits its host. Without EMU_DEVICE_BYTES the device
# is half the host's memory (physical memory, or the memory cgroup's limit when lower), so the
# automatic micro-batch's plan never exceeds the machine; EMU_DEVICE_BYTES still sets it.
# Run by tests/run.sh; needs tools/requirements.txt (python3 tools/prepare.py).
cd "$(dirname "$0")/.."
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL test_cpu_memory: $*"; }
check() { if eval "$1"; then ok; else bad "$2"; fi; }
W=$(mktemp -d /tmp/mlm_cpu_memory_XXXXXX)
trap 'rm -rf "$W"' EXIT

# The host's memory as the runtime reads it, independently: MemTotal, or a lower cgroup (v2, v1) limit.
host=$(($(awk '/^MemTotal:/ { print $2 }' /proc/meminfo) * 1024))
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do
  v=$(cat "$f" 2>/dev/null)
  [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -lt "$host" ] && host=$v  # "max" (no limit) is not a number
done

python3 tools/prepare.py bytes --input cpu --out "$W/data" --seq-len 512 >"$W/prep.log" 2>&1 ||
  bad "tools/prepare.py failed: $(tail -n 2 "$W/prep.log")"
plan() { ./trainer_cpu --data "$W/data/train_*.bin" --out "$W/p" --preset bert-base --seq 512 --plan-only 2>&1; }

# 1. the default: half the host's memory, and the largest micro-batch's plan fits in it
out=$(env -u EMU_DEVICE_BYTES bash -c "$(declare -f plan); W='$W'; plan"); rc=$?
dev=$(echo "$out" | sed -n -E 's/^device: .*, ([0-9.]+) GB free of ([0-9.]+) GB.*/\2/p')
gib=$(echo "$out" | sed -n -E 's/.*total ([0-9.]+) GiB for B=([0-9]+) \(the largest that fits\).*/\1/p')
b=$(echo "$out" | sed -n -E 's/.*total ([0-9.]+) GiB for B=([0-9]+) \(the largest that fits\).*/\2/p')
check '[ $rc -eq 0 ] && [ -n "$dev" ] && awk -v d="$dev" -v h="$host" "BEGIN { exit !(d * 1e9 > 0.99 * h / 2 && d * 1e9 < 1.01 * h / 2) }"' \
  "the default device is not half the host's $host bytes: exit $rc, $(echo "$out" | grep -E '^device:|error' | head -n 2)"
check '[ -n "$b" ] && [ "$b" -ge 1 ] && awk -v g="$gib" -v h="$host" "BEGIN { exit !(g * 1073741824 <= h / 2) }"' \
  "the automatic plan ($gib GiB at B=$b) does not fit half the host's $host bytes"
echo "  (host memory $host bytes: bert-base, T=512 plans B=$b, $gib GiB)"

# 2. EMU_DEVICE_BYTES still sets the device's size (and with it the micro-batch)
out2=$(EMU_DEVICE_BYTES=20e9 bash -c "$(declare -f plan); W='$W'; plan")
b2=$(echo "$out2" | sed -n -E 's/.*for B=([0-9]+) .*/\1/p')
check 'echo "$out2" | grep -q "free of 20.0 GB" && [ -n "$b2" ] && [ "$b2" -ge 1 ]' \
  "EMU_DEVICE_BYTES=20e9 did not give a 20 GB device: $(echo "$out2" | grep -E '^device:' | head -n 1)"
out3=$(EMU_DEVICE_BYTES=lots ./trainer_cpu --info 2>&1); rc=$?
check '[ $rc -ne 0 ] && echo "$out3" | grep -q "EMU_DEVICE_BYTES=lots is not a non-negative number"' \
  "EMU_DEVICE_BYTES=lots was not refused: exit $rc, $out3"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
