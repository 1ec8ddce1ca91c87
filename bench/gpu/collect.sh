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
#   openrlhf/  OpenRLHF 0.11.2 unmodified (pure Python) and its imports, for the side-by-side runs
#   install.sh  what bench/gpu/carry.py runs on the machine: all of it into one --target dir
#
#   bash bench/gpu/collect.sh [DIR] && python3 bench/gpu/carry.py pack DIR .gpu-carry
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "${1:-.gpu-pkg}")
mkdir -p "$dir/vllm" "$dir/openrlhf"
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
touch "$site/.installed"  # bench/gpu/miniature/run.sh and device.sh skip their own install with it
EOF
chmod +x "$dir/install.sh"
du -sh "$dir" "$dir"/vllm "$dir"/openrlhf
