#!/usr/bin/env bash
# On a one-GPU device machine (nvidia-h100-x1 / nvidia-h200): the vLLM runs of docs/benchmarks.md, stage by
# stage, one device call each (a call may run several). Packages come from bench/gpu/collect.sh +
# bench/gpu/carry.py (chunks received by earlier calls on the same warm machine).
#
#   bash bench/gpu/vllm_device.sh OUT receive .gpu-carry/c00 [inputs env]   # first call (cold machine)
#   bash bench/gpu/vllm_device.sh OUT receive .gpu-carry/c01                 # each further chunk
#   bash bench/gpu/vllm_device.sh OUT install vllm                           # join + install, then the engine bench
#   bash bench/gpu/vllm_device.sh OUT train                                  # the train phase, ZeRO-3 settings
#   bash bench/gpu/vllm_device.sh OUT sbs                                    # rlrun vs OpenRLHF side by side
#   bash bench/gpu/vllm_device.sh OUT mini                                   # 32b-rloo via site.yml + rlrun, vLLM
#
# Every process gets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=$(realpath -m "${1:?usage: vllm_device.sh OUT STAGE...}")
shift
mkdir -p "$out"
work=/tmp/rl13
export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
export RAY_USAGE_STATS_ENABLED=0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext TOKENIZERS_PARALLELISM=false
rc=0
stage() { printf '== %s (%s)\n' "$1" "$(date +%T)"; }
while [ $# -gt 0 ]; do
  case $1 in
    receive)
      stage "receive $2"
      python3 bench/gpu/carry.py receive "$2" || rc=1
      shift ;;
    env)
      stage env
      { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -V
        python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
        nproc; free -g | head -2; df -h /tmp | tail -1; } 2>&1 | tee "$out/env.txt" ;;
    inputs)
      stage inputs
      [ -d $work/model ] || python3 bench/gpu/model.py $work/model >"$out/model.log" 2>&1 || { tail "$out/model.log"; rc=1; }
      python3 -m trainer.tiny dataset $work/data.jsonl --n 512 --kind copy --max-digits 4 >/dev/null || rc=1
      ls -la $work/model | head -3 ;;
    install)
      stage install
      python3 bench/gpu/carry.py status
      python3 bench/gpu/carry.py install --site /tmp/site || rc=1
      python3 -c "import vllm, ray, deepspeed, openrlhf, flask; print('vllm', vllm.__version__, 'ray', ray.__version__,
'deepspeed', deepspeed.__version__)" 2>&1 | tail -3 ;;
    vllm)
      stage "engine bench"
      timeout 420 python3 bench/gpu/vllm_bench.py all --model $work/model --data $work/data.jsonl --out "$out/vllm" \
        --timeout 300 2>&1 | tail -30 || rc=1 ;;
    train)
      stage "train phase, ZeRO-3 settings"
      timeout 300 python3 bench/gpu/train_step.py --model $work/model \
        --variants "${TRAIN_VARIANTS:-z3/0,z3/100000}" 2>&1 | tail -6 || rc=1 ;;
    sbs)
      stage "side by side"
      python3 bench/gpu/side_by_side.py --model $work/model --data $work/data.jsonl --out "$out/sbs" \
        --steps "${SBS_STEPS:-6}" --deadline "${SBS_DEADLINE:-540}" --systems "${SBS_SYSTEMS:-bare,rlrun,openrlhf}" \
        2>&1 | tail -40 || rc=1
      tar czf "$out/sbs_logs.tgz" -C "$out/sbs" . 2>/dev/null ;;
    mini)
      stage "miniature x1, vLLM"
      ROLLOUT=vllm SUBMIT_TIMEOUT=${MINI_TIMEOUT:-420} bash bench/gpu/miniature/run.sh x1 "$out/mini" 2>&1 | tail -40 || rc=1
      tar czf "$out/mini_logs.tgz" -C "$out/mini" . 2>/dev/null ;;
    *) echo "unknown stage $1" >&2; exit 2 ;;
  esac
  shift
done
exit $rc
