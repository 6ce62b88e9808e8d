#!/bin/bash
# Submit the shards, then the merge once they have all ended (afterany: the merge itself says
# which shard is missing, rather than never running).
#
#   REQUESTS=requests.jsonl MODEL=/ckpt/model ./submit.sh 4
set -euo pipefail
cd "$(dirname "$0")"
shards=${1:-4}
mkdir -p logs
job=$(sbatch --parsable --export=ALL --array="0-$((shards - 1))" run_shards.sbatch)
sbatch --export=ALL --dependency="afterany:${job%%;*}" merge.sbatch
