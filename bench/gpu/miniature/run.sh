#!/usr/bin/env bash
# The seed 004 placement in miniature (issue 8): two Ray nodes on one machine, provisioned by the
# project's own playbooks (site.yml: python_stack, accel_env, ray_node, reward_server), then the
# 32b-rloo preset through `rlrun submit` with a small random-init model, rewards from the deployed
# reward service, then playbooks/teardown.yml.
#
#   bash bench/gpu/miniature/run.sh cpu OUT            # here: a fresh clone after `make venv`
#   PKG=.gpu-pkg bash bench/gpu/miniature/run.sh x4 OUT   # nvidia-h200-x4: 2 nodes x 2 GPUs
#   PKG=.gpu-pkg bash bench/gpu/miniature/run.sh x1 OUT   # one GPU (nvidia-h100-x1, nvidia-h200): 1 node
#   ROLLOUT=vllm bash bench/gpu/miniature/run.sh x1 OUT   # the same with vLLM engines (packages carried and
#                                                         # installed by bench/gpu/carry.py: no PKG needed)
#   ROLLOUT=vllm VLLM_TP=2 ... x4 OUT                     # 2 engines of TP 2 on the 2 x 2 GPUs
#   ROLLOUT=vllm VLLM_TP=4 ... x4 OUT                     # 1 engine of TP 4 across both nodes (seed 003)
#   ROLLOUT=vllm VLLM_TP=2 ... x2 OUT                     # nvidia-h200-x2: 2 nodes x 1 GPU, 1 engine of TP 2
#                                                         # across both
#   PRESET=32b-rloo-1node MODEL=DIR SETS="k=v ..." bash bench/gpu/miniature/run.sh x4one OUT
#                                                         # one node of 4 GPUs, the preset as it is but for
#                                                         # the model, the data and SETS (issue 36)
#
# cpu: inventory bench/gpu/miniature/inventory (nodes 127.0.0.7 / .8, 2 CPUs each), a tiny model from
#   `python -m trainer.tiny`, placement actor 2 x 1 / reference 2 x 1 colocated. A CPU cluster has no
#   GPUs, so rlrun refuses a GPU preset: the job goes in with --no-check (the checks are printed by a
#   --dry-run first). Uses $VENV (default .venv) for ansible-playbook and the stack.
# x4: inventory bench/gpu/miniature/inventory-x4 (node1 GPUs 0,1, node2 GPUs 2,3, each its own
#   NCCL_HOSTID), the Qwen2.5-0.5B-shaped random model of bench/gpu/model.py, placement actor 2 x 2 /
#   reference 2 x 2 colocated. x1: inventory-x1 (one node, GPU 0), actor 1 x 1 / reference 1 x 1 colocated,
#   the preset's other settings and packed micro-batches (--packing_samples). Nothing can be installed there: $PKG holds what bench/gpu/pack.sh and
#   bench/gpu/miniature/pack_extra.sh made here (ray, deepspeed, ansible-core, the reward service's and
#   Ray dashboard's packages), unpacked into /tmp/site.
# ROLLOUT=hf (the default) runs the HF engine; ROLLOUT=vllm the preset's vLLM engines colocated and asleep
# while training (x1: one engine of TP 1 at half the GPU's memory; weights in place through CUDA IPC).
# All: flash_attn off (the preset's
# FlashAttention-2 is not installed there either; the trainer refuses the flag without it), the seed's batch sizes
# scaled down, a few steps. OUT gets site.log, status.txt, dryrun.log, submit.log, job.log,
# steps.txt (each step's timings), nccl.txt (NCCL transport lines, x4), summary.txt (stage seconds).
# Nothing is stopped by name: teardown.yml ends this cluster's own processes, by pidfile.
set -uo pipefail
kind=${1:?usage: run.sh cpu|x4|x2|x1|x4one OUT}
out=$(realpath -m "${2:?usage: run.sh cpu|x4|x2|x1|x4one OUT}")
submit_timeout=${SUBMIT_TIMEOUT:-330}
cd "$(dirname "$0")/../../.." || exit 1
root=$PWD
here=bench/gpu/miniature
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
stage() {  # stage NAME CMD...: run, append its seconds and exit code to the summary
  local name=$1 t0 ms rc
  shift
  t0=$(date +%s%N)
  "$@"
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-12s %5d.%01d s  rc=%s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) "$rc" >>"$summary"
  return $rc
}
rlrun() {  # the entry point python_stack wrote into the head's venv (the checkout's code first on its path)
  "$HOME/.rlrun/$cluster/node1/venv/bin/rlrun" "$@"
}
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
export ANSIBLE_CONFIG=$root/ansible.cfg ANSIBLE_FORCE_COLOR=0
export TORCH_EXTENSIONS_DIR=/tmp/rlrun-torch-ext

case $kind in
  cpu)
    inv=$here/inventory
    cluster=mini8
    venv=$(realpath -m "${VENV:-.venv}")
    [ -x "$venv/bin/ansible-playbook" ] || { echo "no $venv/bin/ansible-playbook: run make venv first"; exit 1; }
    export PATH=$venv/bin:$PATH
    work=/tmp/rlrun-mini8
    cpu_hidden=64
    [ "${ROLLOUT:-hf}" = vllm ] && { work=/tmp/rlrun-mini8-vllm; cpu_hidden=256; }
    per_node=1
    sets=(--set rollout_batch_size=4 --set micro_rollout_batch_size=4 --set train_batch_size=32
          --set micro_train_batch_size=8 --set max_samples=8 --set generate_max_len=16 --set prompt_max_len=64)
    check=(--no-check)
    ;;
  x4|x2|x1|x4one)
    inv=$here/inventory-$kind
    cluster=mini8$kind
    if [ -f /tmp/site/.installed ]; then
      pkg=${PKG:-/tmp/site}  # installed already (bench/gpu/carry.py install, or an earlier run)
    else
      pkg=$(realpath "${PKG:?PKG: the folder of carried packages}")
    fi
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    install() {
      [ -f /tmp/site/.installed ] && return 0
      mkdir -p /tmp/site
      tar -xJf "$pkg/ray312.tar.xz" -C /tmp/site || return 1
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        "$pkg"/*.whl "$pkg"/extra/*.whl || return 1
      DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
        --target /tmp/site "$pkg"/deepspeed-*.tar.gz || return 1
      touch /tmp/site/.installed
    }
    stage install install || { cat "$summary"; exit 1; }
    # Older packs of bench/gpu/pack.sh left the dashboard's web build out without a stub: Ray's
    # dashboard refuses to start without the directory (FrontendNotFoundError), and with it the Jobs
    # API (seen on the x4, 2026-11-21). An empty one will do; checked on every run, installed or not.
    build=/tmp/site/ray/dashboard/client/build
    mkdir -p $build/static
    [ -f $build/index.html ] || echo "<html><body>Ray dashboard web UI not installed</body></html>" >$build/index.html
    tail -1 "$summary"
    export PYTHONPATH=/tmp/site:$root PATH=/tmp/site/bin:$PATH
    # The dashboard (Jobs API) needs opentelemetry's generated protobuf code to load on the image's
    # protobuf; where it does not, a carried protobuf goes into /tmp/site too.
    if ! python3 -c "import ray.dashboard.optional_deps" 2>"$out/dashboard_deps.err" && [ -d "$pkg/fallback" ]; then
      tail -3 "$out/dashboard_deps.err"
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$pkg"/fallback/*.whl && echo "installed $(ls "$pkg"/fallback) into /tmp/site"
    fi
    work=/tmp/rlrun-mini8$kind
    per_node=2
    sets=(--set rollout_batch_size=16 --set micro_train_batch_size=8 --set max_samples=48
          --set generate_max_len=256 --set prompt_max_len=128)
    [ "$kind" = x2 ] && per_node=1  # two nodes of one GPU: actor 2 x 1 / reference 2 x 1
    if [ "$kind" = x1 ]; then
      per_node=1
      sets+=(--set actor_num_nodes=1 --set ref_num_nodes=1 --set packing_samples=true --set max_samples=32)
    fi
    if [ "$kind" = x4one ]; then  # the preset's own sizes but for what SETS says
      per_node=4
      sets=()
    fi
    check=()
    ;;
  *) echo "unknown kind $kind: expected cpu, x4, x2, x1 or x4one" >&2; exit 2 ;;
esac

# What the machine has (the x4 image lacks iproute2; start-stop-daemon comes with dpkg).
{
  echo "host: $(uname -n) $(nproc) CPUs; python3: $(command -v python3) $(python3 -V 2>&1)"
  python3 -c "import google.protobuf as p, torch; print('protobuf', p.__version__, 'torch', torch.__version__)"
  for tool in start-stop-daemon ps ss ip systemctl nvidia-smi g++; do
    printf '%s: %s\n' "$tool" "$(command -v $tool || echo missing)"
  done
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
  command -v nvidia-smi >/dev/null && nvidia-smi topo -m
} >"$out/env.txt" 2>&1
if [ -n "${FORCE_SSD_SHIM:-}" ] || ! command -v start-stop-daemon >/dev/null; then
  mkdir -p /tmp/rlrun-shims && cp $here/start-stop-daemon /tmp/rlrun-shims/ && chmod +x /tmp/rlrun-shims/*
  export PATH=/tmp/rlrun-shims:$PATH
  echo "start-stop-daemon: missing, using $here/start-stop-daemon" | tee -a "$out/env.txt"
fi

# DeepSpeedCPUAdam (the preset's --adam_offload) is built at first use; build it now, beside the playbook.
python3_bin=$(command -v python3)
[ "$kind" = cpu ] && python3_bin=$venv/bin/python
( t0=$(date +%s); "$python3_bin" -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
    >"$out/cpu_adam.log" 2>&1; echo "rc=$? $(( $(date +%s) - t0 )) s" >>"$out/cpu_adam.log" ) &
adam_pid=$!

# Model and prompts where both nodes read them.
mkdir -p "$work"
make_inputs() {
  if [ -n "${MODEL:-}" ]; then
    [ -f "$MODEL/config.json" ] || { echo "MODEL=$MODEL: no config.json there"; return 1; }
  elif [ "$kind" = cpu ]; then
    # vLLM's CPU attention needs head_dim >= 32: hidden 256 / 4 heads for ROLLOUT=vllm, 64 is enough for HF
    [ -d "$work/model" ] || "$python3_bin" -m trainer.tiny model "$work/model" --hidden-size "$cpu_hidden" || return 1
  else
    [ -d "$work/model" ] || python3 bench/gpu/model.py "$work/model" || return 1
  fi
  "$python3_bin" -m trainer.tiny dataset "$work/copy.jsonl" --n 256 --kind copy --max-digits 4
}
stage inputs make_inputs >"$out/inputs.log" 2>&1 &
inputs_pid=$!

stage site ansible-playbook -i $inv site.yml >"$out/site.log" 2>&1
rc=$?
tail -1 "$summary"
grep -E "^(PLAY RECAP|node[12] |localhost )|stack found" "$out/site.log"
if [ $rc -ne 0 ]; then
  grep -B2 -A25 -E "fatal|ERROR" "$out/site.log" | head -60
  # The nodes' own logs: the supervisors' and Ray's dashboard / raylet / GCS.
  tar czf "$out/node_logs.tgz" "$HOME/.rlrun/$cluster" /tmp/rlrun-$(id -un)/$cluster-node*/session_latest/logs \
    --exclude venv 2>/dev/null
  for f in "$HOME"/.rlrun/$cluster/node1/service/*.log /tmp/rlrun-$(id -un)/$cluster-node1/session_latest/logs/dashboard.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -15 "$f"; }
  done
  stage teardown ansible-playbook -i $inv playbooks/teardown.yml >"$out/teardown.log" 2>&1
  exit 1
fi
wait $inputs_pid || { cat "$out/inputs.log"; exit 1; }
grep inputs "$summary"
stage status rlrun -i $inv status >"$out/status.txt" 2>&1
tail -1 "$summary"
cat "$out/status.txt"

# FABRIC=1: the collectives between the nodes, measured before the job (rlrun check --fabric: issue 32)
if [ -n "${FABRIC:-}" ]; then
  stage fabric timeout 120 "$HOME/.rlrun/$cluster/node1/venv/bin/rlrun" -i $inv check --fabric --json \
    >"$out/fabric.json" 2>"$out/fabric.log"
  tail -1 "$summary"
  tail -25 "$out/fabric.log"
fi

wait $adam_pid
tail -1 "$out/cpu_adam.log" | sed 's/^/cpu_adam     /' | tee -a "$summary"
adam=()
if ! tail -1 "$out/cpu_adam.log" | grep -q "^rc=0"; then
  tail -20 "$out/cpu_adam.log"
  adam=(--set adam_offload=false)
  echo "cpu_adam did not build: submitting with --set adam_offload=false" | tee -a "$summary"
fi

# (with the HF engine, the preset's vLLM-only values go back to their defaults: set, they would be refused)
rollout=(--set rollout_backend=hf --set vllm_num_engines=0 --set vllm_tensor_parallel_size=1
         --set vllm_enable_sleep=false --set enable_prefix_caching=false
         --set vllm_gpu_memory_utilization=0.95 --set vllm_sync_backend=nccl)
if [ "${ROLLOUT:-hf}" = vllm ]; then  # colocation: engines x TP = the actor's ranks (nodes x per node)
  nodes=2
  [ "$kind" = x1 ] && nodes=1
  tp=${VLLM_TP:-1}
  rollout=(--set rollout_backend=vllm --set vllm_num_engines=$((nodes * per_node / tp))
           --set vllm_tensor_parallel_size=$tp --set vllm_gpu_memory_utilization=0.5)
fi
model=${MODEL:-$work/model}
if [ "$kind" = x4one ]; then  # PRESET as it is, on the copy-task prompts, with SETS
  extra=()
  for kv in ${SETS:-}; do extra+=(--set "$kv"); done
  job=(--preset "${PRESET:-32b-rloo-1node}" --set pretrain=$model --set prompt_data=$work/copy.jsonl
       --set input_key=message --set label_key=answer --set apply_chat_template=true --set flash_attn=false
       --set num_episodes=1 --set max_samples=100000 --set save_path=$work/out --set ckpt_path=$work/out/ckpt
       "${extra[@]}" "${adam[@]}" --exclude .gpu-pkg --exclude .gpu-carry)
else  # the miniature: 32b-rloo scaled to the two loopback nodes, and SETS where given (xnode: a warm-up)
  extra=()
  for kv in ${SETS:-}; do extra+=(--set "$kv"); done
  job=(--preset 32b-rloo
       --set pretrain=$model --set prompt_data=$work/copy.jsonl --set label_key=answer
       --set apply_chat_template=true "${rollout[@]}" --set flash_attn=false
       --set actor_num_gpus_per_node=$per_node --set ref_num_gpus_per_node=$per_node
       --set num_episodes=1 "${sets[@]}" "${extra[@]}" "${adam[@]}" --exclude .gpu-pkg --exclude .gpu-carry)
fi
echo "rlrun -i $inv submit ${job[*]} ${check[*]} --follow" | tee "$out/command.txt"
rlrun -i $inv submit "${job[@]}" --dry-run >"$out/dryrun.log" 2>&1
sed -n '/^checks against/,$p' "$out/dryrun.log"
# timeout(1) runs programs, not shell functions: the entry point by its path
# While the job runs: GPU and host memory every 2 s (peaks in memory.txt), and when step 1 is logged.
watch_pids=()
if command -v nvidia-smi >/dev/null; then
  ( while sleep 2; do
      nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | sed 's/^/gpu /'
      free -m | awk '/^Mem:/ {print "host", $3}'
    done ) >"$out/mem_samples.txt" 2>/dev/null &
  watch_pids+=($!)
fi
t_submit=$(date +%s)
( while ! grep -qE "^step 1:" "$out/submit.log" 2>/dev/null; do sleep 1; done
  echo "step 1 logged $(( $(date +%s) - t_submit )) s after submit" >>"$summary" ) &
watch_pids+=($!)
stage submit timeout "$submit_timeout" "$HOME/.rlrun/$cluster/node1/venv/bin/rlrun" -i $inv submit "${job[@]}" "${check[@]}" --follow >"$out/submit.log" 2>&1
rc=$?
kill "${watch_pids[@]}" 2>/dev/null
[ -f "$work/out/metrics.jsonl" ] && cp "$work/out/metrics.jsonl" "$out/metrics.jsonl"  # x4one: every metric
if [ -s "$out/mem_samples.txt" ]; then  # peak MiB per GPU and of the host's used memory
  awk '$1 == "gpu" {i = $2; sub(",", "", i); if ($3 > g[i]) g[i] = $3}
       $1 == "host" {if ($2 > h) h = $2}
       END {for (i in g) printf "gpu %s peak %.1f GiB\n", i, g[i] / 1024; printf "host peak used %.1f GiB\n", h / 1024}' \
    "$out/mem_samples.txt" | sort >"$out/memory.txt"
  cat "$out/memory.txt" | tee -a "$summary"
fi
tail -1 "$summary"
grep -E "^(step [0-9]+:|job |reward/mean|submitted|error|refused)|^  (GPUs|CPUs|cluster|reward)" "$out/submit.log"
job_id=$(grep -oE "rlrun-[0-9]{8}-[0-9]{6}-[0-9a-f]+" "$out/submit.log" | head -1)
if [ -n "$job_id" ]; then
  rlrun -i $inv logs "$job_id" >"$out/job.log" 2>&1
  grep -E "^step [0-9]+:" "$out/job.log" >"$out/steps.txt"
  [ $rc -ne 0 ] && grep -E "Error|error|Traceback" "$out/job.log" | head -20
fi
# NCCL's transport lines from every Ray worker of both nodes.
grep -rhoE "NCCL INFO (Channel [0-9/]+ : [0-9]+\[[0-9]+\] -> [0-9]+\[[0-9]+\] \[?[a-z]*\]? ?via [A-Za-z/_]+.*|NET/[A-Za-z]+ : Using.*|Using network [A-Za-z]+|NCCL_HOSTID.*|Connected all (rings|trees).*)" \
  /tmp/rlrun-$(id -un)/mini8*-node*/session_latest/logs 2>/dev/null | sed -E 's/comm 0x[0-9a-f]+/comm X/' \
  | sort | uniq -c | sort -rn >"$out/nccl.txt"
head -20 "$out/nccl.txt"
stage teardown ansible-playbook -i $inv playbooks/teardown.yml >"$out/teardown.log" 2>&1
echo "--- summary"
cat "$summary"
exit $rc
