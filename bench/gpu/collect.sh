#!/usr/bin/env bash
# Here (with network): everything the GPU machines lack for the vLLM runs, in DIR (default .gpu-pkg),
# for their Python 3.12 x86-64 image (torch 2.11, CUDA 13; KINDS.md lists what it already holds):
#
#   ray 2.60 + deepspeed 0.19.8           bench/gpu/pack.sh (ray repacked to a 29 MB xz)
#   ansible-core, flask, gunicorn, bm25s  bench/gpu/miniature/pack_extra.sh (site.yml, rlrun and the retrieval service)
#   vllm/   vLLM 0.26.0, the release built for torch 2.11 (0.27-0.32 need torch 2.13, which the image does
#           not have and which cannot travel), trimmed: no FlashAttention-2 kernel (Hopper runs FA3), no
#           vllm-rs binary, no deep_gemm builds for other Pythons, no CUTLASS headers (JIT for kernels a
#           bf16 dense model does not use): 304 MB wheel -> ~115 MB xz; plus its run-time imports
#   liger/  liger-kernel 0.8.5 (pure Python; Triton comes with the image's torch), for --use_liger_kernel
#   openrlhf/  OpenRLHF 0.11.2 unmodified (pure Python) and its imports, for the side-by-side runs
#   verl/   verl 0.9.1 unmodified (pure Python) and what its main_ppo, its vLLM HTTP server and Hydra import
#           beyond the rest, for the side-by-side's optional third system (side_by_side.py --systems ...,verl)
#   install.sh  what bench/gpu/carry.py runs on the machine: all of it into one --target dir
#
#   bash bench/gpu/collect.sh [DIR] && python3 bench/gpu/carry.py pack DIR .gpu-carry
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "${1:-.gpu-pkg}")
mkdir -p "$dir/vllm" "$dir/liger" "$dir/openrlhf" "$dir/verl/only"
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64)
pipdl() { python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" "$@"; }

[ -f "$dir/ray312.tar.xz" ] || bash bench/gpu/pack.sh "$dir"
[ -d "$dir/extra" ] || bash bench/gpu/miniature/pack_extra.sh "$dir/extra"

# vLLM 0.26.0: the wheel unpacked and trimmed, then xz.
if [ ! -f "$dir/vllm/vllm026.tar.xz" ]; then
  tmp=$(mktemp -d)
  pipdl -d "$tmp" vllm==0.26.0
  unzip -q "$tmp"/vllm-0.26.0-*.whl -d "$tmp/w"
  rm -rf "$tmp/w/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$tmp/w/vllm/vllm-rs" \
    "$tmp/w/vllm/third_party/fmha_sm100/cutlass" "$tmp/w/vllm/third_party/deep_gemm/include"
  find "$tmp/w/vllm/third_party/deep_gemm" -name '_C.cpython-3*' ! -name '*cpython-312*' -delete
  tar -cf - -C "$tmp/w" . | xz -6 -T2 >"$dir/vllm/vllm026.tar.xz"
  rm -rf "$tmp"
fi
# What `LLM` imports at run time beyond the image and the ray set (pydantic is there), as pip resolves them
# for vLLM 0.26's ranges (see docs/gpu-machine.md; openai stays 2.x: 3.x pulls httpx2).
pipdl -d "$dir/vllm" fastapi==0.136.3 starlette==1.10.0 openai==2.54.0 distro==1.9.0 jiter==0.19.0 \
  sniffio==1.3.1 openai-harmony==0.0.8 msgspec==0.22.0 pyzmq==27.3.0 cbor2==6.3.0 pybase64==1.5.1 \
  cachetools==8.0.1 partial-json-parser==0.2.1.1.post7 llguidance==1.7.6 xgrammar==0.2.7 \
  apache-tvm-ffi==0.1.10 blake3==1.0.11 setproctitle==1.3.8 ijson==3.6.0
# Liger's kernels (the version pyproject's extra gpu pins): every system's --liger in side_by_side.py
pipdl -d "$dir/liger" liger-kernel==0.8.5
# OpenRLHF 0.11.2 (pure Python; the wheel is tagged cp311, so its package dir is repacked as is) and the
# imports its train_ppo_ray needs beyond vLLM's and Ray's.
if [ ! -f "$dir/openrlhf/openrlhf.tar.xz" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" openrlhf==0.11.2
  unzip -q "$tmp"/openrlhf-0.11.2-*.whl -d "$tmp/w"
  tar -cf - -C "$tmp/w/openrlhf-0.11.2.data/purelib" openrlhf | xz -6 >"$dir/openrlhf/openrlhf.tar.xz"
  rm -rf "$tmp"
fi
pipdl -d "$dir/openrlhf" datasets==5.2.0 multiprocess==0.70.19 dill==0.4.1 torchdata==0.11.0
python3 -m pip download -q --no-deps -d "$dir/openrlhf" pylatexenc==2.11 2>/dev/null ||
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$dir/openrlhf" pylatexenc==2.11
# verl 0.9.1, the newest release (2026-09-20). Its requirements bound neither vLLM nor torch (only its extras
# pin them: vllm==0.24.0, torch==2.11.0); at import it asks vLLM >= 0.18 (verl/third_party/vllm) and
# tensordict >= 0.10. It declares transformers<5.11 and tensordict<=0.10.0: the image's transformers 5.17 is
# used as OpenRLHF uses it against its pin (metadata only, no check at import), and tensordict 0.10.0's _C
# is pybind11 without libtorch symbols, so it loads under torch 2.11. Its v1 trainer (the default) needs
# TransferQueue. The verl and TransferQueue wheels also carry top-level tests/ and scripts/, which would
# shadow the project's tests package in the site dir: only their package dirs and dist-info travel.
if [ ! -f "$dir/verl/verl.tar.xz" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" verl==0.9.1 transferqueue==0.1.11
  unzip -q "$tmp"/verl-0.9.1-py3-none-any.whl 'verl/*' 'verl-0.9.1.dist-info/*' -d "$tmp/w"
  unzip -q "$tmp"/transferqueue-0.1.11-py3-none-any.whl 'transfer_queue/*' \
    'transferqueue-0.1.11.dist-info/*' -d "$tmp/w"
  tar -cf - -C "$tmp/w" . | xz -6 >"$dir/verl/verl.tar.xz"
  rm -rf "$tmp"
fi
# Beyond the image, the vLLM/OpenRLHF sets and Ray's (found by importing verl.trainer.main_ppo, its v1
# trainer, its engine workers and vllm_async_server with only those on the path): Hydra, tensordict and its
# pyvers + orjson, codetiming, and for verl's vLLM OpenAI server (the offline LLM needs none of them)
# uvicorn, watchfiles, prometheus-fastapi-instrumentator, model-hosting-container-standards + jmespath.
pipdl -d "$dir/verl" hydra-core==1.3.2 omegaconf==2.3.0 codetiming==1.4.0 tensordict==0.10.0 pyvers==0.1.0 \
  orjson==3.13.0 uvicorn==0.54.0 watchfiles==1.3.0 prometheus-fastapi-instrumentator==8.1.0 \
  model-hosting-container-standards==0.1.16 jmespath==1.1.0
# OmegaConf 2.3's and Hydra 1.3's parsers were generated by ANTLR 4.9 and a 4.10+ runtime refuses them
# ("Could not deserialize ATN with version 3 (expected 4)"), while the site holds antlr4 4.13.2 for
# math-verify: 4.9.3 (an sdist only, built into a wheel here) goes to SITE/verl-only, which side_by_side.py
# puts first on verl's path alone.
[ -n "$(ls "$dir"/verl/only/antlr4_python3_runtime-4.9.3-*.whl 2>/dev/null)" ] ||
  python3 -m pip wheel -q --no-deps -w "$dir/verl/only" antlr4-python3-runtime==4.9.3

cat >"$dir/install.sh" <<'EOF'
#!/usr/bin/env bash
# On the GPU machine (bench/gpu/carry.py install runs it): everything into SITE (one --target dir).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
site=${1:?usage: install.sh SITE}
mkdir -p "$site"
# pip --target skips a top-level dir that already exists (bin/ after the first install: ansible-playbook
# went missing that way), and --upgrade would replace bin/ whole; so each install goes to a fresh dir that is
# then merged file by file into SITE.
pipi() {
  local stage; stage=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$stage" "$@" || return 1
  cp -a "$stage"/. "$site"/ && rm -rf "$stage"
}
tar -xJf "$here/ray312.tar.xz" -C "$site"
pipi "$here"/*.whl "$here"/extra/*.whl
DS_BUILD_OPS=0 pipi --no-build-isolation "$here"/deepspeed-*.tar.gz
tar -xJf "$here/vllm/vllm026.tar.xz" -C "$site"
pipi "$here"/vllm/*.whl
tar -xJf "$here/openrlhf/openrlhf.tar.xz" -C "$site"
pipi "$here"/openrlhf/*.whl
for exe in ansible-playbook ansible-galaxy; do  # the miniature stage runs site.yml with them
  [ -x "$site/bin/$exe" ] || { echo "install.sh: $site/bin/$exe missing after install" >&2; exit 1; }
done
PYTHONPATH=$site python3 -c "import vllm, ray, deepspeed, openrlhf, pylatexenc, datasets, flask" ||
  { echo "install.sh: a carried package does not import (above)" >&2; exit 1; }
if [ -d "$here/liger" ]; then  # optional (--use_liger_kernel): a failure here is reported only
  pipi "$here"/liger/*.whl
  PYTHONPATH=$site python3 -c "from liger_kernel.transformers import _apply_liger_kernel_to_instance" ||
    echo "install.sh: liger-kernel does not import (above): --use_liger_kernel and side_by_side.py --liger will fail" >&2
fi
if [ -d "$here/verl" ]; then  # optional (the side-by-side's third system): a failure here is reported only
  tar -xJf "$here/verl/verl.tar.xz" -C "$site"
  pipi "$here"/verl/*.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site/verl-only" \
    "$here"/verl/only/*.whl
  PYTHONPATH=$site/verl-only:$site python3 -c "import verl, hydra, tensordict, transfer_queue, codetiming
import uvicorn, watchfiles
from omegaconf import OmegaConf; assert OmegaConf.create({'a': 1, 'b': '\${a}'}).b == 1" ||
    echo "install.sh: verl does not import (above): side_by_side.py --systems ...,verl will fail" >&2
fi
touch "$site/.installed"  # bench/gpu/miniature/run.sh and device.sh skip their own install with it
EOF
chmod +x "$dir/install.sh"
du -sh "$dir" "$dir"/vllm "$dir"/liger "$dir"/openrlhf "$dir"/verl
