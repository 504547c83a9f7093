#!/usr/bin/env bash
# One call of a GPU lease (docs/gpu-lease.md): the carried wheels installed beside the machine's own torch, the stack
# checked in one line, the stages run so that they end by themselves inside the call's limit, then everything they
# measured packed into $OUT (tarballs of repo-relative paths: unpack them at the repo root, `tar xzf`).
#
# Usage, at the repo root of the lent machine:  bash sweeps/lease/call.sh STAGE[+STAGE...] [SECONDS]
#   mincard   the min-card lineup (grpo-vram-mincard): each configuration's smallest torch limit; its baseline run
#             (resumed without a stream: its largest passing limit once more) records torch's own allocator stream
#             (the history probe) and the host probe
#   zero      DeepSpeed ZeRO-2/3 with CPU offload (+experiment=zero-offload), after building DeepSpeed's CPU Adam op,
#             with torch's allocator history (the reserve above DeepSpeed's tensors has no traced stream to learn from)
#   validate  the gpu-validate rows never measured (r10 r13 r14 r15), r15 (a tied full fine-tune) with the history
#             probe, with and without cast_lm_head_to_fp32
# Stages joined by + run at once, each in its own processes, to the same deadline: the card and the host are big
# enough for the min-card searches beside one other stage, and a lease is short. Beside another stage the min-card
# searches leave MINCARD_LEAVE_GIB (default 40) of the card to it: the largest zero or validate row is estimated at
# 18 and 35 GiB allocated. Every measured figure is per process (torch's counters, NVML's per-process bytes, the
# process's RSS), so a stage beside another measures the same; a min-card run failed by the card filling up rather
# than by its limit bounds nothing (sweeps/mincard/trials.py), and a search that fits nowhere in its share stays open.
# SECONDS (default 540) is the call's whole budget, install and packing included; the call's limit is 600.
# PYTHON (default python3) and MINCARD_ARGS, ZERO_ARGS, VALIDATE_ARGS (appended to each stage's command) let a CPU
# machine rehearse a stage.
set -uo pipefail
stages=${1:-}
budget=${2:-540}
py=${PYTHON:-python3}
out=${OUT:-outputs/lease}
start=$SECONDS
IFS=+ read -ra list <<<"$stages"
seen=+
for stage in "${list[@]}"; do
  case $stage in mincard | zero | validate) ;; *)
    echo "call.sh: stage '${stage:0:40}': accepted stages are mincard, zero, validate, or several joined by + (mincard+zero)" >&2
    exit 2
    ;;
  esac
  case $seen in *"+$stage+"*)
    echo "call.sh: stage '${stage:0:40}' is named twice in '${stages:0:60}'; accepted: each stage once" >&2
    exit 2
    ;;
  esac
  seen+="$stage+"
done
if [ ${#list[@]} -eq 0 ]; then
  echo "call.sh: stage '': accepted stages are mincard, zero, validate, or several joined by + (mincard+zero)" >&2
  exit 2
fi
case $budget in '' | *[!0-9]*)
  echo "call.sh: SECONDS '${budget:0:40}': accepted values are whole seconds" >&2
  exit 2
  ;;
esac
mkdir -p "$out"
left() { echo $((budget - (SECONDS - start))); }

if compgen -G ".whl/*.whl" >/dev/null; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    { echo "call.sh: the wheels in .whl/ did not install" >&2; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
$py - <<'EOF' | tee "$out/stack.txt"
import importlib, platform, subprocess, torch
names = ("transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes", "hydra", "deepspeed")
found = []
for n in names:
    try:
        found.append(f"{n} {importlib.import_module(n).__version__}")
    except Exception as exc:  # a missing package is named, the stages that need it fail on their own
        found.append(f"{n} missing ({type(exc).__name__})")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.strip() if torch.cuda.is_available() else "-"
print(f"stack: Python {platform.python_version()}, torch {torch.__version__}, {gpu}, driver {driver}; " + ", ".join(found))
EOF

sweep() { $py -c 'from sweeps.runner.app import main; main()' "$@"; }
reserve=40 # seconds kept for packing
leave=0
if [ ${#list[@]} -gt 1 ]; then leave=${MINCARD_LEAVE_GIB:-40}; fi

run_stage() {
  case $1 in
  mincard)
    # shellcheck disable=SC2086
    # k=2 limits per round: with 8 configurations searched at once the card's 6 slots are full anyway, and fewer
    # runs per search (about 7 instead of 13 to reach 1.5 %) finish more searches inside the lease
    $py -m sweeps.mincard.cli --budget-s "$(($(left) - reserve))" --k 2 --leave-gib "$leave" \
      --baseline-probes history,host ${MINCARD_ARGS:-}
    # the summary only: results/MINCARD.md is written here by `make tables` (with the lineup's forecast)
    if [ -s results/raw/mincard.jsonl ]; then $py -m sweeps.report.mincard; fi
    ;;
  zero)
    $py -c 'import torch; from deepspeed.ops.adam import DeepSpeedCPUAdam; DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))])' ||
      echo "call.sh: DeepSpeed's CPU Adam op did not build; the rows record why" >&2
    # shellcheck disable=SC2086
    timeout --signal=TERM "$(($(left) - reserve))" \
      bash -c "$(declare -f sweep); py=$py; sweep --multirun +experiment=zero-offload probe=history ${ZERO_ARGS:-}"
    ;;
  validate)
    # shellcheck disable=SC2086
    timeout --signal=TERM "$(($(left) - reserve))" bash -c "$(declare -f sweep); py=$py;
      sweep --multirun +experiment=gpu-validate validate_row=r15 trainer.cast_lm_head_to_fp32=true,false probe=history ${VALIDATE_ARGS:-};
      sweep --multirun +experiment=gpu-validate validate_row=r10,r13,r14 ${VALIDATE_ARGS:-}"
    ;;
  esac
}

# each stage's lines carry its name (the call returns one interleaved tail); the call waits for every stage
pids=()
for stage in "${list[@]}"; do
  if [ ${#list[@]} -gt 1 ]; then
    run_stage "$stage" 2>&1 | sed -u "s/^/[$stage] /" &
  else
    run_stage "$stage" &
  fi
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "call.sh: $stages ran $((SECONDS - start)) s of $budget"
$py -m sweeps.lease.pack "$out"
