#!/usr/bin/env bash
# The "ssh" through which Open MPI starts its daemons on the hosts of tools/local_cluster.sh
# (`mpirun --prtemca plm_ssh_agent tools/cluster_agent.sh`, which tools/mpirun.sh --hosts
# passes). Called as ssh is: `cluster_agent.sh [ssh options] HOST COMMAND...`; the options are
# dropped, and COMMAND, a shell command line as ssh would hand to the remote shell, runs in
# HOST's network and UTS namespaces. nsenter execs in place, so the environment (PATH, the
# virtualenv, OMPI_* and PYTHONPATH) and the working folder carry over as they are; the hosts
# share the filesystem.
#
#   cluster_agent.sh --exec HOST PROGRAM ARGS...   runs PROGRAM with ARGS exactly, not through
#                                                   a shell (how tools/mpirun.sh enters host 1)
set -euo pipefail

STATE=${HPCMARL_CLUSTER_DIR:-/run/hpcmarl-cluster}
die() {
  echo "cluster_agent: error: $*" >&2
  exit 255 # what ssh returns when it cannot connect
}

exact=false
if [ "${1:-}" = --exec ]; then
  exact=true
  shift
fi
# ssh options: flags alone (-x, -T, -q) or with a value (-o X, -p 22, -l user, -i key).
while [[ "${1:-}" == -* ]]; do
  case "$1" in
    -[bcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    *) shift ;;
  esac
done
host=${1:-}
[ -n "$host" ] || die "no host named (usage: cluster_agent.sh [ssh options] HOST COMMAND...)"
shift

holder=""
if [ -s "$STATE/hosts" ]; then
  holder=$(awk -v h="$host" '$1 == h || $2 == h { print $3 }' "$STATE/hosts")
fi
[ -n "$holder" ] || die "$host is not a host of the local cluster ($STATE/hosts): tools/local_cluster.sh status"
kill -0 "$holder" 2>/dev/null || die "$host's holder (PID $holder) is gone: tools/local_cluster.sh up N again"

if $exact; then
  exec nsenter -t "$holder" -n -u -- "$@"
fi
exec nsenter -t "$holder" -n -u -- bash -c "$*"
