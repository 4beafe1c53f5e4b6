#!/usr/bin/env bash
# Side by side in one run: Slurm (Debian's slurm-wlm with fake GPUs, ../shared/slurm-anchor) and Garrison,
# the same trivial one-GPU jobs on the same 4 x 8 fake GPUs, on this machine, one after the other.
#   bash tests/benchmarks/compare_slurm.sh [N]      (needs ../shared/slurm-anchor; run its setup.sh first)
set -euo pipefail
N=${1:-500}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ANCHOR=${ANCHOR:-$HERE/../shared/slurm-anchor}
[ -x "$ANCHOR/bench.sh" ] || { echo "no slurm-anchor at $ANCHOR" >&2; exit 1; }
"$ANCHOR/setup.sh" >/dev/null
echo "== slurm seq $N"; "$ANCHOR/bench.sh" "$N" seq | sed 's/^/slurm_seq_/'
echo "== slurm array $N"; "$ANCHOR/bench.sh" "$N" array | sed 's/^/slurm_array_/'
echo "== slurm lat 20"; "$ANCHOR/bench.sh" 20 lat | sed 's/^/slurm_idle_/'
. "$ANCHOR/env.sh"
t0=$(date +%s%N); for _ in $(seq 20); do squeue >/dev/null; done; t1=$(date +%s%N)
echo "slurm_squeue_wall_ms_mean: $(( (t1 - t0) / 20000000 ))"
"$ANCHOR/stop.sh" >/dev/null 2>&1 || true
echo "== garrison $N"
"$HERE/.venv/bin/python" "$HERE/tests/benchmarks/e2e_throughput.py" --jobs "$N" | sed 's/^/garrison_/'
