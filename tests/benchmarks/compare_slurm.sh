#!/usr/bin/env bash
# Side by side in one run: Slurm (Debian's slurm-wlm with fake GPUs, ../shared/slurm-anchor) and Garrison,
# the same trivial one-GPU jobs on the same 4 x 8 fake GPUs, on this machine, taking turns.
#   bash tests/benchmarks/compare_slurm.sh [N] [ROUNDS]   (needs ../shared/slurm-anchor)
#   WRITE_DOCS=1 bash tests/benchmarks/compare_slurm.sh ...  also rewrites docs/performance.md's table (between
#   its compare_slurm markers) from this run
# Like with like:
#   cli_loop:  a shell loop of N `sbatch` calls         against a shell loop of N `gsub` calls
#   library:   Slurm's default way in (the sbatch loop) against N submissions through Garrison's client library
#   array:     one `sbatch --array=1-N`                 against one `gsub --array` (the library's array call)
#   gsub/gjob/gqueue: `sbatch`, `scontrol show job ID`, `squeue` against `gsub`, `gjob ID`, `gqueue`, as
#              fresh processes timed by the same code (tests/benchmarks/cli_latency.py)
# Each round runs Slurm and then Garrison, each with the other stopped. Run-to-run noise on a shared 2-core
# machine is 10-20%, so the summary gives each figure's median over the rounds, its spread (min-max), and
# Garrison's figure as a multiple of Slurm's (`*_ratio`: above 1 is Garrison faster).
set -euo pipefail
N=${1:-1000}
ROUNDS=${2:-3}
CALLS=${CLI_CALLS:-20}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
ANCHOR=${ANCHOR:-$HERE/../shared/slurm-anchor}
PY=${PY:-$HERE/.venv/bin/python}  # PY=other/venv/bin/python: that venv's interpreter and launchers
TIMER="$HERE/tests/benchmarks/cli_latency.py"
[ -x "$ANCHOR/bench.sh" ] || { echo "no slurm-anchor at $ANCHOR" >&2; exit 1; }
LOG=$(mktemp /tmp/compare-slurm-XXXXXX.log)

slurm_cli_latency() {  # sbatch, scontrol show job, squeue: as cli_latency.py times gsub, gjob, gqueue
  (
    . "$ANCHOR/env.sh"
    dir=$(mktemp -d /tmp/compare-slurm-cli-XXXXXX)
    cd "$dir"
    "$PY" "$TIMER" sbatch "$CALLS" -- sbatch --parsable --gres=gpu:1 -n1 -o /dev/null --wrap true
    id=$(sbatch --parsable --gres=gpu:1 -n1 -o /dev/null --wrap true)
    for _ in $(seq 300); do [ -z "$(squeue -h -j "$id" -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    "$PY" "$TIMER" scontrol_show_job "$CALLS" -- scontrol show job "$id"
    "$PY" "$TIMER" squeue "$CALLS" -- squeue
  )
}

for round in $(seq "$ROUNDS"); do
  "$ANCHOR/setup.sh" >/dev/null
  echo "== round $round: slurm"
  "$ANCHOR/bench.sh" "$N" seq | sed "s/^/r${round}_slurm_seq_/"
  "$ANCHOR/bench.sh" "$N" array | sed "s/^/r${round}_slurm_array_/"
  slurm_cli_latency | sed "s/^/r${round}_slurm_/"
  if [ "$round" = 1 ]; then
    "$ANCHOR/bench.sh" 20 lat | sed 's/^/r1_slurm_idle_/'
  fi
  "$ANCHOR/stop.sh" >/dev/null 2>&1 || true
  echo "== round $round: garrison"
  if [ "$round" = 1 ]; then extra=(); else extra=(--idle-jobs 0); fi
  CLI_CALLS=$CALLS "$PY" "$HERE/tests/benchmarks/e2e_throughput.py" --jobs "$N" --cli-calls "$CALLS" "${extra[@]}" \
    | sed "s/^/r${round}_garrison_/"
done | tee "$LOG"

"$PY" - "$LOG" "$N" "${WRITE_DOCS:-}" "$HERE/docs/performance.md" <<'EOF'
import datetime, re, statistics, sys
log, n, write_docs, docs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
table: list[str] = []
figures: dict[str, list[float]] = {}
for line in open(log):
    match = re.match(r"r\d+_(\w+): ([0-9.]+)\s*$", line)
    if match:
        figures.setdefault(match[1], []).append(float(match[2]))
rounds = max((len(values) for values in figures.values()), default=0)
print("== summary: medians over the rounds, (min-max), and Garrison as a multiple of Slurm")
print(f"rounds: {rounds}")
print(f"jobs_per_round: {n}")

def show(name: str, key: str, unit: str) -> float | None:
    values = figures.get(key)
    if not values:
        print(f"{name}: n/a (no {key} in the log)")
        return None
    print(f"{name}: {statistics.median(values):.1f}  ({min(values):.1f}-{max(values):.1f} {unit})")
    return statistics.median(values)

def cell(key: str) -> str:
    values = figures.get(key)
    if not values:
        return "n/a"
    return f"{statistics.median(values):.1f}" + (f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else "")

# Throughput, jobs/s end to end: higher is better, ratio = Garrison / Slurm.
for name, ours, theirs in (
    ("cli_loop", f"garrison_cli_{n}_throughput_jobs_per_s", "slurm_seq_throughput_jobs_per_s"),
    ("library", f"garrison_library_{n}_throughput_jobs_per_s", "slurm_seq_throughput_jobs_per_s"),
    ("array", f"garrison_array_{n}_throughput_jobs_per_s", "slurm_array_throughput_jobs_per_s"),
):
    slurm = show(f"slurm_{name}_jobs_per_s", theirs, "jobs/s")
    garrison = show(f"garrison_{name}_jobs_per_s", ours, "jobs/s")
    ratio = f"{garrison / slurm:.2f}x" if slurm and garrison else "n/a"
    if slurm and garrison:
        print(f"{name}_ratio: {garrison / slurm:.2f}")
    table.append(f"| {name}: jobs/s end to end ({'sbatch loop' if name != 'array' else 'array'} for Slurm) "
                 f"| {cell(theirs)} | {cell(ours)} | {ratio} |")
# One command as a user runs it, ms: lower is better, ratio = Slurm / Garrison (above 1: Garrison faster).
for ours, theirs in (("gsub", "sbatch"), ("gjob", "scontrol_show_job"), ("gqueue", "squeue")):
    slurm = show(f"{theirs}_median_ms", f"slurm_{theirs}_wall_ms_median", "ms")
    garrison = show(f"{ours}_median_ms", f"garrison_{ours}_wall_ms_median", "ms")
    show(f"{theirs}_cpu_ms", f"slurm_{theirs}_cpu_ms_median", "ms")
    show(f"{ours}_cpu_ms", f"garrison_{ours}_cpu_ms_median", "ms")
    if slurm and garrison:
        print(f"{ours}_ratio: {slurm / garrison:.2f}")
    table.append(f"| `{theirs.replace('_', ' ')}` / `{ours}`: wall ms (CPU ms) | {cell(f'slurm_{theirs}_wall_ms_median')} "
                 f"({cell(f'slurm_{theirs}_cpu_ms_median')}) | {cell(f'garrison_{ours}_wall_ms_median')} "
                 f"({cell(f'garrison_{ours}_cpu_ms_median')}) | "
                 f"{f'{slurm / garrison:.2f}x' if slurm and garrison else 'n/a'} faster |")
show("slurm_idle_submit_to_start_median_s", "slurm_idle_latency_script_median_s", "s")
show("garrison_idle_submit_to_start_median_ms", "garrison_idle_submit_to_start_median_ms", "ms")
table.append(f"| idle submit-to-start, median | {cell('slurm_idle_latency_script_median_s')} s | "
             f"{cell('garrison_idle_submit_to_start_median_ms')} ms | |")
markdown = "\n".join([
    f"`compare_slurm.sh {n} {rounds}` on {datetime.date.today()}: medians over {rounds} rounds (min-max).",
    "",
    "| | Slurm 22.05 | Garrison | Garrison's multiple |",
    "|---|---|---|---|",
    *table,
])
print(markdown)
if write_docs:
    begin, end = "<!-- compare_slurm:begin -->", "<!-- compare_slurm:end -->"
    text = open(docs).read()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        open(docs, "w").write(head + begin + "\n" + markdown + "\n" + end + rest.split(end, 1)[1])
        print(f"wrote the table into {docs}")
    else:
        print(f"{docs} has no {begin} ... {end} block: not written", file=sys.stderr)
EOF
