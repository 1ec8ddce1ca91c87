#!/usr/bin/env bash
# The multi-GPU runs of docs/benchmarks.md (issues 28, 30, 32, 33) on one warm nvidia-h100-x4 / -h200-x4,
# as ONE background pipeline: a device call returns after 10 minutes at most and the machine is given back
# ~30 s after the last call, so the stages run in a session of their own (setsid) while later calls only
# poll. Every stage has a deadline; a stage that fails does not stop the next. After the packages are in
# /tmp/site (bench/gpu/carry.py install):
#
#   bash bench/gpu/pipeline.sh start [STAGE ...]      # default: every stage below, in this order, from a
#                                                     # copy of the tree (/tmp/rlpipe/tree)
#   bash bench/gpu/pipeline.sh poll OUT [SECONDS]     # wait up to SECONDS (default 540) for the pipeline to
#                                                     # end, then copy status + summaries to OUT
# Poll without a pause: the machine is given back 30 s after a call returns, with the pipeline on it
# (2026-11-26: a fix made between two polls cost the x4 and the stages running there).
#
# Stages (GPUs):
#   inputs   the 0.5B and 7B Qwen-shaped random models (7B made on GPU 0) and the copy-task prompts
#   mini     seed 004 in miniature: site.yml on two loopback nodes of 2 GPUs each, `rlrun check --fabric`,
#            `rlrun submit --preset 32b-rloo` with 2 vLLM engines of TP 2 colocated (0-3)
#   sbs7b    7B RLOO colocated on 4 GPUs, 2 engines x TP 2, gradient checkpointing, micro-batches of 16
#            (SBS7B_MICRO), rlrun's last step profiled: rlrun, then OpenRLHF
#            0.11.2 with the same flags, then verl 0.9.1 at the same shape (0-3). SBS_SYSTEMS picks some
#            of rlrun,openrlhf,verl (default all three; results in sbs7b, or sbs7b_<systems> when it is set);
#            each system gets 400 s at most, so one that fails or hangs leaves the others' figures
#   sbs7b_levers rlrun alone as in sbs7b with --ref_zero_stage 0 (a reference that gathers nothing),
#            --old_logprobs rollout (no policy forward), 1 GiB weight-push buckets, engines at 0.30 (0-3)
#   sbs7b_liger as sbs7b with Liger's kernels in every system (--liger) and engines at 0.15 of the card (0-3)
#   sbs7b_kl as sbs7b_liger with the KL as a loss term in every system (--kl-loss) and rlrun's make_experience
#            without the old policy's forward (--old_logprobs train); 520 s a system (0-3)
#   sbs7b_inproc rlrun alone as in sbs7b with --vllm_in_process --vllm_start_with_models: step 1 (0-3)
#   step1_7b rlrun alone as in sbs7b_kl with --vllm_start_with_models --vllm_in_process, 2 steps: step 1 cold,
#            the 7B made first (0-3)
#   step1_modes step1_7b once per --vllm_compile mode (none, dynamo, inductor), 4 steps each, every cache cold (0-3)
#   step1_prewarm step1_7b with --vllm_prewarm_kernels and --vllm_preload_workers, with the prewarm alone, then
#            with neither, --vllm_compile none, 5 steps each, cold (0-3)
#   check1   (one GPU) the tiny model through the colocated loop: --old_logprobs rollout/train, profile, in-process
#   step1_prewarm1 (one GPU) the colocated 0.5B job, engine started with the models, cold, with and without
#            --vllm_prewarm_kernels (the driver's copy's head start at TP 1)
#   one7b    (one GPU) the 7B job on one GPU with 60 % of the optimizer's state on the host, 5 steps (issue 38
#            item 5), the host's memory sampled
#   one7b_ops (one GPU) trainer.deepspeed_ops builds cpu_adam (ray_node__deepspeed_ops), then one7b, 2 steps:
#            whether the job compiled it again (its policy's optimizer mark)
#   outputs1 (one GPU) bench/rollout_output.py on the 0.5B: generate with and without vLLM's per-step
#            detokenization, 16 x 4 x 512 tokens (one engine of the 7B job), in and out of process
#   preload1 (one GPU) bench/gpu/preload_bench.py: an engine's start through vLLM's Ray executor (TP 1) with and
#            without its worker preloaded (--vllm_preload_workers), alternating, on warm caches
#   preload2 (2 GPUs) preload1 at TP 2 with the 7B shape
#   check2   (2 GPUs) the tiny model through the colocated loop, one engine of TP 2 with its workers preloaded
#   xnode2   (2 GPUs) xnode on two loopback nodes of one GPU each: one engine of TP 2 across them, its workers
#            preloaded, through site.yml and rlrun submit
#   step1_x2 (2 GPUs) step1_prewarm's 7B job on two GPUs, one engine of TP 2, 60 % of the optimizer on the host:
#            both start-up levers, then neither, cold, 3 steps each
#   prewarm  (one GPU) bench/gpu/prewarm_bench.py: a cold 7B-shaped engine's start with and without the kernel
#            prewarm (--vllm_prewarm_kernels) beside it or before it, and on a warm Triton cache
#   async7b  issue 38 item 4: 7B one step off with truncated IS, 8 steps, split placement (0-3)
#   sbs7b_m16 rlrun alone at the sbs7b shape with micro-batches of 16: one lever of issue 38 item 2 (0-3)
#   sbs05    (one GPU, STEP1_GPU) the 0.5B colocated RLOO job of the 2026-11-24 figures: rlrun, OpenRLHF and
#            verl, 6 steps (SBS_SYSTEMS as above)
#   split7b  7B, policy + reference on GPUs 0-1 (--colocate_actor_ref), one TP-2 engine on 2-3: the weight
#            push's GB/s with the ZeRO-3 gather included (0-3)
#   async05  0.5B, policy, reference, engine on a GPU each: synchronous, then --async_train --is_correction
#            tis, same flags (0-2)
#   step1    (one GPU, STEP1_GPU, default 0) the colocated 0.5B job three times: a cold, then a warm compile
#            cache, then warm with --vllm_start_with_models; step 1's time each
#   multiturn (one GPU) bench/multiturn.py: the multi-turn rollout's overhead on a GPU engine, the tiny model's and
#            the 0.5B shape's
#   xnode    seed 003 in small (issue 36): the two-node miniature with ONE engine of TP 4 across both nodes,
#            site.yml + `rlrun submit` (0-3)
#   ppo7b    7b-ppo (GAE, critic, reference, the deployed reward service) on one node of 4 GPUs with the 7B
#            model, site.yml + `rlrun submit` (0-3)
#   logprob7b (1-2 GPUs) bench/gpu/logprob_check.py on the 7B model: vLLM eager and compiled, TP 1 (and TP 2 on
#            2 GPUs), against the trainer's bf16 and float32 forwards and its padded micro batches, token by
#            token (issue 38); on one GPU, inputs makes the 7B with MAKE7B=1
#   seed32b  32b-rloo-1node with a Qwen2.5-32B-shaped model (made by `inputs` with MAKE32=1), one node of 4
#            GPUs, site.yml + `rlrun submit` (0-3; H200s: 141 GB a GPU)
#   tools    (2 GPUs, TOOLS_GPUS) tiny-search through the trainer with vLLM engines and an evaluation, then with
#            the HF engine (bench/tool_curve.py): the multi-turn code on GPUs
#   pre      (x4) inputs, beside check1 on GPU 3 (PRE_MT=1: and multiturn, the 0.5B on GPU 1, tiny on 2)
#   par      (x4) logprob7b on 0-1, then multiturn on 0; beside tools on 2-3, then multiturn at the 0.5B shape with
#            CUDA graphs up to 2048 tokens on 2
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
root=$PWD
work=/tmp/rlpipe
res=$work/results
status=$work/status
export PYTHONPATH="/tmp/site:$root" PATH="/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
export RAY_USAGE_STATS_ENABLED=0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext TOKENIZERS_PARALLELISM=false
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-/tmp/rlpipe/vcache}  # the stages share vLLM's compile cache

params() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['params'])" "$1/params.json"; }

stage_selftest() {  # the pipeline's own mechanics, anywhere: bash bench/gpu/pipeline.sh start selftest
  echo "selftest in $PWD with $(python3 -V 2>&1)"; sleep 2
}

stage_inputs() {
  [ -f $work/m05/params.json ] || python3 bench/gpu/model.py $work/m05 || return 1
  if [ "$(nvidia-smi -L | wc -l)" -ge 4 ] || [ -n "${MAKE7B:-}" ]; then  # the 7B jobs need 4 GPUs; logprob7b 1
    [ -f $work/m7b/params.json ] || python3 bench/gpu/model.py $work/m7b --shape 7b --device cuda || return 1
  fi
  # TP 4 needs attention heads that 4 divides (Qwen2.5-0.5B has 14): the 0.5B shape with 16 heads of 64
  # (NO_H16=1: not made, for a loan whose stages do not use it)
  [ -n "${NO_H16:-}" ] || [ -f $work/m05h16/params.json ] || python3 bench/gpu/model.py $work/m05h16 \
    --hidden-size 1024 --num-attention-heads 16 --num-key-value-heads 4 || return 1
  python3 -m trainer.tiny dataset $work/data.jsonl --n 512 --kind copy --max-digits 4 >/dev/null
  # 65 GB of random weights: made on GPU 0 in seconds, written in ~1.5 min (on the host's CPUs the random
  # init alone took over 19 minutes, 2026-11-27)
  if [ -n "${MAKE32:-}" ] && [ ! -f $work/m32b/params.json ]; then
    python3 bench/gpu/model.py $work/m32b --shape 32b --device cuda || return 1
  fi
}

stage_xnode() {  # one engine of TP 4 over the two loopback nodes; the policy's weights reach it every step.
  # The supervised warm-up first: the random model earns no reward, so without it no step changes the weights
  # (2026-11-27 22:51: SUCCEEDED 3/3 with reward 0 and grad norm 0 throughout: nothing showed the push arrive);
  # with it, the engine's log-probs at step 1 match the warmed-up policy's only if the push reached it
  MODEL=$work/m05h16 ROLLOUT=vllm VLLM_TP=4 SUBMIT_TIMEOUT=480 \
    SETS="sft_warmup_steps=40 sft_learning_rate=3e-4 sft_output_key=answer" \
    bash bench/gpu/miniature/run.sh x4 "$res/xnode"
}

stage_xnode2() {  # two GPUs: xnode's job on nvidia-h200-x2, two loopback nodes of ONE GPU each (inventory-x2),
  # one engine of TP 2 across them with its TP workers preloaded (--vllm_preload_workers: their host actors on
  # the engine's bundles, one on each node; with the engine's core in its actor, without which nothing adopts
  # them: the first landing, 2026-11-29, ran the preset's spawned core), the warm-up first as in xnode, so that the engine's log-probs at
  # step 1 match the policy's only if the push reached both of its workers
  # (XNODE2_WARMUP: fewer warm-up steps, XNODE2_MORE: more settings, for a loan's last minutes)
  ROLLOUT=vllm VLLM_TP=2 SUBMIT_TIMEOUT=${XNODE2_TIMEOUT:-660} \
    SETS="vllm_preload_workers=true vllm_in_process=true sft_warmup_steps=${XNODE2_WARMUP:-40} sft_learning_rate=3e-4 \
          sft_output_key=answer ${XNODE2_MORE:-}" \
    bash bench/gpu/miniature/run.sh x2 "$res/xnode2"
  local rc=$?
  grep -h "start-up\|VllmWorkerHost\|preload" "$res/xnode2/job.log" 2>/dev/null | grep -v "^\s*$" | tail -8 | cut -c1-700
  return $rc
}

stage_ppo7b() {  # the supervised warm-up first: without it the random 7B earns no reward, and with the value
  # head starting at 0 every critic metric stays 0 (2026-11-27: SUCCEEDED, but nothing for the critic to learn)
  MODEL=$work/m7b PRESET=7b-ppo SUBMIT_TIMEOUT=600 SETS="actor_num_nodes=1 actor_num_gpus_per_node=4 \
    ref_num_nodes=1 ref_num_gpus_per_node=4 critic_num_nodes=1 critic_num_gpus_per_node=4 vllm_num_engines=4 \
    rollout_batch_size=32 micro_rollout_batch_size=8 train_batch_size=16 micro_train_batch_size=4 \
    critic_micro_train_batch_size=1 generate_max_len=256 prompt_max_len=128 max_steps=3 \
    vllm_gpu_memory_utilization=0.35 sft_warmup_steps=30 sft_learning_rate=1e-4 sft_output_key=answer" \
    bash bench/gpu/miniature/run.sh x4one "$res/ppo7b"
  rm -rf /tmp/rlrun-mini8x4one/out /tmp/rlrun-mini8x4one/out_critic  # 29 GB of final models: disk for the 32B
}

stage_logprob7b() {  # issue 38 item 4: vLLM at TP 1 and TP 2 against the trainer's forward, token by token
  # spawn: the bench touched CUDA before vLLM starts its engine core (2026-11-27: a forked one failed)
  # eager and compiled engines (a job's is compiled), the trainer one sequence at a time and in padded micro
  # batches as make_experience scores them; TP 2 where there are 2 GPUs
  local tp=(1 2)
  [ "$(nvidia-smi -L | wc -l)" -lt 2 ] && tp=(1)
  CUDA_VISIBLE_DEVICES=0,1 VLLM_WORKER_MULTIPROC_METHOD=spawn python3 bench/gpu/logprob_check.py \
    --model $work/m7b --tp "${tp[@]}" --engine eager compiled --prompts 16 --new-tokens 256 --micro 8 \
    --json "$res/logprob7b.json"
}

stage_seed32b() {
  [ -f $work/m32b/params.json ] || { echo "no 32B model in $work/m32b: run inputs with MAKE32=1"; return 1; }
  cat $work/m32b/params.json
  MODEL=$work/m32b PRESET=32b-rloo-1node SUBMIT_TIMEOUT=1000 SETS="rollout_batch_size=8 \
    micro_rollout_batch_size=4 train_batch_size=32 micro_train_batch_size=2 generate_max_len=256 \
    prompt_max_len=128 max_steps=3 enforce_eager=true" bash bench/gpu/miniature/run.sh x4one "$res/seed32b"
}

stage_mini() {
  ROLLOUT=vllm VLLM_TP=2 SUBMIT_TIMEOUT=300 FABRIC=1 bash bench/gpu/miniature/run.sh x4 "$res/mini"
}

stage_sbs7b() {  # 4 steps: rlrun's 4th runs under torch.profiler (--profile_step 4; left out of its medians).
  # Micro-batches of 16 for every system (SBS7B_MICRO=4: the first runs' 4 and 8): rlrun's train phase took
  # 3.66 s at 16 against 9.83 s at 4 (2026-11-27, sbs7b_m16). rlrun with the levers that change no result
  # (SBS7B_LEVERS= for none): the whole reference on each GPU (--ref_zero_stage 0) and 1 GiB push buckets; 7.19 s
  # a step with them and --old_logprobs rollout, against 8.81 s without (2026-11-28). Every system's engines at
  # 0.30 of the card (the shape's KV cache needs ~2.4 GB a GPU; 0.45 before 2026-11-28)
  local systems=${SBS_SYSTEMS:-rlrun,openrlhf,verl} micro=${SBS7B_MICRO:-16}
  local levers=${SBS7B_LEVERS---ref_zero_stage 0 --sync_bucket_bytes 1073741824}
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl \
    --out "$res/${SBS7B_OUT:-sbs7b}${SBS_SYSTEMS:+_${SBS_SYSTEMS//,/_}}" --systems "$systems" --gpus 4 --engines 2 --tp 2 ${SBS7B_MORE:-} \
    --grad-ckpt --prompts 32 --n 4 --new-tokens 512 --steps 4 --micro-train "$micro" \
    --micro-rollout "$(( micro > 8 ? micro : 8 ))" \
    --gpu-util "${SBS7B_GPU_UTIL:-0.30}" --params "$(params $work/m7b)" --deadline "${SBS7B_DEADLINE:-1200}" \
    --system-deadline "${SBS7B_SYSTEM_DEADLINE:-420}" \
    --target-ratio 0.5 --target-step 8 --rlrun-extra="--profile_step 4 $levers"
}

stage_sbs7b_liger() {  # issue 38 items 2-3: as sbs7b (rlrun's exact levers, OpenRLHF beside it), with Liger's fused
  # kernels in every system (--liger: rlrun --use_liger_kernel, OpenRLHF --ds.use_liger_kernel; the element-wise
  # kernels were 0.34 of the reference forward's 1.10 s of device time, 2026-11-28) and every system's engines at
  # 0.15 of the card (the KV cache's wake and the sleep halve: sync 0.453 s, sleep 0.11 s in sbs7b_inproc)
  SBS7B_GPU_UTIL=${SBS7B_GPU_UTIL:-0.15} SBS7B_OUT=sbs7b_liger SBS7B_MORE=--liger stage_sbs7b
}

stage_sbs7b_kl() {  # issue 38 items 1-3: as sbs7b_liger, with the KL (k3, 0.02) as a loss term in every system
  # instead of k1 in the reward (side_by_side.py --kl-loss), so that rlrun's make_experience can leave out the
  # old policy's forward (--old_logprobs train: with one optimizer step per rollout the train step's own
  # log-probs are the old ones; OpenRLHF and verl still run that forward). make_experience was 2.06 s at 7B,
  # its policy and reference forwards sharing the GPUs (1.30 and 1.08 s, 2026-11-28); target <= 1 s. verl's
  # start-up is ~4.5 min at 0.5B, so each system gets up to 520 s (three of them: ~1,150 s of the stage)
  SBS7B_DEADLINE=${SBS7B_DEADLINE:-1560} SBS7B_SYSTEM_DEADLINE=${SBS7B_SYSTEM_DEADLINE:-520} \
    SBS7B_GPU_UTIL=${SBS7B_GPU_UTIL:-0.15} SBS7B_OUT=sbs7b_kl SBS7B_MORE="--liger --kl-loss" \
    SBS7B_LEVERS="--ref_zero_stage 0 --sync_bucket_bytes 1073741824 --old_logprobs train" stage_sbs7b
}

stage_step1_7b() {  # issue 38 item 2, step 1 alone (<= 60 s cold): the 7B and its prompts made here (7B on GPU 0),
  # then rlrun alone as in sbs7b_kl with its engines starting while the models load (--vllm_start_with_models)
  # and each engine's core in its actor (--vllm_in_process), 2 steps, cold compile cache. For a loan's last
  # minutes: STEP1_OUT puts the run's files where the device call returns them as they are written. Micro rollout
  # batches of 32: one reference forward of a rank's 32 rows, as every run before 2026-11-29 did (the flag was not
  # honoured then: a rank's whole shard went through one forward)
  [ -f $work/m7b/params.json ] || python3 bench/gpu/model.py $work/m7b --shape 7b --device cuda || return 1
  python3 -m trainer.tiny dataset $work/data.jsonl --n 512 --kind copy --max-digits 4 >/dev/null || return 1
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl \
    --out "${STEP1_OUT:-$res}/step1_7b${STEP1_NAME:+_$STEP1_NAME}" \
    --systems rlrun --gpus "${STEP1_GPUS:-4}" --engines "${STEP1_ENGINES:-2}" --tp 2 --grad-ckpt --liger --kl-loss \
    --prompts 32 --n 4 --new-tokens 512 --steps "${STEP1_STEPS:-2}" --micro-train 16 --micro-rollout 32 \
    --gpu-util 0.15 --params "$(params $work/m7b)" \
    --deadline "${STEP1_DEADLINE:-260}" --system-deadline "${STEP1_DEADLINE:-260}" \
    --rlrun-extra="${STEP1_INPROC---vllm_in_process} --vllm_start_with_models --ref_zero_stage 0 --sync_bucket_bytes 1073741824 --old_logprobs train ${STEP1_MORE:-}"
}

step1_cold() {  # step1_cold NAME STEPS DEADLINE "MORE FLAGS" [INPROC]: one step1_7b run with vLLM's, Inductor's and
  # Triton's caches of its own under $work/cold_NAME (each run cold); INPROC replaces --vllm_in_process ("": none)
  VLLM_CACHE_ROOT=$work/cold_$1/vllm TORCHINDUCTOR_CACHE_DIR=$work/cold_$1/inductor \
    TRITON_CACHE_DIR=$work/cold_$1/triton STEP1_NAME=$1 STEP1_STEPS=$2 STEP1_DEADLINE=$3 STEP1_MORE="$4" \
    STEP1_INPROC="${5---vllm_in_process}" stage_step1_7b
}

stage_step1_modes() {  # issue 38 item 2, step 1 (<= 60 s cold) by --vllm_compile: step1_7b (the engines started
  # before the models' workers since 2026-11-28's loan) once per mode, 4 steps each (the later steps show what a
  # mode costs generate), each one cold
  local mode
  for mode in ${STEP1_MODES:-none dynamo inductor}; do
    step1_cold $mode 4 300 "--vllm_compile $mode"
    echo "step1_modes: $mode rc=$?"
  done
}

stage_step1_prime() {  # issue 38 item 2, step 1 (<= 60 s cold): step1_modes's fastest start (--vllm_compile none,
  # 64.7 s on 2026-11-28's thirteenth loan: make_experience 4.7 and train 9.7 s of it, against 1.1 and 2.8 s
  # later) with the models primed while the engines start (--prime_models: ModelWorker.prime), then without:
  # both in one loan, each cold; 5 steps each
  step1_cold primed 5 300 "--vllm_compile none --prime_models"; echo "step1_prime: primed rc=$?"
  step1_cold unprimed 5 300 "--vllm_compile none"; echo "step1_prime: unprimed rc=$?"
}

stage_step1_split() {  # issue 38 item 2, what is left of step 1 (60.7-64.7 s with --vllm_compile none, 2026-11-28):
  # (profile) the same job with step 1's make_experience and train under torch.profiler (--profile_step 1: the
  # policy's first train phase was ~4 s over the later ones with its kernels primed, so not their first use),
  # then (engine_proc) without --vllm_in_process, to tell which start-up flag costs the steady step its
  # ~0.8 s over sbs7b_kl's (generate 2.6 against 2.18 s). Each cold; 5 steps each
  step1_cold profile 5 330 "--vllm_compile none --profile_step 1"; echo "step1_split: profile rc=$?"
  step1_cold engine_proc 5 330 "--vllm_compile none" ""; echo "step1_split: engine_proc rc=$?"
}

stage_step1_prewarm() {  # issue 38 item 2, step 1 (<= 60 s cold; 60.7-64.7 s on 2026-11-28): the kernel prewarm
  # (--vllm_prewarm_kernels) against the ~17 s of Triton compiles at the end of the engines' start. On one H200 a
  # 7B-shaped engine whose kernels its prewarm had compiled first was ready in 32.9 s against 54.1 s cold, but a
  # prewarm beside a TP-1 engine gained nothing: the copy took as long to start as the engine (52.5 s). Here the
  # driver's copy starts before Ray (trainer.loop.head_prewarm), ~25 s before the engines' processes, whose TP
  # workers take ~27 s more; the engines' own copies find the lock or the marker. First (preload) with the TP
  # workers' processes started, and importing vLLM, with the engines' own as well (--vllm_preload_workers: a
  # 7B-shaped engine of TP 2 ready in 33 s against 55 s on two H200s, 2026-11-29). Each cold; 5 steps each.
  # STEP1_PREWARM_RUNS picks some (default all three, ~1,000 s; "preload plain" ~680 s)
  local run
  for run in ${STEP1_PREWARM_RUNS:-preload prewarm plain}; do
    case $run in
      preload) step1_cold preload 5 330 "--vllm_compile none --vllm_prewarm_kernels --vllm_preload_workers" ;;
      prewarm) step1_cold prewarm 5 330 "--vllm_compile none --vllm_prewarm_kernels" ;;
      plain) step1_cold plain 5 330 "--vllm_compile none" ;;
      *) echo "step1_prewarm: no run $run (preload, prewarm, plain)"; continue ;;
    esac
    echo "step1_prewarm: $run rc=$?"
  done
}

stage_step1_x2() {  # two GPUs, ~11 min: step1_prewarm's job where only two GPUs are lent (issue 38 item 2's
  # target is the 4-GPU job's; this is not it): the 7B job of step1_7b on two training ranks and ONE engine of TP 2,
  # 60 % of the optimizer's fp32 state on the host (--adam_offload_ratio 0.6, as one7b: all of it on two GPUs
  # would not fit beside the engine and the whole reference), DeepSpeed's cpu_adam built first (as the role
  # does), each run cold, 3 steps: (preload) with both start-up levers, the first time through the trainer at
  # 7B with real weights; (plain) with neither. STEP1X2_RUNS picks some
  python3 -m trainer.deepspeed_ops cpu_adam 2>"$res/step1_x2_ops.err" | sed 's/^/step1_x2: cpu_adam /'
  local run flags
  for run in ${STEP1X2_RUNS:-preload plain}; do
    case $run in
      preload) flags="--vllm_compile none --vllm_prewarm_kernels --vllm_preload_workers" ;;
      plain) flags="--vllm_compile none" ;;
      *) echo "step1_x2: no run $run (preload, plain)"; continue ;;
    esac
    STEP1_GPUS=2 STEP1_ENGINES=1 step1_cold "x2_$run" 3 330 "$flags --adam_offload --adam_offload_ratio 0.6"
    echo "step1_x2: $run rc=$?"
    grep -h "start-up\|TP worker\|preload\|engine shutdown" "$res/step1_7b_x2_$run/rlrun.log" 2>/dev/null | cut -c1-900
  done
}

stage_check2() {  # two GPUs, ~2 min a run: the tiny model through the colocated loop with one vLLM engine of TP 2,
  # with the 7B step-1 job's start-up flags (--vllm_start_with_models --vllm_in_process --vllm_prewarm_kernels):
  # (preload) its workers preloaded (--vllm_preload_workers): the trainer's path to the adopted workers (weights
  # pushed to them in place, sleep and wake); (plain) without. 3 steps each; the start-up line shows the workers'
  # marks, the log how long the engine's shutdown took
  local m=$work/tiny rc=0 run
  [ -f $m/config.json ] || python3 -m trainer.tiny model $m >/dev/null || return 1
  python3 -m trainer.tiny dataset $work/tiny.jsonl --n 16 --kind copy >/dev/null || return 1
  for run in ${CHECK2_RUNS:-preload plain}; do
    local extra=()
    [ $run = preload ] && extra=(--vllm_preload_workers)
    mkdir -p "$res/check2_$run"
    CUDA_VISIBLE_DEVICES=${PRELOAD2_GPUS:-0,1} timeout 400 python3 -m trainer.train_ppo_ray --pretrain $m \
      --prompt_data $work/tiny.jsonl --input_key message --label_key answer --apply_chat_template \
      --reward_fn tests.integration.loop_rewards:has_one --rollout_backend vllm --vllm_num_engines 1 \
      --vllm_tensor_parallel_size 2 --colocate_all_models --vllm_enable_sleep --vllm_gpu_memory_utilization 0.3 \
      --enforce_eager --actor_num_nodes 1 --actor_num_gpus_per_node 2 --ref_num_nodes 1 --ref_num_gpus_per_node 2 \
      --advantage_estimator rloo --n_samples_per_prompt 4 --rollout_batch_size 4 --micro_rollout_batch_size 2 \
      --micro_train_batch_size 2 --train_batch_size 16 --generate_max_len 16 --prompt_max_len 64 --max_samples 12 \
      --num_episodes 1 --zero_stage 3 --bf16 --init_kl_coef 0.01 --old_logprobs train --use_kl_loss \
      --vllm_in_process --vllm_start_with_models --vllm_prewarm_kernels "${extra[@]}" \
      --save_path $work/check2_$run 2>&1 | while IFS= read -r line; do echo "$(date +%T) $line"; done \
      >"$res/check2_$run/job.log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    cp $work/check2_$run/metrics.jsonl "$res/check2_$run/" 2>/dev/null
    grep -h "TP worker\|start-up\|engine shutdown\|saved " "$res/check2_$run/job.log" | tail -6 | cut -c1-600
    tail -2 "$res/check2_$run/job.log" | cut -c1-300
  done
  return $rc
}

stage_preload2() {  # two GPUs, ~8 min: as preload1 at TP 2 with the 7B shape (dummy weights), the engines of the
  # 7B job's step 1 (vLLM's Ray executor, two workers, NCCL and the custom all-reduce between them)
  CUDA_VISIBLE_DEVICES=${PRELOAD2_GPUS:-0,1} python3 bench/gpu/preload_bench.py --shape 7b --tp 2 --out $work/preload2
  local rc=$?
  cp $work/preload2/summary.json "$res/preload2_summary.json" 2>/dev/null
  for r in plain1 preload1 plain2 preload2; do grep -hE "TP worker|RayWorkerProc|Error|init engine" \
    $work/preload2/$r/engine.log 2>/dev/null | tail -5 | sed "s|^|$r: |"; done
  return $rc
}

stage_preload1() {  # one GPU, ~5 min: --vllm_preload_workers's mechanics and what it takes off a worker's start:
  # bench/gpu/preload_bench.py, a 0.5B-shaped engine (dummy weights) through vLLM's Ray executor at TP 1, its worker
  # preloaded or not, alternating after a first run that warms every cache
  CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} python3 bench/gpu/preload_bench.py --shape 0.5b --out $work/preload1
  local rc=$?
  cp $work/preload1/summary.json "$res/preload1_summary.json" 2>/dev/null
  for r in plain1 preload1 plain2 preload2; do grep -hE "TP worker|RayWorkerProc|Error" \
    $work/preload1/$r/engine.log 2>/dev/null | tail -4 | sed "s|^|$r: |"; done
  return $rc
}

stage_sbs7b_levers() {  # issue 38 item 2, the next levers, each on its own phase: as sbs7b's rlrun (micro-batches
  # of 16) with a reference that keeps its whole weights on each GPU (--ref_zero_stage 0: no gathers in its
  # forwards; make_experience), the engines' log-probs as the old ones (--old_logprobs rollout: no policy forward
  # in make_experience; an approximation, verl's bypass mode, so never in the side-by-side), and weight-push
  # buckets of 1 GiB, not 256 MiB (57 -> 15 round trips; sync, whose parts sync/*_s show). The engines at 0.30
  # of the card, not 0.45: the shape's KV cache needs ~2.4 GB a GPU, and the whole reference 15 GB more than
  # its ZeRO-3 shard (sbs7b peaked at 133,957 of 143,771 MiB). Compare with sbs7b's rlrun of the same loan
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl --out "$res/sbs7b_levers" \
    --systems rlrun --gpus 4 --engines 2 --tp 2 --grad-ckpt --prompts 32 --n 4 --new-tokens 512 --steps 4 \
    --micro-train 16 --micro-rollout 16 --gpu-util 0.30 --params "$(params $work/m7b)" --deadline 420 \
    --target-step 8 --rlrun-extra="--profile_step 4 --ref_zero_stage 0 --old_logprobs rollout --sync_bucket_bytes 1073741824"
}

stage_sbs7b_inproc() {  # issue 38 item 2, step 1 (<= 60 s cold): as sbs7b's rlrun (its exact levers) with the
  # engines starting while the models load (--vllm_start_with_models: they waited for the models' 86 s) and each
  # engine's core in its actor's process (--vllm_in_process: one process start and vLLM import less of the ~57 s
  # an engine spent starting processes). Run it before any other 7B stage for a cold compile cache. The engines
  # at 0.15 of the card (~11 GB of KV cache a GPU for a 2.4 GB need): the sync's last part (finish, 0.21 s at
  # 0.30) is mostly the KV cache's wake, and the sleep frees it; both should shrink with it
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl --out "$res/sbs7b_inproc" \
    --systems rlrun --gpus 4 --engines 2 --tp 2 --grad-ckpt --prompts 32 --n 4 --new-tokens 512 --steps 3 \
    --micro-train 16 --micro-rollout 16 --gpu-util 0.15 --params "$(params $work/m7b)" --deadline 360 \
    --rlrun-extra="--vllm_in_process --vllm_start_with_models --ref_zero_stage 0 --sync_bucket_bytes 1073741824"
}

stage_sbs7b_m16() {  # issue 38 item 2, one lever: rlrun alone at the sbs7b shape with micro-batches of 16 (4x fewer
  # ZeRO-3 gathers per step), the rest as sbs7b; step 3 profiled
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl --out "$res/sbs7b_m16" \
    --systems rlrun --gpus 4 --engines 2 --tp 2 --grad-ckpt --prompts 32 --n 4 --new-tokens 512 --steps 3 \
    --micro-train 16 --micro-rollout 16 --gpu-util 0.45 --params "$(params $work/m7b)" --deadline 400 \
    --rlrun-extra="--profile_step 3"
}

stage_sbs05() {
  local systems=${SBS_SYSTEMS:-rlrun,openrlhf,verl}
  CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} python3 bench/gpu/side_by_side.py --model $work/m05 \
    --data $work/data.jsonl --out "$res/sbs05${SBS_SYSTEMS:+_${SBS_SYSTEMS//,/_}}" --systems "$systems" \
    --steps 6 --params "$(params $work/m05)" --deadline 840 --system-deadline ${SBS_SYSTEM_DEADLINE:-330} \
    --target-ratio 0.8 --target-step 6
}

stage_split7b() {
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl --out "$res/split7b" \
    --systems rlrun --placement actor-ref --gpus 2 --engines 1 --tp 2 --grad-ckpt --prompts 32 --n 4 \
    --new-tokens 512 --steps 2 --micro-train 4 --micro-rollout 8 --gpu-util 0.85 --params "$(params $work/m7b)" \
    --deadline 300 --rlrun-extra="--sync_bucket_bytes 1073741824"
}

stage_async7b() {  # issue 38 item 4: TIS keeping an async 7B run stable. split7b's placement (policy and reference
  # on GPUs 0-1, one engine of TP 2 on 2-3) one step off (--async_train) with truncated IS, 8 steps: the engines'
  # mismatch, the IS weights (policy/is_weight, is_filtered) and the grad norm by step
  python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl --out "$res/async7b" \
    --systems rlrun --placement actor-ref --gpus 2 --engines 1 --tp 2 --grad-ckpt --prompts 32 --n 4 \
    --new-tokens 512 --steps 8 --micro-train 16 --micro-rollout 16 --gpu-util 0.85 --params "$(params $work/m7b)" \
    --deadline 400 --rlrun-extra="--async_train --is_correction tis --sync_bucket_bytes 1073741824"
}

stage_check1() {  # one GPU, ~4 min: the tiny model through the colocated loop with this session's GPU-side code:
  # --old_logprobs rollout with --profile_step, a whole reference and small push buckets (the push by part,
  # timing/forward/*), then --old_logprobs train with a KL loss, the engine's core in-process and Liger's
  # kernels in the policy and reference (--use_liger_kernel), the kernel prewarm (--vllm_prewarm_kernels: the
  # driver's copy before Ray, then the engine's own, which finds the lock or the marker); (early) the same with
  # the engine started before the models (--vllm_start_with_models), as issue 38's 7B job runs: its copies find
  # the train run's marker. Eager engines. Each run has 400 s: beside inputs and two multi-turn benches (PRE_MT)
  # the first one's engine took 4 min to start, and 240 s stopped it (2026-11-28)
  local m=$work/tiny rc=0
  [ -f $m/config.json ] || python3 -m trainer.tiny model $m >/dev/null || return 1
  python3 -m trainer.tiny dataset $work/tiny.jsonl --n 16 --kind copy >/dev/null || return 1
  local base=(--pretrain $m --prompt_data $work/tiny.jsonl --input_key message --label_key answer
              --apply_chat_template --reward_fn tests.integration.loop_rewards:has_one --rollout_backend vllm
              --vllm_num_engines 1 --vllm_tensor_parallel_size 1 --colocate_all_models --vllm_enable_sleep
              --vllm_gpu_memory_utilization 0.3 --enforce_eager --actor_num_nodes 1 --actor_num_gpus_per_node 1
              --ref_num_nodes 1 --ref_num_gpus_per_node 1 --advantage_estimator rloo --n_samples_per_prompt 4
              --rollout_batch_size 4 --micro_rollout_batch_size 4 --micro_train_batch_size 4 --generate_max_len 16
              --prompt_max_len 64 --max_samples 12 --num_episodes 1 --zero_stage 3 --bf16 --init_kl_coef 0.01)
  for run in ${CHECK1_RUNS:-rollout train early}; do
    local extra=(--old_logprobs rollout --train_batch_size 8 --profile_step 2 --ref_zero_stage 0
                 --sync_bucket_bytes 300000)
    [ $run != rollout ] && extra=(--old_logprobs train --use_kl_loss --train_batch_size 16 --vllm_in_process --vllm_prewarm_kernels
                                  --use_liger_kernel)
    [ $run = early ] && extra+=(--vllm_start_with_models)
    mkdir -p "$res/check1_$run"
    CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} timeout 400 python3 -m trainer.train_ppo_ray "${base[@]}" "${extra[@]}" \
      --save_path $work/check1_$run >"$res/check1_$run/job.log" 2>&1 || rc=1
    cp $work/check1_$run/metrics.jsonl "$res/check1_$run/" 2>/dev/null
    grep -h "kernel prewarm\|^start-up" "$res/check1_$run/job.log" | tail -3
    tail -3 "$res/check1_$run/job.log"
  done
  return $rc
}

stage_one7b() {  # one GPU (issue 38 item 5: "a 7B colocated job with --adam_offload needs about 61 GB on the GPU
  # ... try it first"): the 7B job of step1_7b on ONE GPU, one engine of TP 1, 60 % of the optimizer's fp32 state
  # on the host (--adam_offload_ratio 0.6: all of it is ~91 GB of the host's 128 GiB), micro-batches of 8,
  # ONE7B_STEPS steps (5: two landings of 2026-11-29 ran out of memory in steps 2 and 3, before the forwards
  # honoured --micro_rollout_batch_size); the host's memory sampled beside it. Also: make_experience's parts
  # (timing/make_experience/*) with one reference rank, against 0.36-0.45 s outside the forward with four
  # (2026-11-28)
  [ -f $work/m7b/params.json ] || python3 bench/gpu/model.py $work/m7b --shape 7b --device cuda || return 1
  python3 -m trainer.tiny dataset $work/data.jsonl --n 512 --kind copy --max-digits 4 >/dev/null || return 1
  (while sleep 2; do free -m | awk -v t="$(date +%T)" '/Mem:/ {print t, "host used MiB", $3}'; done) \
    > "$res/one7b_host.txt" 2>&1 &
  local sampler=$!
  CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} python3 bench/gpu/side_by_side.py --model $work/m7b --data $work/data.jsonl \
    --out "$res/one7b" --systems rlrun --gpus 1 --engines 1 --tp 1 --grad-ckpt --liger --kl-loss --prompts 32 \
    --n 4 --new-tokens 512 --steps ${ONE7B_STEPS:-5} --micro-train 8 --micro-rollout 16 --gpu-util 0.15 \
    --params "$(params $work/m7b)" --deadline 480 --system-deadline 480 \
    --rlrun-extra="--vllm_in_process --vllm_start_with_models --ref_zero_stage 0 --old_logprobs train --adam_offload --adam_offload_ratio 0.6"
  local rc=$?
  kill $sampler
  sort -k5 -n "$res/one7b_host.txt" | tail -1 | sed 's/^/one7b: peak /'
  return $rc
}

stage_one7b_ops() {  # one GPU, ~6 min: ray_node__deepspeed_ops on the GPU machine: trainer.deepspeed_ops builds
  # cpu_adam as the role does at provisioning (its seconds: what the first --adam_offload job on a node paid),
  # then the 7B job of one7b, 2 steps, whose policy's loaded -> optimizer marks say whether it compiled it again
  # (2026-11-29: loaded -> ready took 121 s with the build inside), then the tool once more ("cached")
  python3 -m trainer.deepspeed_ops cpu_adam 2>"$res/one7b_ops_build.err" | sed 's/^/one7b_ops: before the job: /'
  tail -3 "$res/one7b_ops_build.err"
  ONE7B_STEPS=2 stage_one7b
  local rc=$?
  python3 -m trainer.deepspeed_ops cpu_adam 2>/dev/null | sed 's/^/one7b_ops: after the job: /'
  grep -h "^start-up" "$res/one7b/rlrun.log" 2>/dev/null
  return $rc
}

stage_outputs1() {  # one GPU, ~3 min: what vLLM's per-step detokenization cost generate (bench/rollout_output.py)
  # on the 0.5B (its vocabulary and tokenizer are the 7B job's; the saving is per token, not per parameter), as
  # one engine of the 7B job generates: 16 prompts x 4 samples x 512 tokens, in-process (--vllm_in_process),
  # then with the core in a process of its own
  CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} python3 bench/rollout_output.py --model $work/m05 --prompts 16 --n 4 \
    --tokens 512 --repeat 4 2>&1 | tail -4
  CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} python3 bench/rollout_output.py --model $work/m05 --prompts 16 --n 4 \
    --tokens 512 --repeat 4 --out-of-process 2>&1 | tail -4
}

stage_prewarm() {  # one GPU, ~5 min: issue 38 item 2 (step 1 <= 60 s cold), the lever for the ~17 s of Triton
  # compiles at the end of an engine's start: bench/gpu/prewarm_bench.py at the 7B shape (dummy weights, TP 1), a
  # cold engine against the same with --vllm_prewarm_kernels's child first, beside it, and on a warm cache
  CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} python3 bench/gpu/prewarm_bench.py --shape 7b --out $work/prewarm
  cp $work/prewarm/summary.json "$res/prewarm_summary.json" 2>/dev/null
  for r in cold child_first beside warm; do grep -hE "Triton|kernel prewarm|init engine|took" \
    $work/prewarm/$r/engine.log 2>/dev/null | tail -8 | sed "s|^|$r: |"; done
}

stage_async05() {
  local common=(--model $work/m05 --data $work/data.jsonl --systems rlrun --placement split --gpus 1 --engines 1
                --tp 1 --prompts 16 --n 4 --new-tokens 256 --steps 10 --gpu-util 0.85 --deadline 260
                --params "$(params $work/m05)")
  CUDA_VISIBLE_DEVICES=0,1,2 python3 bench/gpu/side_by_side.py "${common[@]}" --out "$res/sync05"
  CUDA_VISIBLE_DEVICES=0,1,2 python3 bench/gpu/side_by_side.py "${common[@]}" --out "$res/async05" \
    --rlrun-extra="--async_train --is_correction tis"
}

stage_step1() {  # one GPU: the colocated 0.5B job with a cold, then a warm compile cache, then warm + early start
  export CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} VLLM_CACHE_ROOT=$work/vcache
  local runs=${STEP1_RUNS:-cold warm overlap}
  [[ $runs == cold* ]] && rm -rf $work/vcache
  for run in $runs; do
    extra=()
    [ $run = overlap ] && extra=(--rlrun-extra=--vllm_start_with_models)
    python3 bench/gpu/side_by_side.py --model $work/m05 --data $work/data.jsonl --out "$res/step1_$run" \
      --systems rlrun --steps 3 --deadline 200 "${extra[@]}" >"$res/step1_$run.log" 2>&1
    grep -E "step 1|rlrun:|colocated step" "$res/step1_$run.log"
  done
}

stage_step1_prewarm1() {  # one GPU, ~7 min: the kernel prewarm's head start at TP 1 (issue 38 item 2). The colocated
  # 0.5B job (its vocabulary is the 7B's: the same sampler kernels) with the engine started beside the models
  # (--vllm_start_with_models --vllm_in_process --vllm_compile none), with --vllm_prewarm_kernels, then without,
  # each with vLLM's, Inductor's and Triton's caches of its own (cold), 3 steps. Beside a TP-1 engine the
  # engine's own copy gained nothing (fourteenth loan); the driver's starts ~24 s earlier. STEP1_RUNS picks the
  # runs and their order, STEP1_TAG names a repetition (its own caches and results)
  export CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0}
  local run more
  [ -f $work/m05/params.json ] || python3 bench/gpu/model.py $work/m05 || return 1
  python3 -m trainer.tiny dataset $work/data.jsonl --n 512 --kind copy --max-digits 4 >/dev/null || return 1
  for run in ${STEP1_RUNS:-prewarm plain}; do
    more="--vllm_start_with_models --vllm_in_process --vllm_compile none"
    [ $run = prewarm ] && more+=" --vllm_prewarm_kernels"
    VLLM_CACHE_ROOT=$work/cold1_$run${STEP1_TAG:-}/vllm TORCHINDUCTOR_CACHE_DIR=$work/cold1_$run${STEP1_TAG:-}/inductor \
      TRITON_CACHE_DIR=$work/cold1_$run${STEP1_TAG:-}/triton python3 bench/gpu/side_by_side.py --model $work/m05 \
      --data $work/data.jsonl --out "$res/step1p_$run${STEP1_TAG:-}" --systems rlrun --steps 3 --deadline 260 \
      --rlrun-extra="$more" >"$res/step1p_$run${STEP1_TAG:-}.log" 2>&1
    echo "step1_prewarm1: $run rc=$?"
    grep -E "step 1|rlrun:|colocated step" "$res/step1p_$run${STEP1_TAG:-}.log"
    grep -h "^start-up\|kernel prewarm\|init engine" "$res/step1p_$run${STEP1_TAG:-}/rlrun.log" | cut -c1-900 | tail -3
  done
}

gpu_free() {  # gpu_free [IDS]: wait (<= 120 s) until the GPUs (IDS: those, e.g. 2,3) hold < 2 GiB each: the last
  # stage's processes are gone
  local end=$(( $(date +%s) + 120 )) ids=()
  [ -n "${1:-}" ] && ids=(-i "$1")
  while [ "$(date +%s)" -lt "$end" ]; do
    nvidia-smi "${ids[@]}" --query-gpu=memory.used --format=csv,noheader,nounits | awk '$1 > 2048 {busy=1} END {exit busy}' && return 0
    sleep 3
  done
  echo "GPUs still busy: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' ')"
}

stage_multiturn() {  # one GPU: the multi-turn rollout's overhead over one pass of the same tokens (issue 33)
  gpu_free "${STEP1_GPU:-0}"
  # spawn: the bench touched CUDA before vLLM starts its engine core (a forked child cannot initialise it)
  # the 0.5B shape, then the demos' tiny model (issue 39: both, each beside one pass of the same tokens; MT_ONLY05:
  # the 0.5B alone; MT_MODELS: which of the two), each once per engine CUDA-graph mode in MT_MODES ("-": vLLM's
  # own, the default; full: the steps with a prefill in whole graphs too) and per --rejoin-steps in MT_REJOIN
  # ("-": the job's default); MT_CAPTURE: the engine's largest CUDA graph, tokens (vLLM's 512)
  local capture=() mode model rejoin rc=0
  [ -n "${MT_CAPTURE:-}" ] && capture=(--capture "$MT_CAPTURE")
  local models=${MT_MODELS:-m05 tiny}
  [ -n "${MT_ONLY05:-}" ] && models=m05
  for model in $models; do
    for mode in ${MT_MODES:--}; do
      for rejoin in ${MT_REJOIN:--}; do
        local how=()
        [ "$mode" != - ] && how=(--cudagraph-mode "$mode")
        [ "$rejoin" != - ] && how+=(--rejoin-steps "$rejoin")
        [ "$model" = m05 ] && how+=(--model $work/m05 --teach-lr 3e-4)
        echo "== $model, CUDA graphs: $mode, rejoin steps: $rejoin"
        CUDA_VISIBLE_DEVICES=${STEP1_GPU:-0} VLLM_WORKER_MULTIPROC_METHOD=spawn python3 bench/multiturn.py \
          --repeats 7 "${capture[@]}" "${how[@]}" || rc=1
      done
    done
  done
  return $rc
}

stage_tools() {  # issue 37: the multi-turn code on GPUs through the trainer and Ray actors: tiny-search with vLLM
  # engines (Engines.generate_with_tools, the evaluator's multi-turn pass, the loop), then with the HF engine
  # (HfEngine.complete's turns). TOOLS_GPUS: two GPUs (the policy's and the engine's; default 0,1)
  # (one GPU: the engine colocated with the policy, asleep while it trains). The runs' logs and metrics go to results.
  local gpus=${TOOLS_GPUS:-0,1} one=() rc=0
  gpu_free "$gpus"
  [[ $gpus != *,* ]] && one=(--set colocate_all_models=true --set vllm_enable_sleep=true
                             --set vllm_gpu_memory_utilization=0.3)
  local q=$work/tools/build/tiny/search-copy1/questions.jsonl
  CUDA_VISIBLE_DEVICES=$gpus python3 bench/tool_curve.py tiny-search --keep $work/tools --every 2 "${one[@]}" \
    --set max_steps=${TOOLS_STEPS:-10} --set eval_data=$q --set eval_steps=5 --set eval_at_start=true || rc=1
  mkdir -p "$res/tools_vllm" && cp $work/tools/run1.log $work/tools/run1/metrics.jsonl "$res/tools_vllm/" 2>/dev/null
  if [ -z "${TOOLS_VLLM_ONLY:-}" ]; then
    CUDA_VISIBLE_DEVICES=$gpus python3 bench/tool_curve.py tiny-search --keep $work/tools_hf --every 1 "${one[@]}" \
      --set max_steps=3 --set rollout_backend=hf --set vllm_num_engines=0 --set enable_prefix_caching=false || rc=1
    mkdir -p "$res/tools_hf" && cp $work/tools_hf/run1.log $work/tools_hf/run1/metrics.jsonl "$res/tools_hf/" 2>/dev/null
  fi
  return $rc
}

stage_par() {  # x4: logprob7b (GPUs 0-1) and then multi-turn at vLLM's default graphs (GPU 0), beside tools (2-3) and
  # then multi-turn at the 0.5B shape with graphs up to 2048 tokens (GPU 2): 4 stages' GPU work in the time of 2
  ( stage_logprob7b >"$res/logprob7b.log" 2>&1; echo "logprob7b rc=$?"
    STEP1_GPU=0 stage_multiturn >"$res/multiturn.log" 2>&1; echo "multiturn rc=$?" ) &
  ( TOOLS_GPUS=2,3 stage_tools >"$res/tools.log" 2>&1; echo "tools rc=$?"
    STEP1_GPU=2 MT_CAPTURE=2048 MT_ONLY05=1 stage_multiturn >"$res/multiturn2048.log" 2>&1
    echo "multiturn2048 rc=$?" ) &
  wait
  grep -h "rc=" "$res"/par.log 2>/dev/null | grep -qv "rc=0" && return 1
  return 0
}

stage_pre() {  # x4: inputs (the 7B made on GPU 0) beside check1 on GPU 3 (eager engines: the compile cache stays
  # cold for sbs7b_inproc): two stages' work in the time of one (with PRE_MT=1, three)
  ( stage_inputs >"$res/inputs.log" 2>&1; echo "inputs rc=$?" ) &
  local inputs=$!
  ( STEP1_GPU=3 stage_check1 >"$res/check1.log" 2>&1; echo "check1 rc=$?" ) &
  if [ -n "${PRE_MT:-}" ]; then  # PRE_MT=1: multiturn too: the tiny model on GPU 2, and on GPU 1 the 0.5B once
    # inputs has made it (first, on GPU 0)
    ( STEP1_GPU=2 MT_MODELS=tiny stage_multiturn >"$res/multiturn_tiny.log" 2>&1; echo "multiturn_tiny rc=$?" ) &
    ( while [ ! -f $work/m05/params.json ] && kill -0 $inputs 2>/dev/null; do sleep 5; done
      STEP1_GPU=1 MT_MODELS=m05 stage_multiturn >"$res/multiturn.log" 2>&1; echo "multiturn rc=$?" ) &
  fi
  wait
  grep -h "rc=" "$res"/pre.log 2>/dev/null | grep -qv "rc=0" && return 1
  return 0
}

run_stage() {  # run_stage NAME SECONDS: the stage within its deadline, its exit code and seconds in $status
  [ "$1" != inputs ] && [ "$1" != pre ] && [ "$1" != selftest ] && bash -c "source '$root/bench/gpu/pipeline.sh' --lib; gpu_free"
  local name=$1 limit=$2 t0 rc
  t0=$(date +%s)
  echo "$name start $(date +%T)" >>"$status"
  mkdir -p "$res"
  timeout --kill-after=20 "$limit" bash -c "source '$root/bench/gpu/pipeline.sh' --lib; stage_$name" >"$res/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s" >>"$status"
}

case ${1:-} in
  --lib) return 0 2>/dev/null || exit 0 ;;  # sourced by run_stage for the stage functions
  start)
    shift
    stages=("$@")
    [ ${#stages[@]} -eq 0 ] && stages=(inputs mini sbs7b split7b async05)  # x4; on one GPU: inputs step1 multiturn
    mkdir -p $work $res
    : >"$status"
    # The stages run from a copy of the tree: every device call sends the working tree anew, and a poll sent
    # while a stage starts its processes replaced the files under it (2026-11-28: rlrun's side of sbs7b_liger
    # stopped 5 s in on "No module named 'trainer.experience'", a file it has)
    rm -rf $work/tree && mkdir -p $work/tree
    tar -C "$root" --exclude=./.git --exclude=./.gpu-carry --exclude=./.gpu-pkg --exclude=./.venv -cf - . |
      tar -C $work/tree -xf - || { echo "pipeline: cannot copy the tree to $work/tree" >&2; exit 1; }
    root=$work/tree
    declare -A limits=([inputs]=420 [mini]=420 [sbs7b]=1230 [sbs05]=870 [split7b]=320 [async05]=560
                       [step1]=560 [multiturn]=480 [sbs7b_m16]=420 [sbs7b_levers]=440 [sbs7b_inproc]=380 [sbs7b_liger]=1230 [sbs7b_kl]=1600 [async7b]=420 [check1]=700 [step1_7b]=560 [step1_modes]=1100 [step1_prime]=720 [step1_split]=780 [step1_prewarm]=1150 [step1_prewarm1]=600 [preload1]=600 [preload2]=660 [check2]=860 [step1_x2]=1000 [xnode2]=800
                       [selftest]=30 [logprob7b]=480 [xnode]=560 [ppo7b]=760 [seed32b]=1260
                       [tools]=600 [par]=900 [pre]=600 [prewarm]=600)
    # its own session: it outlives the device call that starts it
    setsid bash -c "$(declare -f run_stage); $(declare -p limits); status=$status; res=$res; work=$work; root=$root;
      for s in ${stages[*]}; do run_stage \$s \${limits[\$s]:-600}; done; echo done >>$status" \
      "$0" >"$work/pipeline.log" 2>&1 </dev/null &
    echo "pipeline started: ${stages[*]} (status: $status)" ;;
  poll)
    out=${2:?usage: pipeline.sh poll OUT [SECONDS]}
    limit=${3:-540}
    end=$(( $(date +%s) + limit ))
    while [ "$(date +%s)" -lt "$end" ] && ! grep -q '^done' "$status" 2>/dev/null; do sleep 10; done
    mkdir -p "$out"
    cp "$status" "$out/status.txt" 2>/dev/null
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader >"$out/gpus.txt" 2>&1
    # the tables each stage printed, the last lines of every log, the JSON results (small)
    for log in "$res"/*.log; do
      [ -f "$log" ] && { echo "=== $log"; tail -60 "$log"; }
    done >"$out/tails.txt" 2>&1
    tar czf "$out/results.tgz" --exclude='*.safetensors' --exclude='ckpt' --exclude='*.pt' \
      -C "$work" results pipeline.log 2>/dev/null
    cat "$out/status.txt" ;;
  *) echo "usage: pipeline.sh start [STAGE...] | poll OUT [SECONDS]" >&2; exit 2 ;;
esac
