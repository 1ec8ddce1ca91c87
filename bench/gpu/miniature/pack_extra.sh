#!/usr/bin/env bash
# Here (with network): the wheels that run.sh x4 needs on a GPU machine beyond bench/gpu/pack.sh's
# ray + deepspeed: ansible-core (the playbooks run there), the reward service (flask, gunicorn,
# math-verify) and the Ray dashboard's dependencies (the Jobs API that `rlrun submit` talks to), for
# Python 3.12 x86-64, minus what the machine's image already holds (KINDS.md's package list). ~10 MB.
#
#   bash bench/gpu/pack.sh .gpu-pkg && bash bench/gpu/miniature/pack_extra.sh .gpu-pkg/extra
set -euo pipefail
cd "$(dirname "$0")/../../.."
dir=$(realpath -m "${1:-.gpu-pkg/extra}")
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" \
  ansible-core==2.19.14 resolvelib==1.2.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 \
  flask==3.1.3 blinker==1.9.0 itsdangerous==2.2.0 gunicorn==27.0.1 \
  math-verify==0.9.0 latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2 \
  aiohttp-cors==0.8.1 colorful==0.5.8 smart-open==9.0.2 opencensus==0.11.4 opencensus-context==0.1.3 \
  google-api-core==2.44.0 google-auth==2.62.2 googleapis-common-protos==1.76.0 proto-plus==1.29.0 \
  pyasn1==0.6.5 pyasn1-modules==0.4.2 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2 \
  bm25s==0.3.16
du -sh "$dir"
