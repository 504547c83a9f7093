#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for trying the sweep's submitit launcher (hydra/launcher=slurm)
# without a cluster: munged, slurmctld and slurmd from Debian's `munge` and `slurm-wlm` packages, on localhost,
# with cgroup-free settings that work in a container (proctrack/linuxproc, task/none, no accounting).
#
#   sweeps/slurm/cluster.sh start     # start it (idempotent); prints `export SLURM_CONF=...`
#   sweeps/slurm/cluster.sh stop      # stop the daemons this script started (by their pid files)
#   sweeps/slurm/cluster.sh status    # sinfo
#
# State, logs and the config live in $GRPO_VRAM_SLURM_DIR (default /tmp/grpo-vram-slurm-$UID). Client commands
# (sbatch, squeue, scancel, submitit) find the cluster through SLURM_CONF=$GRPO_VRAM_SLURM_DIR/slurm.conf.
# Exit 3, with one line saying why, where SLURM cannot start (not installed, not root, a daemon fails).
set -euo pipefail
shopt -s extglob

DIR=${GRPO_VRAM_SLURM_DIR:-/tmp/grpo-vram-slurm-$(id -u)}
CONF=$DIR/slurm.conf
HOST=$(hostname -s)
CTLD_PORT=${GRPO_VRAM_SLURM_PORT:-16817}
export SLURM_CONF=$CONF

die() { echo "cluster.sh: $*" >&2; exit 3; }

running() { [[ -s $DIR/run/$1.pid ]] && kill -0 "$(cat "$DIR/run/$1.pid")" 2>/dev/null; }

stop() {
  for name in slurmd slurmctld munged; do
    pidfile=$DIR/run/$name.pid
    if [[ -s $pidfile ]]; then
      pid=$(cat "$pidfile")
      if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      fi
      rm -f "$pidfile"
    fi
  done
}

start() {
  for tool in munged slurmctld slurmd sbatch sinfo; do
    command -v $tool >/dev/null || die "$tool not found: apt-get install slurm-wlm munge"
  done
  [[ $(id -u) == 0 ]] || die "run as root (slurmd runs jobs as their submitting user and needs root)"
  if running slurmctld && running slurmd && [[ $(sinfo -h -o %T 2>/dev/null | head -1) == @(idle|mixed|allocated)* ]]; then
    echo "export SLURM_CONF=$CONF"; return
  fi
  stop
  mkdir -p "$DIR"/{run,log,ctld,spool,munge}
  chmod 755 "$DIR/munge"
  [[ -s $DIR/munge/munge.key ]] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; }
  chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed" \
    || die "munged did not start (see $DIR/log/munged.log)"
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
  cat > "$CONF" <<CONF
# Written by sweeps/slurm/cluster.sh: one node (this host), no cgroups, no accounting.
ClusterName=grpovram
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$((CTLD_PORT + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=10
InactiveLimit=0
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
  printf "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n" > "$DIR/cgroup.conf"
  slurmctld -f "$CONF" || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
  slurmd -f "$CONF" || die "slurmd did not start (see $DIR/log/slurmd.log)"
  for _ in $(seq 60); do
    state=$(sinfo -h -o %T 2>/dev/null | head -1 || true)
    [[ $state == idle* || $state == mixed* ]] && { echo "export SLURM_CONF=$CONF"; return; }
    sleep 0.5
  done
  tail -n 3 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
  die "the node did not become idle in 30 s (state: ${state:-none}; logs in $DIR/log)"
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
