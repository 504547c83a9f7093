#!/usr/bin/env bash
# Build one virtual environment per old TRL release: `sweeps/legacy/envs.sh 0.14 0.17 ...`.
# Torch is installed once into .venvs/torch (torch 2.13 CPU from the local wheel); each .venvs/trl-X.Y gets the
# TRL / transformers / PEFT / accelerate releases of its time and sees that torch through a .pth file.
# Pins: the newest transformers / PEFT / accelerate patch releases out when that TRL release was current and
# allowed by its Requires-Dist (PyPI metadata). Installs run under nice, one at a time.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VENVS="$ROOT/.venvs"
pins() {
  case "$1" in
    0.14) echo "trl==0.14.0 transformers==4.48.3 peft==0.14.0 accelerate==1.3.0 datasets==3.2.0" ;;
    0.17) echo "trl==0.17.0 transformers==4.51.3 peft==0.15.2 accelerate==1.6.0 datasets==3.5.0" ;;
    0.19) echo "trl==0.19.1 transformers==4.52.4 peft==0.15.2 accelerate==1.8.1 datasets==3.6.0" ;;
    0.23) echo "trl==0.23.1 transformers==4.56.2 peft==0.17.1 accelerate==1.10.1 datasets==4.1.1" ;;
    *) echo "sweeps/legacy/envs.sh: no pins for TRL $1 (accepted: 0.14 0.17 0.19 0.23)" >&2; return 2 ;;
  esac
}
mkdir -p "$VENVS"
if [ ! -f "$VENVS/torch/.installed" ]; then
  python3 -m venv "$VENVS/torch"
  nice -n 10 "$VENVS/torch/bin/pip" install -q torch==2.13.0
  touch "$VENVS/torch/.installed"
fi
TORCH_SITE=$("$VENVS/torch/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for v in "$@"; do
  spec=$(pins "$v")
  env="$VENVS/trl-$v"
  if [ -f "$env/.installed" ] && [ "$(cat "$env/.installed")" = "$spec" ]; then continue; fi
  python3 -m venv "$env"
  site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$TORCH_SITE" > "$site/_shared_torch.pth"
  # shellcheck disable=SC2086
  nice -n 10 "$env/bin/pip" install -q $spec
  echo "$spec" > "$env/.installed"
done
