#!/usr/bin/env bash
# The wheels a bare GPU machine without internet needs to run the GPU measurements (make gpu-validate,
# gpu-mincard, gpu-zero), for the image described in docs/gpu-lease.md: Python 3.12, x86-64, torch's CUDA build,
# accelerate, psutil, ninja, numpy, pandas, pyarrow, xxhash, fsspec, huggingface_hub and tokenizers already there.
# Downloads the lock's versions of what is missing into $1 (default .whl/), builds the source-only ones (antlr4,
# DeepSpeed with no ops prebuilt: they are built on the machine with its nvcc), and keeps only the one CUDA
# library of bitsandbytes the machine's torch uses (LEASE_CUDA, default 130) and transformers' model folders the
# catalog's models use (sweeps/lease/trim_transformers.py), since what travels is capped.
# Usage: sweeps/lease/wheels.sh [DIR]    (LEASE_PYTHON=3.12 LEASE_CUDA=130 DEEPSPEED=0.19.8 to change)
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.whl}
PY=${LEASE_PYTHON:-3.12}
CUDA=${LEASE_CUDA:-130}
DEEPSPEED=${DEEPSPEED:-0.19.8}
LOCK=requirements/lock.txt
PIP=${PIP:-python3 -m pip}
pinned() { sed -n "s/^$1==//Ip" "$LOCK" | head -1; }
# what the image lacks or holds at another version than the lock (transformers 5.17 there)
LOCKED="transformers trl peft datasets dill multiprocess hydra-core omegaconf bitsandbytes"
# DeepSpeed's requirements missing from the image
EXTRA="hjson pydantic pydantic-core annotated-types typing-inspection"
rm -rf "$DIR" && mkdir -p "$DIR"
specs=()
for p in $LOCKED; do
  v=$(pinned "$p"); [ -n "$v" ] || { echo "wheels.sh: $p is not in $LOCK" >&2; exit 2; }
  specs+=("$p==$v")
done
for p in $EXTRA; do
  v=$(pinned "$p"); specs+=("$p${v:+==$v}")
done
platforms=()
for n in 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
$PIP download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PY" \
  --implementation cp "${platforms[@]}" -d "$DIR" "${specs[@]}"
# source-only: pure Python wheels built here (DeepSpeed's ops are compiled on first use, on the GPU machine)
DS_BUILD_OPS=0 $PIP wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$DIR" \
  "antlr4-python3-runtime==$(pinned antlr4-python3-runtime)" "deepspeed==$DEEPSPEED"
# bitsandbytes: its one CUDA library the machine's torch uses (and the CPU one), no ROCm or other CUDA ones
for w in "$DIR"/bitsandbytes-*.whl; do
  zip -q -d "$w" $(unzip -Z1 "$w" | grep -E 'libbitsandbytes_(cuda|rocm|xpu|mps)[0-9a-z]*\.(so|dylib|dll)$' \
    | grep -v "cuda${CUDA}\.so$") >/dev/null
done
# transformers: the model folders the catalog's models (and what they and TRL import) use
PYTHONPATH=. python3 -m sweeps.lease.trim_transformers "$DIR"/transformers-*.whl
echo "$DIR/: $(ls "$DIR" | wc -l) wheels, $(du -sh "$DIR" | cut -f1) (Python $PY, bitsandbytes CUDA $CUDA, DeepSpeed $DEEPSPEED)"
