#!/usr/bin/env bash
# A run directory that one host does not share, as on a node-local disk.
#
#   private_run_dir.sh HOST FOLDER RUN_DIR COMMAND...
#
# On HOST, COMMAND runs in a mount namespace of its own where FOLDER is an empty tmpfs holding an
# empty RUN_DIR: that host sees a directory of the same name that no other host sees. Elsewhere
# COMMAND runs as it is. The tmpfs goes with the namespace when COMMAND ends.
set -euo pipefail
host=$1 folder=$2 run_dir=$3
shift 3
if [ "$(hostname)" != "$host" ]; then
  exec "$@"
fi
exec unshare --mount --propagation private -- bash -c \
  'mount -t tmpfs hpcmarl-private "$1" && mkdir -p "$2" && shift 2 && exec "$@"' \
  _ "$folder" "$run_dir" "$@"
