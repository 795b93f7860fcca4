#!/usr/bin/env bash
# tests/slurm/harness.sh CMD [ARGS...]: runs CMD against a real, private, single-node Slurm on this machine.
#
#   installs Debian's slurm-wlm (munge included) with apt-get when it is missing (as root);
#   writes slurm.conf, the munge key, state, spool and logs to one temp dir, with random free ports;
#   starts munged, slurmctld and slurmd in the foreground as background jobs, waits for the node to be idle;
#   runs CMD in the caller's directory with SLURM_CONF set (and HARNESS_DIR, the temp dir, for scratch);
#   on exit cancels its jobs, stops the daemons by PID (TERM, then KILL after 10 s) and removes the temp dir.
# Exit status: CMD's; 3 when Slurm could not be installed or started (the reason is printed).
# /etc/slurm and /etc/munge are not touched. Knobs: HARNESS_CPUS (CPUs the node advertises, default 4:
# SlurmdParameters=config_overrides lets `srun -n 4` run on 2 cores), HARNESS_KEEP=1 keeps the temp dir.
# Pitfalls it avoids (found setting up a single-node Slurm by hand): mktemp's 0700 dir (munged needs o+x on its socket's
# path), clients without SLURM_CONF, jobs larger than the node pending for ever (EnforcePartLimits=ALL),
# an outer job's SLURM_* variables, `cd x && daemon &` recording a subshell's PID.
set -uo pipefail
NCPU=${HARNESS_CPUS:-4}
KEEP=${HARNESS_KEEP:-0}
for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done   # an outer job would capture our srun
log() { echo "harness: $*" >&2; }
unavailable() { log "Slurm unavailable: $*"; exit 3; }

# 1. Packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null ||
   ! command -v munged >/dev/null; then
  [ "$(id -u)" = 0 ] || unavailable "slurm-wlm is not installed and this is not root (apt-get install slurm-wlm)"
  log "installing slurm-wlm (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >/dev/null 2>&1 ||
    unavailable "apt-get install --no-install-recommends slurm-wlm munge failed"
  command -v slurmctld >/dev/null || unavailable "slurmctld still missing after apt-get"
fi
[ "$(id -u)" = 0 ] || unavailable "slurmd must run as root"

# 2. The temp dir (0755: munged checks every directory on its socket's path)
T=$(mktemp -d /tmp/mlm-slurm.XXXXXX) || unavailable "mktemp failed"
chmod 755 "$T"
mkdir -p "$T"/{state,spool,log,munge}
chmod 755 "$T/munge"
export SLURM_CONF=$T/slurm.conf HARNESS_DIR=$T
MUNGED= CTLD= SLURMD= CMD_PID=

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
stop() {  # stop PID: TERM, up to 10 s, then KILL
  alive "$1" || return 0
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 100); do alive "$1" || break; sleep 0.1; done
  alive "$1" && kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop "$CMD_PID"
  if alive "$CTLD"; then   # cancel what is left of our jobs (this cluster only: SLURM_CONF)
    timeout 10 scancel --user="$(id -un)" >/dev/null 2>&1
    for _ in $(seq 50); do [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  stop "$SLURMD"; stop "$CTLD"; stop "$MUNGED"
  [ $rc -eq 3 ] && tail -n 5 "$T"/log/* 2>/dev/null >&2
  if [ "$KEEP" = 1 ]; then log "kept $T"; else rm -rf "$T"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 3. Two free ports (a listening socket on either would show in ss)
free_port() { local p; while :; do p=$((20000 + RANDOM % 30000)); [ "$p" != "${1:-}" ] &&
  ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && { echo $p; return; }; done; }
CTLD_PORT=$(free_port); SLURMD_PORT=$(free_port "$CTLD_PORT")

# 4. munge, with its own key and socket
SOCK=$T/munge/munge.socket
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none && chmod 600 "$T/munge/munge.key"
munged -F --socket="$SOCK" --key-file="$T/munge/munge.key" --pid-file="$T/munge/munged.pid" \
  --seed-file="$T/munge/munged.seed" >"$T/log/munged.log" 2>&1 &
MUNGED=$!
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
munge -S "$SOCK" -n 2>/dev/null | unmunge -S "$SOCK" >/dev/null 2>&1 || unavailable "munged did not start"

# 5. slurm.conf: no cgroups, no accounting, root everywhere
cat >"$SLURM_CONF" <<EOF
ClusterName=mlmtest
SlurmctldHost=localhost
SlurmUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$SOCK
CredType=cred/munge
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
EnforcePartLimits=ALL
KillWait=5
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$NCPU State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

# 6. The daemons, in the foreground (-D) so that $! is theirs
slurmctld -D -f "$SLURM_CONF" >"$T/log/slurmctld.stderr" 2>&1 &
CTLD=$!
for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' || unavailable "slurmctld did not come up"
slurmd -D -N localhost -f "$SLURM_CONF" >"$T/log/slurmd.stderr" 2>&1 &
SLURMD=$!
for _ in $(seq 150); do [ "$(timeout 5 sinfo -h -n localhost -o %t 2>/dev/null)" = idle ] && break; sleep 0.1; done
[ "$(timeout 5 sinfo -h -n localhost -o %t 2>/dev/null)" = idle ] ||
  unavailable "the node is not idle: $(timeout 5 sinfo -h -n localhost -o '%t %E' 2>&1)"
log "Slurm $(srun --version | awk '{print $2}') up: $NCPU CPUs, ports $CTLD_PORT/$SLURMD_PORT, $T"

# 7. The command (in the background + wait, so that INT/TERM reach the trap at once)
[ $# -gt 0 ] || exit 0
"$@" </dev/null &
CMD_PID=$!
wait "$CMD_PID"
rc=$?
CMD_PID=
[ $rc -eq 3 ] && rc=1   # 3 means "no Slurm": not the command's to give
exit $rc
