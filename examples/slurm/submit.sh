#!/bin/bash
# Submit the shards, then the merge once they have all ended (afterany: the merge itself says
# which shard is missing, rather than never running).
#
#   REQUESTS=requests.jsonl MODEL=/ckpt/model ./examples/slurm/submit.sh 4
#
# REQUESTS and OUT are taken relative to where you run this, and passed on as absolute paths
# (the jobs start in this script's folder).
set -euo pipefail
REQUESTS=$(realpath "${REQUESTS:-requests.jsonl}")
OUT=$(realpath -m "${OUT:-out}")
if [ ! -f "$REQUESTS" ]; then
    echo "submit.sh: no request file $REQUESTS (set REQUESTS=...)" >&2
    exit 2
fi
export REQUESTS OUT
cd "$(dirname "$0")"
shards=${1:-4}
mkdir -p logs
job=$(sbatch --parsable --export=ALL --array="0-$((shards - 1))" run_shards.sbatch)
sbatch --export=ALL --dependency="afterany:${job%%;*}" merge.sbatch
