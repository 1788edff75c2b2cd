#!/usr/bin/env bash
# A real single-host Slurm cluster with TWO slurmd nodes (n1, n2), for the launcher tests.
#
#   tests/infra/slurm.sh start    install (if missing), start munged, slurmctld, slurmd n1+n2; wait idle
#   tests/infra/slurm.sh stop     cancel jobs, shut the daemons down, stop munged if this script started it
#   tests/infra/slurm.sh status   exit 0 when both nodes answer, print sinfo
#   tests/infra/slurm.sh env      print `export SLURM_CONF=...` for clients
#
# Idempotent: `start` on a running cluster only waits for it; `stop` on a stopped one is a no-op.
# State (config, spool, logs, pid files) lives in $SLURM_TEST_STATE (default /tmp/pipeline-slurm);
# clients find the cluster through SLURM_CONF=$SLURM_TEST_STATE/slurm.conf, so nothing in /etc
# is changed except what the Debian packages install. Needs root (apt-get, munge, slurmd).
#
# Both nodes live on 127.0.0.1 (NodeAddr) with their own slurmd port, so `srun -N2` runs one
# task "on" each with SLURM_NODEID 0 and 1: the real multi-node path. The controller's and the
# two slurmd ports are free ports picked when the controller starts (SLURM_TEST_CTLD_PORT /
# SLURM_TEST_NODE_PORTS="p1 p2" pin them), so a machine's own Slurm or another test cluster
# does not collide. munged is shared by everything on the host: `stop` kills it only when
# this script started it (its pid is kept in $STATE/munged.ours).
set -euo pipefail

STATE=${SLURM_TEST_STATE:-/tmp/pipeline-slurm}
CONF=$STATE/slurm.conf
export SLURM_CONF=$CONF

log() { printf '[slurm.sh] %s\n' "$*" >&2; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || [ -x /usr/sbin/munged ] || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # `apt-get update` only when the package lists do not know the packages yet.
    if ! apt-cache show slurmctld >/dev/null 2>&1; then
        apt-get update -qq
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return 0
    fi
    if [ ! -s /etc/munge/munge.key ]; then
        # The package normally creates the key; make one if it did not.
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    mkdir -p "$STATE"
    for _ in $(seq 50); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            # Ours: remembered so that `stop` leaves a munged it did not start alone.
            [ -s /run/munge/munged.pid ] && cp /run/munge/munged.pid "$STATE/munged.ours"
            return 0
        fi
        sleep 0.1
    done
    log "munged did not come up"; return 1
}

free_ports() {
    # N distinct TCP ports free on 127.0.0.1 right now (the kernel picks them).
    python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

write_conf() {
    local host cpus ports ctld_port p1 p2
    host=$(hostname -s)
    ports=$(free_ports 3)
    ctld_port=${SLURM_TEST_CTLD_PORT:-$(echo "$ports" | cut -d' ' -f1)}
    read -r p1 p2 <<<"${SLURM_TEST_NODE_PORTS:-$(echo "$ports" | cut -d' ' -f2-)}"
    # Each node claims every core of the host: the two "nodes" oversubscribe one machine.
    cpus=$(nproc)
    mkdir -p "$STATE"/{ctld,log,spool/n1,spool/n2}
    cat >"$CONF.tmp" <<EOF
# Written by tests/infra/slurm.sh: a single-host test cluster with two slurmd nodes.
ClusterName=pipeline-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# bf_interval=1: a held job (e.g. a requeue with a short StartTime) starts within a second, not 30.
SchedulerParameters=batch_sched_delay=0,bf_interval=1
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=30
MinJobAge=600
SlurmdTimeout=120
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p2 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

nodes_idle() {
    local out
    out=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    # Idle, or allocated/mixed by a test job: the node is up and answering.
    [ "$(printf '%s\n' "$out" | grep -cE '^n[12] (idle|alloc|mix)$')" -eq 2 ]
}

start() {
    local t0=$SECONDS
    install_packages
    start_munge
    if ! pid_alive "$STATE/slurmctld.pid"; then
        write_conf  # fresh each time the controller starts: picks up this script's current settings
        log "starting slurmctld"
        # -i: ignore stale state from a previous run of this script.
        slurmctld -f "$CONF" -i
    fi
    for n in n1 n2; do
        if ! pid_alive "$STATE/slurmd-$n.pid"; then
            log "starting slurmd -N $n"
            slurmd -f "$CONF" -N "$n"
        fi
    done
    for _ in $(seq 300); do
        if nodes_idle; then
            log "cluster up: n1 n2 idle after $((SECONDS - t0)) s (SLURM_CONF=$CONF)"
            return 0
        fi
        # A node that came back DOWN from an earlier run is returned to service.
        scontrol update NodeName=n1,n2 State=RESUME >/dev/null 2>&1 || true
        sleep 0.2
    done
    log "nodes did not become idle:"; sinfo -N >&2 || true
    tail -n 20 "$STATE"/log/*.log >&2 || true
    return 1
}

stop() {
    if [ -s "$CONF" ] && pid_alive "$STATE/slurmctld.pid"; then
        # Cancel first: stopping daemons under running jobs orphans slurmstepd processes.
        squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.2
        done
        scontrol shutdown >/dev/null 2>&1 || true
    fi
    for pidfile in "$STATE"/slurmd-n1.pid "$STATE"/slurmd-n2.pid "$STATE"/slurmctld.pid; do
        if pid_alive "$pidfile"; then
            local pid; pid=$(cat "$pidfile")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$pidfile"
    done
    # Only the munged this script started (same pid as when it started, still munged).
    if [ -s "$STATE/munged.ours" ]; then
        local mpid; mpid=$(cat "$STATE/munged.ours")
        if [ "$(cat /run/munge/munged.pid 2>/dev/null)" = "$mpid" ] && \
           [ "$(cat "/proc/$mpid/comm" 2>/dev/null)" = "munged" ]; then
            kill "$mpid" 2>/dev/null || true
            rm -f /run/munge/munged.pid
        fi
        rm -f "$STATE/munged.ours"
    fi
    log "stopped"
}

status() {
    [ -s "$CONF" ] || { log "not configured ($CONF missing)"; return 1; }
    sinfo -N -o '%N %t %c %P' || return 1
    nodes_idle
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
