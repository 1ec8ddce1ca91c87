#!/usr/bin/env bash
# On a GPU device machine (nothing can be downloaded there): install the carried packages into /tmp/site
# (once per machine), set the NCCL variables every process must keep, then run bench/gpu/run_all.py.
#
#   PKG=DIR bash bench/gpu/device.sh [run_all.py flags]
#
# PKG holds what bench/gpu/pack.sh made here: ray312.tar.xz (the cp312 ray 2.60 wheel unpacked, with its
# Java jars, RLlib, ray.llm and the dashboard's web build left out: 27 MB instead of 79), the small wheels
# ray and deepspeed need that the machine lacks, and the deepspeed 0.19.8 sdist (built there, DS_BUILD_OPS=0).
set -uo pipefail
cd "$(dirname "$0")/../.."
PKG=${PKG:?PKG: the folder of carried packages}
SITE=/tmp/site
if [ ! -f "$SITE/.installed" ]; then
  t0=$(date +%s)
  mkdir -p "$SITE"
  tar -xJf "$PKG/ray312.tar.xz" -C "$SITE" || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$PKG"/*.whl || exit 1
  DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target "$SITE" "$PKG"/deepspeed-*.tar.gz || exit 1
  touch "$SITE/.installed"
  echo "installed carried packages in $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH="$SITE:$PWD"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
exec python3 bench/gpu/run_all.py "$@"
