#!/usr/bin/env bash
# make demo: a local controller (SQLite, WAL) and two agents presenting a DGX A100 and a DGX-1V, a real
# 2-node job run end to end, then everything stopped again.
set -euo pipefail

STATE_DIR=$(mktemp -d /tmp/garrison-demo.XXXXXX)
cleanup() { garrison down --state-dir "$STATE_DIR" || true; }
trap cleanup EXIT

echo "== garrison up --state-dir $STATE_DIR --fake-topology dgx-a100 --fake-topology dgx1v"
eval "$(garrison up --state-dir "$STATE_DIR" --fake-topology dgx-a100 --fake-topology dgx1v)"
echo "GARRISON_CONTROLLER=$GARRISON_CONTROLLER"

echo "== ginfo"
ginfo
echo "== ginfo --topology node2"
ginfo --topology node2

echo "== gsub: 2 nodes x 2 GPUs, one rank per GPU (--launch rank; a batch script alone runs once, as with sbatch)"
JOB=$(gsub --parsable -J demo -N 2 --gpus-per-node 2 --launch rank -t 1:00 -o "$STATE_DIR/demo-%j.out" \
  --wrap 'echo "rank $RANK/$WORLD_SIZE on $GARRISON_NODENAME local_rank=$LOCAL_RANK CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR:$MASTER_PORT"; sleep 1')
echo "submitted job $JOB"

echo "== gqueue"
gqueue

echo "== waiting for job $JOB"
STATE=$(gjob --wait "$JOB" --timeout 120)
echo "job $JOB finished: $STATE"

echo "== output of job $JOB"
sort "$STATE_DIR/demo-$JOB.out"

echo "== gjob $JOB"
gjob "$JOB"

[ "$STATE" = "COMPLETED" ]
