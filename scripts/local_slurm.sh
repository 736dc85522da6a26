#!/usr/bin/env bash
# A real Slurm cluster of two virtual nodes on this machine (multiple-slurmd mode), for testing the sbatch scripts.
#
#   bash scripts/local_slurm.sh install        # apt-get install slurmctld slurmd slurm-client munge (root)
#   bash scripts/local_slurm.sh start DIR      # start munged, slurmctld and two slurmd under DIR; prints SLURM_CONF
#   bash scripts/local_slurm.sh stop DIR       # stop them by the PIDs in their pid files
#
# Every file lives under DIR; nothing is written to /etc/slurm. Nodes n1, n2 (2 CPUs, 4 GB each) on 127.0.0.1.
set -euo pipefail
cmd=${1:?install|start|stop}
dir=${2:-/tmp/mlmt-slurm}

case "$cmd" in
install)
  command -v sbatch >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && exit 0
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
  ;;
start)
  mkdir -p "$dir"/{state,spool/n1,spool/n2,log}
  host=$(hostname -s)
  cat > "$dir/slurm.conf" <<CONF
ClusterName=mlmt
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPort=16817
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=17001-17002 CPUs=2 RealMemory=4000
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! pgrep -x munged >/dev/null; then  # a munged that was already running is left alone (and not stopped)
    su -s /bin/sh munge -c "munged --pid-file=/run/munge/mlmt-munged.pid"
    cp /run/munge/mlmt-munged.pid "$dir/munged.pid"
  fi
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -i
  slurmd -N n1
  slurmd -N n2
  for _ in $(seq 50); do
    [ "$(sinfo -h -o %t 2>/dev/null | grep -c idle)" -ge 1 ] && break
    sleep 0.2
  done
  echo "SLURM_CONF=$SLURM_CONF"
  ;;
stop)
  pids=()
  for pid_file in "$dir"/slurmd-n1.pid "$dir"/slurmd-n2.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pid_file" ] && pids+=("$(cat "$pid_file")")
  done
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  # Wait (up to 15 s) until they are gone: a start right after must not find a dying munged (it would leave it
  # alone and jobs would fail with "authentication error") or slurmctld's port still bound.
  for _ in $(seq 150); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  ;;
*)
  echo "usage: $0 install|start|stop [DIR]" >&2
  exit 2
  ;;
esac
