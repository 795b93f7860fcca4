#!/usr/bin/env bash
# tools/emulated_network.sh: how much communication the trainer hides and how much it exposes, measured on
# the CPU build with the CPU NCCL's emulated network (NCCL_EMU_GBPS, NCCL_EMU_LATENCY_US: every collective
# takes at least latency + bytes sent / bandwidth), against what the scaling predictor (scaling.h) says for
# the same numbers.
#   tools/emulated_network.sh [--ranks 4] [--gbps 0.005] [--latency-us 2000] [--reps 2] [-- TRAINER FLAGS]
# It runs RANKS processes of `./trainer_cpu --bench` (the real training step: forward, backward, the bucketed
# gradient all-reduce, AdamW) on one machine, REPS times without the throttle and REPS times with it,
# alternately, and prints one table: the step without and with the network, their difference (the
# communication the step exposes), the bench's "gradient all-reduce" phase (what the backward did not hide
# of the buckets' reduction), and the predictor's figures for RANKS nodes of 1 GPU at the same bandwidth
# (link efficiency 1), per-collective latency and measured micro-batch: all its collectives added up (what
# a runtime that overlaps nothing exposes) and what it predicts stays exposed when the buckets overlap the
# backward as on a GPU. The predictor charges a ring all-reduce base + 2 (P-1) x alpha; alpha is set to
# LATENCY / (2 (P-1)) so that its latency per collective is the emulator's (plus NCCL's 8.4 us base).
# (For messages whose bytes / bandwidth is under about half the latency the predictor takes NCCL's tree,
# whose latency is 2/3 of that: with the defaults only the host sync's 32 bytes.)
# Default model: tiny, T=32, B=16, --bucket-mb 0.02 (6 buckets). Takes about 3 minutes on 2 cores.
set -uo pipefail
cd "$(dirname "$0")/.."
RANKS=4; GBPS=0.005; LAT_US=2000; REPS=2
FLAGS=(--preset tiny --seq 32 --batch 16 --bucket-mb 0.02)
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) RANKS=$2; shift 2 ;;
    --gbps) GBPS=$2; shift 2 ;;
    --latency-us) LAT_US=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --) shift; FLAGS=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "emulated_network.sh: $1: unknown argument (see --help)" >&2; exit 1 ;;
  esac
done
for v in "$RANKS" "$REPS"; do [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "emulated_network.sh: '$v': expected a positive integer" >&2; exit 1; }; done
for v in "$GBPS" "$LAT_US"; do
  awk -v x="$v" 'BEGIN { exit !(x ~ /^[0-9.eE+-]+$/ && x + 0 >= 0) }' || { echo "emulated_network.sh: '$v': expected a number >= 0" >&2; exit 1; }
done
[ "$RANKS" -ge 2 ] || { echo "emulated_network.sh: --ranks $RANKS: needs at least 2" >&2; exit 1; }
[ -x ./trainer_cpu ] || { echo "emulated_network.sh: ./trainer_cpu not built (./build.sh cpu)" >&2; exit 1; }
W=$(mktemp -d /tmp/mlm_emunet_XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$W"' EXIT
unset SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_JOB_ID SLURM_STEP_ID SLURM_STEPID SLURM_JOB_NODELIST \
  SLURM_STEP_NODELIST SLURM_NNODES MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK NCCL_EMU_GBPS NCCL_EMU_LATENCY_US

bench() {  # bench NAME [ENV...]: RANKS ranks of --bench; rank 0's output in $W/NAME.log
  local name=$1 r; shift
  PIDS=()
  for r in $(seq 0 $((RANKS - 1))); do
    env "$@" SLURM_NTASKS=$RANKS SLURM_PROCID=$r SLURM_LOCALID=$r EMU_THREADS=1 EMU_DEVICE_BYTES=2e9 \
      ./trainer_cpu --bench "${FLAGS[@]}" --bench-warmup 1 --bench-steps 4 >"$W/$name.$r.log" 2>&1 &
    PIDS+=($!)
  done
  local rc=0
  for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
  PIDS=()
  [ $rc -eq 0 ] || { echo "emulated_network.sh: a rank of the $name run failed: $(tail -n 2 "$W/$name.0.log")" >&2; exit 1; }
  cp "$W/$name.0.log" "$W/$name.log"
}
phase() { sed -n -E "s/^  $2 +([0-9.]+).*/\1/p" "$1" | head -n 1; }   # phase LOG "NAME": ms per step
mean() { awk '{ s += $1; n++ } END { printf "%.1f", s / n }'; }

for i in $(seq 1 "$REPS"); do
  bench "free$i"
  bench "net$i" NCCL_EMU_GBPS="$GBPS" NCCL_EMU_LATENCY_US="$LAT_US"
done
free=$(for i in $(seq 1 "$REPS"); do phase "$W/free$i.log" "step \(wall clock\)"; done | mean)
net=$(for i in $(seq 1 "$REPS"); do phase "$W/net$i.log" "step \(wall clock\)"; done | mean)
ar0=$(for i in $(seq 1 "$REPS"); do phase "$W/free$i.log" "gradient all-reduce"; done | mean)
ar=$(for i in $(seq 1 "$REPS"); do phase "$W/net$i.log" "gradient all-reduce"; done | mean)
# the micro-batch: forward + backward phases of the runs without the throttle
micro=$(for i in $(seq 1 "$REPS"); do
  for p in "embedding" "attention forward" "attention backward" "matmuls" "other kernels"; do phase "$W/free$i.log" "$p"; done |
    awk '{ s += $1 } END { print s }'
done | mean)
alpha=$(awk -v l="$LAT_US" -v p="$RANKS" 'BEGIN { printf "%.3f", l / (2 * (p - 1)) }')
./trainer_cpu --plan-only "${FLAGS[@]}" --nodes "$RANKS" --gpus-per-node 1 --net-gbps "$GBPS" --link-efficiency 1 \
  --alpha-us "$alpha" --micro-ms "$micro" >"$W/plan.log" 2>&1 || { echo "emulated_network.sh: --plan-only failed: $(tail -n 1 "$W/plan.log")" >&2; exit 1; }
row=$(awk '/^--comm fp32:/ { on = 1; next } /^--comm / { on = 0 } on && /^\| [0-9]+ \|/' "$W/plan.log" | tr -d '|%' |
  awk -v n="$RANKS" '$1 == n')
read -r _ _ _ _ _ pcompute pcoll pcomm pexposed _ <<<"$row"
buckets=$(sed -n -E 's/.* gradients in ([0-9]+) buckets.*/\1/p' "$W/plan.log")
exposed=$(awk -v a="$net" -v b="$free" 'BEGIN { printf "%.1f", a - b }')
echo "emulated network: $RANKS ranks of ./trainer_cpu --bench ${FLAGS[*]} on $(nproc) cores, $REPS runs each;"
echo "NCCL_EMU_GBPS=$GBPS NCCL_EMU_LATENCY_US=$LAT_US ($buckets buckets + the step's host sync = $pcoll collectives per step)"
echo
echo "| quantity | ms per step |"
echo "| --- | ---: |"
echo "| step, no throttle (measured) | $free |"
echo "| step, emulated network (measured) | $net |"
echo "| exposed communication: the difference (measured) | $exposed |"
echo "| gradient all-reduce phase, no throttle (measured: the ranks waiting for each other) | $ar0 |"
echo "| gradient all-reduce phase, emulated network (measured: what the backward did not hide) | $ar |"
echo "| micro-batch forward + backward, no throttle (measured; the predictor's --micro-ms) | $micro |"
echo "| predicted: every collective added up (nothing overlapped) | $pcomm |"
echo "| predicted: exposed with the buckets overlapping the backward (as on a GPU) | $pexposed |"
echo
echo "emulated-network-result ranks=$RANKS gbps=$GBPS latency_us=$LAT_US measured_exposed_ms=$exposed predicted_comm_ms=$pcomm predicted_exposed_ms=$pexposed"
