#!/usr/bin/env bash
# Side by side in one run: Slurm (Debian's slurm-wlm with fake GPUs, ../shared/slurm-anchor) and Garrison,
# the same trivial one-GPU jobs on the same 4 x 8 fake GPUs, on this machine, taking turns.
#   bash tests/benchmarks/compare_slurm.sh [N] [ROUNDS]   (needs ../shared/slurm-anchor)
# Each round runs Slurm (N jobs one by one, then as one array) and then Garrison (the same), each with the
# other stopped. Run-to-run noise on a shared 2-core machine is 10-20%, so the summary at the end gives each
# figure's median over the rounds and Garrison's throughput as a multiple of Slurm's.
set -euo pipefail
N=${1:-1000}
ROUNDS=${2:-3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ANCHOR=${ANCHOR:-$HERE/../shared/slurm-anchor}
[ -x "$ANCHOR/bench.sh" ] || { echo "no slurm-anchor at $ANCHOR" >&2; exit 1; }
LOG=$(mktemp /tmp/compare-slurm-XXXXXX.log)

for round in $(seq "$ROUNDS"); do
  "$ANCHOR/setup.sh" >/dev/null
  echo "== round $round: slurm"
  "$ANCHOR/bench.sh" "$N" seq | sed "s/^/r${round}_slurm_seq_/"
  "$ANCHOR/bench.sh" "$N" array | sed "s/^/r${round}_slurm_array_/"
  if [ "$round" = 1 ]; then
    "$ANCHOR/bench.sh" 20 lat | sed 's/^/r1_slurm_idle_/'
    (
      . "$ANCHOR/env.sh"
      t0=$(date +%s%N); for _ in $(seq 20); do squeue >/dev/null; done; t1=$(date +%s%N)
      echo "r1_slurm_squeue_wall_ms_mean: $(( (t1 - t0) / 20000000 ))"
    )
  fi
  "$ANCHOR/stop.sh" >/dev/null 2>&1 || true
  echo "== round $round: garrison"
  if [ "$round" = 1 ]; then extra=(); else extra=(--cli-calls 0 --idle-jobs 0); fi
  "$HERE/.venv/bin/python" "$HERE/tests/benchmarks/e2e_throughput.py" --jobs "$N" "${extra[@]}" \
    | sed "s/^/r${round}_garrison_/"
done | tee "$LOG"

"$HERE/.venv/bin/python" - "$LOG" "$N" <<'EOF'
import re, statistics, sys
log, n = sys.argv[1], sys.argv[2]
figures: dict[str, list[float]] = {}
for line in open(log):
    match = re.match(r"r\d+_(\w+): ([0-9.]+)\s*$", line)
    if match:
        figures.setdefault(match[1], []).append(float(match[2]))
def median(key: str) -> float:
    return statistics.median(figures[key])
print(f"== summary: medians over the rounds")
for mode, ours in (("seq", f"garrison_seq_{n}_throughput_jobs_per_s"),
                   ("array", f"garrison_array_{n}_throughput_jobs_per_s")):
    theirs = f"slurm_{mode}_throughput_jobs_per_s"
    if theirs in figures and ours in figures:
        print(f"slurm_{mode}_jobs_per_s: {median(theirs):.1f}  (rounds: {', '.join(f'{v:.1f}' for v in figures[theirs])})")
        print(f"garrison_{mode}_jobs_per_s: {median(ours):.1f}  (rounds: {', '.join(f'{v:.1f}' for v in figures[ours])})")
        print(f"garrison_over_slurm_{mode}: {median(ours) / median(theirs):.2f}x")
EOF
