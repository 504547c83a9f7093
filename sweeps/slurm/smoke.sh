#!/usr/bin/env bash
# `make slurm-smoke`: the CPU smoke sweep (+experiment=smoke) through Hydra's submitit launcher
# (hydra/launcher=slurm) on a real single-node SLURM cluster started here (sweeps/slurm/cluster.sh):
#   1. submit the sweep; rows land in $OUT/res/smoke.jsonl as the SLURM jobs finish;
#   2. scancel one job while its run is in progress; the sweep ends, the cancelled config has no row and no
#      other row is lost, cut or duplicated;
#   3. submit the same sweep again: it skips every key already done and runs only the cancelled one.
# Exit 0 when all three hold; 3 (one line) where SLURM cannot start; 1 when a check fails.
#
#   SLURM_SMOKE_ARGS   overrides for the sweep (default: the whole smoke grid, 18 configs)
#   SLURM_SMOKE_OUT    where rows, Hydra's and submitit's folders go (default: a fresh temp dir)
#   SLURM_SMOKE_CPUS, SLURM_SMOKE_PARALLEL   CPUs per job (1), jobs at once (4)
#   PYTHON             the harness venv's python (default .venv/bin/python)
set -euo pipefail
shopt -s extglob

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
OUT=${SLURM_SMOKE_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/grpo-vram-slurm-smoke.XXXXXX")}
read -r -a EXTRA <<< "${SLURM_SMOKE_ARGS:-}"
CPUS=${SLURM_SMOKE_CPUS:-1}          # CPUs per SLURM job
PARALLEL=${SLURM_SMOKE_PARALLEL:-4}  # SLURM jobs at once (as many as the node's CPUs allow)

eval "$(bash "$REPO/sweeps/slurm/cluster.sh" start)"   # exports SLURM_CONF, or exits 3 with its reason
mkdir -p "$OUT"
RESULTS=$OUT/res/smoke.jsonl
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1

sweep() {  # $1: hydra.sweep.dir
  "$PYTHON" -m sweeps.runner.app --multirun +experiment=smoke "${EXTRA[@]}" \
    hydra/launcher=slurm hydra.launcher.partition=local hydra.launcher.gpus_per_node=null \
    hydra.launcher.cpus_per_task="$CPUS" hydra.launcher.mem_gb=4 hydra.launcher.timeout_min=30 \
    hydra.launcher.array_parallelism="$PARALLEL" \
    sweep.results_dir="$OUT/res" hydra.sweep.dir="$1" 2>&1 \
    | grep -v -e 'Bypassing sacct error' -e 'Slurm accounting storage is disabled'
}

rows() {  # every line must be a whole row; prints "<lines> lines, <unique keys> keys" and the rows
  "$PYTHON" - "$RESULTS" <<'PY'
import collections, json, sys
lines = open(sys.argv[1]).read().splitlines() if __import__("os").path.exists(sys.argv[1]) else []
rows = [json.loads(line) for line in lines]  # a cut line would raise here
keys = collections.Counter(r["key"] for r in rows)
print(f"{len(lines)} lines, {len(keys)} keys, duplicates: {sorted(k for k, n in keys.items() if n > 1) or 'none'}")
for r in rows:
    c = r["config"]
    peak = (r.get("observed") or {}).get("peak_bytes")
    print(f"  {r['status']:5} {r['key']} {c['model']:9} peft={c['use_peft']!s:5} 4bit={c['load_in_4bit']!s:5} "
          f"gc={c['gradient_checkpointing']!s:5} peak={peak / 2**20 if peak else 0:8.1f} MiB  {r['wall_seconds']:6.1f} s")
PY
}

echo "== $(date -u +%FT%TZ) cluster: $(sinfo -h -o '%P %D node(s) %c CPUs %T' | head -1), SLURM $(sinfo -V | cut -d' ' -f2)"
echo "== 1. submit the smoke sweep (${SLURM_SMOKE_ARGS:-whole grid}); rows -> $RESULTS"
sweep "$OUT/hydra-1" > "$OUT/sweep-1.log" &
SWEEP=$!

# 2. wait for the first row, then cancel a job that is running a config with no row yet
for _ in $(seq 600); do [[ -s $RESULTS ]] && break; sleep 1; done
[[ -s $RESULTS ]] || { echo "no row landed in 10 minutes"; cat "$OUT/sweep-1.log"; exit 1; }
echo "first row landed: $(wc -l < "$RESULTS") row(s) so far"
# the victim: a job started after the first row landed (so not the one that wrote it, which may still be
# exiting) whose run has begun (its child's log, <hydra sweep dir>/<array task>/run.log, exists: a SLURM array
# task is the Hydra job of the same number) and whose row is not written yet
earlier=" $(squeue -h -t R -o %i | tr '\n' ' ') "
victim=""
for _ in $(seq 600); do
  for id in $(squeue -h -t R -o %i); do
    [[ $earlier == *" $id "* || ! -e $OUT/hydra-1/${id#*_}/run.log ]] && continue
    victim=$id
    break
  done
  [[ -n $victim ]] && break
  sleep 0.5
done
sleep 2  # into the run (a row takes 7 s or more here)
[[ -n $victim ]] || { echo "no job ran long enough to cancel mid-run"; wait $SWEEP; exit 1; }
echo "== 2. scancel $victim (running $(squeue -h -j "$victim" -o %M) s) while its run is in progress"
before=$(wc -l < "$RESULTS")
scancel "$victim"
wait $SWEEP && rc=0 || rc=$?
echo "sweep 1 exit status: $rc; its output:"
sed 's/^/  | /' "$OUT/sweep-1.log" | grep -v -e '^  | \[.*\]\[HYDRA\] *#' | tail -n 40
echo "the cancelled job's log:"
cancelled=$(cat "$OUT"/hydra-1/.submitit/"$victim"/*_log.err 2>/dev/null | grep -e grpo-vram-sweep -e Traceback || true)
echo "${cancelled:-(nothing)}" | sed 's/^/  | /'
echo "rows after sweep 1 ($before before the scancel):"
rows
n1=$(wc -l < "$RESULTS")

echo "== 3. the same sweep again: done keys are skipped, the cancelled config runs"
sweep "$OUT/hydra-2" > "$OUT/sweep-2.log" && rc=0 || rc=$?
echo "sweep 2 exit status: $rc"
cat "$OUT"/hydra-2/.submitit/*/*_log.out 2>/dev/null | grep -e '^skip ' -e '^ok ' -e '^oom ' -e '^error ' \
  | awk '{print $1}' | sort | uniq -c | awk '{print "  " $2 ": " $1 " job(s)"}'
rows
n2=$(wc -l < "$RESULTS")
leftover=$(ls -A "$OUT/res" | grep -v '^smoke.jsonl$' || true)
echo "left beside the results: ${leftover:-nothing}"
keys=$("$PYTHON" -c "import json,sys; r=[json.loads(l)['key'] for l in open(sys.argv[1])]; print(len(r)-len(set(r)))" "$RESULTS")
if (( n2 > n1 )) && [[ $keys == 0 && -z $leftover && $cancelled == *"no row for it"* ]]; then
  echo "== PASS: rows landed, the scancel lost nothing (no cut or duplicate row), the rerun resumed ($n1 -> $n2 rows)"
else
  echo "== FAIL: $n1 -> $n2 rows, $keys duplicate key(s), left: ${leftover:-nothing}, cancelled job said: ${cancelled:-nothing}"
  exit 1
fi
