#!/usr/bin/env bash
# Here (with network): fetch and repack what bench/gpu/device.sh installs on a GPU machine (Python 3.12,
# x86-64), into DIR (default .gpu-pkg, git-ignored). Within the device tool's 64 MiB per command: ~33 MB.
#
#   bash bench/gpu/pack.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "${1:-.gpu-pkg}")
mkdir -p "$dir"
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$dir" ray==2.60.0 hjson pydantic \
  pydantic-core annotated-types typing-inspection jsonschema jsonschema-specifications referencing rpds-py
python3 -m pip download -q --no-deps --no-binary=:all: -d "$dir" deepspeed==0.19.8
tmp=$(mktemp -d)
unzip -q "$dir"/ray-2.60.0-cp312-*.whl -d "$tmp"
# Not needed to run Ray core actors: Java jars (33 MB), RLlib, ray.llm, the dashboard's web build.
rm -rf "$tmp"/ray/jars "$tmp"/ray/rllib "$tmp"/ray/llm "$tmp"/ray/dashboard/client/build
# The dashboard (and with it the Jobs API) refuses to start without its build directory: leave a stub.
mkdir -p "$tmp"/ray/dashboard/client/build/static
echo "<html><body>Ray dashboard web UI left out by bench/gpu/pack.sh</body></html>" \
  >"$tmp"/ray/dashboard/client/build/index.html
tar -cJf "$dir/ray312.tar.xz" -C "$tmp" .
rm -rf "$tmp" "$dir"/ray-2.60.0-cp312-*.whl
du -sh "$dir"
