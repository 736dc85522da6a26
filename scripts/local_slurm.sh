#!/usr/bin/env bash
# A real Slurm cluster of two virtual nodes on this machine (multiple-slurmd mode), for testing the sbatch scripts.
#
#   bash scripts/local_slurm.sh install        # apt-get install slurmctld slurmd slurm-client munge (root)
#   bash scripts/local_slurm.sh start DIR      # start munged, slurmctld and two slurmd for DIR; prints SLURM_CONF
#   bash scripts/local_slurm.sh stop DIR       # stop them: the PIDs in their pid files, each checked to be DIR's
#
# Nothing is written to /etc/slurm. Nodes n1, n2 (2 CPUs, 4 GB each) on 127.0.0.1. Each DIR is its own cluster, so
# several can run at once (CI's two Slurm tests do): its own munged (socket, pid and log under /run/munge, named by
# DIR's hash: munged needs a socket folder every user can enter), its own ports (free ones, picked at start) and its
# own job ids (FirstJobId at random: the sbatch scripts derive Ray's ports and temp dir from the job id). slurmd's
# spool is /tmp/mlmt-slurm-HASH, not under DIR: a job step's Unix socket is named there, and a deep DIR (a pytest
# folder) made its path longer than Linux's 108 bytes, which fails the job's launch ("launch failed requeued held").
# Once, two clusters shared the fixed ports: the second's daemons died at start, its jobs went to the first, and its
# stop signalled the dead slurmctld's PID, which by then could be another test's process. So `start` fails, naming
# the daemon and printing its log, unless every daemon is up and both nodes idle, and `stop` signals a PID only while
# it is that daemon of DIR (slurmd and slurmctld by SLURM_CONF in their environment, munged by its socket).
set -euo pipefail
cmd=${1:?install|start|stop}
dir=${2:-/tmp/mlmt-slurm}
[ "$cmd" = install ] || { mkdir -p "$dir"; dir=$(cd "$dir" && pwd -P); }
key=$(printf %s "$dir" | md5sum | cut -c1-12)  # names what must live outside DIR
munge_base=/run/munge/mlmt-$key
spool=/tmp/mlmt-slurm-$key  # slurmd's spool: it holds Unix sockets, whose paths must stay under 108 bytes
conf=$dir/slurm.conf

# Whether PID is DIR's daemon: its environment names DIR's slurm.conf, or (munged) its command line DIR's socket.
is_ours() {
  local pid=$1
  [ -n "$pid" ] && [ -r "/proc/$pid/environ" ] || return 1
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ]; then
    { tr '\0' '\n' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qxF -- "--socket=$munge_base.socket"
  else
    { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$conf"
  fi
}

# DIR's daemons, one "NAME PID_FILE" line each
daemons() { printf '%s\n' "slurmd-n1 $dir/slurmd-n1.pid" "slurmd-n2 $dir/slurmd-n2.pid" "slurmctld $dir/slurmctld.pid" \
  "munged $munge_base.pid"; }

stop_daemons() {
  local name pid_file pid pids=()
  while read -r name pid_file; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file" 2>/dev/null || true)
    if is_ours "$pid"; then pids+=("$pid"); fi
    rm -f "$pid_file"
  done < <(daemons)
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  # Wait (up to 15 s) until they are gone: a start right after must not find a slurmctld's port still bound.
  for _ in $(seq 150); do
    local alive=0
    for pid in "${pids[@]}"; do is_ours "$pid" && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  if [ -f "$munge_base.log" ]; then cat "$munge_base.log" >>"$dir/log/munged.log" 2>/dev/null || true; fi
  rm -f "$munge_base.log" "$munge_base.seed"
  rm -rf "$spool"
}

# A port nothing listens on (a connection to it is refused); a race with another program is caught after the start.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_conf() {
  local base=$1 host
  host=$(hostname -s)
  cat >"$conf" <<CONF
ClusterName=mlmt
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_base.socket
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
FirstJobId=$((1000 + RANDOM * 16 + RANDOM % 16))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPort=$base
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=$((base + 1))-$((base + 2)) CPUs=2 RealMemory=4000
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
}

# Start the cluster on ports base..base+2; returns 1 (after stopping what did start) when a daemon is not up or the
# two nodes are not idle within 30 s, with the reason in $failure.
start_once() {
  local base=$1 name pid_file
  mkdir -p "$spool"/{n1,n2}
  write_conf "$base"
  export SLURM_CONF=$conf
  mkdir -p /run/munge && chown munge:munge /run/munge
  su -s /bin/sh munge -c "munged --socket=$munge_base.socket --pid-file=$munge_base.pid \
    --log-file=$munge_base.log --seed-file=$munge_base.seed" || true
  slurmctld -i || true
  slurmd -N n1 || true
  slurmd -N n2 || true
  for _ in $(seq 300); do
    failure=""
    while read -r name pid_file; do
      is_ours "$(cat "$pid_file" 2>/dev/null || true)" || failure="$name is not running"
    done < <(daemons)
    if [ -z "$failure" ] && [ "$(sinfo -h -N -o %t 2>/dev/null | grep -c idle)" -eq 2 ]; then return 0; fi
    sleep 0.1
  done
  [ -n "$failure" ] || failure="the nodes are not idle after 30 s ($(sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' '))"
  stop_daemons
  return 1
}

case "$cmd" in
install)
  command -v sbatch >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && exit 0
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
  ;;
start)
  mkdir -p "$dir"/{state,log}
  for attempt in 1 2 3; do
    base=$((6100 + RANDOM % 1200 * 3))  # 6100-9699: below Ray's worker ports and the kernel's ephemeral ones
    port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)) || continue
    if start_once "$base"; then
      echo "SLURM_CONF=$conf"
      exit 0
    fi
    echo "local_slurm.sh: attempt $attempt on ports $base-$((base + 2)): $failure" >&2
  done
  echo "local_slurm.sh: the cluster in $dir did not start (${failure:-no free ports}); its logs:" >&2
  tail -n 5 "$dir"/log/*.log >&2 2>/dev/null || true
  exit 1
  ;;
stop)
  stop_daemons
  ;;
*)
  echo "usage: $0 install|start|stop [DIR]" >&2
  exit 2
  ;;
esac
