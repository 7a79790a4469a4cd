#!/usr/bin/env bash
# `tools/mpirun.sh --hosts N ARGS...`: mpirun across the first N hosts of tools/local_cluster.sh.
#
# Ranks are placed in blocks, as a batch system places them: -n R over N hosts gives each host
# ceil(R/N) slots (--host hpc1:S,...,hpcN:S), so ranks 0..S-1 run on hpc1, the next S on hpc2;
# pass `--map-by node` for round robin. Open MPI starts its daemons on the other hosts through
# tools/cluster_agent.sh as its "ssh", and talks TCP over the cluster's bridge only; with MPICH
# (HPCMARL_VENV=.venv-site or .venv-mpich), Hydra's mpiexec gets `-hosts` and `-launcher-exec`
# (the same agent) instead, and picks the bridge itself (the hosts have no other). mpirun
# itself runs inside the first host, as it would on a batch job's first node: this runs
# tools/mpirun.sh again there (root, --oversubscribe and signal relaying as on one host).
#
# Measured with Open MPI 5.0.11: mpirun.sh's --oversubscribe alone mapped all 4 ranks of
# `--host hpc1:2,hpc2:2` onto hpc1, hence --map-by slot; and with slots given no host counts as
# oversubscribed, so ranks would busy-poll the shared cores while they wait, hence
# mpi_yield_when_idle (what Open MPI sets by itself on an oversubscribed host).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
STATE=${HPCMARL_CLUSTER_DIR:-/run/hpcmarl-cluster}
die() {
  echo "hpcmarl-mpirun: error: $*" >&2
  exit 2
}

count=${1:-}
[[ "$count" =~ ^[1-9][0-9]*$ ]] || die "--hosts needs a host count: tools/mpirun.sh --hosts 2 -n 8 ..."
shift
[ -s "$STATE/hosts" ] || die "no local cluster is up: tools/local_cluster.sh up $count"
mapfile -t hosts < <(awk '{ print $1 }' "$STATE/hosts")
[ "${#hosts[@]}" -ge "$count" ] ||
  die "$count hosts asked, ${#hosts[@]} up: tools/local_cluster.sh up $count"
venv=${HPCMARL_VENV:-$root/.venv}
mpirun=$venv/bin/mpirun
[ -x "$mpirun" ] || mpirun=$(command -v mpirun)
version=$("$mpirun" --version 2>&1 || true)
open_mpi=true
if [[ "$version" != *"Open MPI"* ]]; then
  [[ "$version" == *HYDRA* ]] ||
    die "--hosts needs Open MPI's mpirun or MPICH's mpiexec (Hydra); $mpirun is neither"
  open_mpi=false
fi

# The rank count, as mpirun reads it (without one, one rank per host), the user's mapping, and
# the arguments without it (Hydra has no --map-by).
ranks=""
mapping=(--map-by slot)
round_robin=false
args=("$@")
unmapped=()
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    -n | -np | --n | --np | -c) [ -n "$ranks" ] || ranks=${args[i + 1]:-} ;;
  esac
  case "${args[i]}" in
    --map-by | --map-by=*)
      mapping=()
      policy=${args[i]#--map-by=}
      if [ "${args[i]}" = --map-by ]; then
        i=$((i + 1))
        policy=${args[i]:-}
      fi
      [ "$policy" != node ] || round_robin=true
      ;;
    *) unmapped+=("${args[i]}") ;;
  esac
done
slots=1
[ -z "$ranks" ] || slots=$(((ranks + count - 1) / count))

host_list=""
for name in "${hosts[@]:0:count}"; do
  host_list+="${host_list:+,}$name:$slots"
done
subnet=$(awk 'NR == 1 { sub(/\.[0-9]+$/, ".0/24", $2); print $2 }' "$STATE/hosts")

if ! $open_mpi; then
  # MPICH's Hydra starts its proxies through the agent as through ssh; hosts of one slot each
  # are filled round robin, of S slots in blocks. Its own options only: --map-by goes.
  $round_robin && host_list=$(printf '%s:1,' "${hosts[@]:0:count}") && host_list=${host_list%,}
  exec bash "$root/tools/cluster_agent.sh" --exec "${hosts[0]}" bash "$root/tools/mpirun.sh" \
    -launcher ssh -launcher-exec "$root/tools/cluster_agent.sh" -hosts "$host_list" \
    "${unmapped[@]}"
fi
exec bash "$root/tools/cluster_agent.sh" --exec "${hosts[0]}" bash "$root/tools/mpirun.sh" \
  --host "$host_list" \
  --prtemca plm_ssh_agent "$root/tools/cluster_agent.sh" \
  --prtemca oob_tcp_if_include "$subnet" \
  --mca btl_tcp_if_include "$subnet" \
  --mca mpi_yield_when_idle 1 \
  "${mapping[@]}" "$@"
