"""rlrun's trainer and OpenRLHF on the same GPU, model, data, batch shape and flags, in one run.

    python3 bench/gpu/side_by_side.py --model M --data D.jsonl --out OUT [--steps 6] [--deadline 560]

In order, each in a process of its own with the GPU to itself:

1. ``bare``: plain ``vllm.LLM.generate`` of one step's batch (bench/gpu/vllm_bench.py bare): what the
   trainer's generate phase is held to (<= 1.25x);
2. ``rlrun``: ``python -m trainer.train_ppo_ray``, everything colocated on one GPU (ZeRO-3 policy and
   reference, one vLLM engine that sleeps while training and takes its weights in place), RLOO;
3. ``openrlhf``: OpenRLHF's own ``openrlhf.cli.train_ppo_ray`` (0.11.2, its code unmodified) with the same
   settings in its flag names; its per-step ``timing/*`` are read from its log.

4. ``verl`` (optional: ``--systems ...,verl``; 0.9.1, unmodified, carried by bench/gpu/collect.sh's verl/):
   verl's own entry point ``python -m verl.trainer.main_ppo`` with Hydra overrides at the same shape
   (:func:`verl_command`): its default v1 synchronous trainer, FSDP instead of ZeRO-3 (verl has no
   DeepSpeed), the hybrid engine (vLLM colocated, sleeping while the actor trains), RLOO, KL 0.02 k1 in the
   reward (``algorithm.use_kl_in_reward``, fixed ``kl_ctrl``), SDPA attention and no remove-padding (no
   packing), the same reward through ``reward.custom_reward_function`` (bench/gpu/verl_reward.py). The
   bench's jsonl becomes verl's parquet (prompt as chat messages, data_source, reward_model.ground_truth:
   :func:`verl_records`); its per-step ``timing_s/*`` (gen, reward, old_log_prob, ref, adv, update_actor,
   update_weights, step) are read from its file logger, or its console lines (:func:`verl_steps`). verl
   serves each rollout replica with vLLM's ``mp`` executor, not Ray's, so the variable below does not
   concern it. ``--verl-extra`` adds overrides.

The one change made to how OpenRLHF runs: the vLLM store-port fix rlrun's engines get too. With TP > 1 its
engines use vLLM's Ray executor, ``RayExecutorV2`` by default in vLLM 0.26.0, whose ``_select_tcpstore_port``
searches its TCPStore port from ``data_parallel_master_port + 100`` (0 + 100 outside data parallelism), so
OpenRLHF's two TP-2 engines, started together on one host, both took port 100 and the second died with
EADDRINUSE (nvidia-h200-x4, 2026-11-27). The V1 executor (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) failed
later, in Ray's compiled graph (``CUDA_VISIBLE_DEVICES set incorrectly. expected to include 3``, vLLM issue
25113; the same day, 22:49). So OpenRLHF's processes start with ``openrlhf_shim/sitecustomize.py``, which
sets ``VLLM_DP_MASTER_PORT`` to a free port - 100 in each process, as rlrun's engines do before ``LLM(...)``
(``trainer.rollout.vllm_compat.pin_ray_store_port``). Neither system's code changes.

Shape (all): 16 prompts x 4 samples, 256 new tokens, train batch 64 in micro-batches of 8, one epoch,
ZeRO-3 bf16, SDPA attention, KL 0.02 (k1 in the reward), lr 1e-6, temperature 1, vLLM at 0.5 of the GPU's
memory with sleep, no prefix caching, no packing, no DeepSpeed offload. The reward is the share of digits
in the response (bench/gpu/rewards.py; OpenRLHF gets the same function as bench/gpu/openrlhf_reward.py).
Medians are over the steps after the first. A system that has not finished when ``--deadline`` seconds of
the whole run (or ``--system-deadline`` seconds of its own) have passed is stopped (its process group) and
reported with the steps it finished; the results are saved after each system.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from isolated import PROJECT, nvidia_smi_used_mib  # run as a script: its own directory is on the path

if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))
from trainer.rollout.vllm_compat import STORE_PORT_MARK  # noqa: E402  (light: no vLLM import)

HERE = Path(__file__).resolve().parent
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "VLLM_USE_FLASHINFER_SAMPLER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
       "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
# The one change made to how OpenRLHF runs (see the docstring): its shim folder's sitecustomize.py.
OPENRLHF_CHANGE = ("openrlhf_shim/sitecustomize.py in its processes only: each starts vLLM 0.26's TCPStore port "
                   "search (VLLM_DP_MASTER_PORT + 100) at a port the OS gives it, as rlrun's engines do "
                   "(vllm_compat.pin_ray_store_port), since RayExecutorV2 gives TP engines starting together on "
                   "one host the same port (EADDRINUSE) and the V1 executor fails in Ray's compiled graph")
RLRUN_PHASES = ("generate", "score", "sleep", "make_experience", "train", "sync")
# verl 0.9.1's v1 trainer (verl/trainer/ppo/v1/trainer_base.py, trainer_sync.py): the marked_timer names it
# logs as timing_s/<name>; "gen" is generation (wake, rollout, sleep), "update_weights" the push to vLLM
VERL_PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
VERL_EXPERIENCE = ("reward", "old_log_prob", "ref", "adv")  # what rlrun and OpenRLHF call make_experience
OPENRLHF_PHASES = ("generation", "make_experience", "ppo_train", "broadcast")


def rlrun_command(args, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "trainer.train_ppo_ray", "--pretrain", args.model, "--prompt_data", args.data,
           "--input_key", "message", "--label_key", "answer", "--apply_chat_template",
           "--reward_fn", "bench.gpu.rewards:digit_share",
           "--rollout_backend", "vllm", "--vllm_num_engines", str(args.engines), "--vllm_tensor_parallel_size",
           str(args.tp), "--vllm_gpu_memory_utilization", str(args.gpu_util), *PLACEMENTS[args.placement],
           "--actor_num_nodes", "1", "--actor_num_gpus_per_node", str(args.gpus),
           "--ref_num_nodes", "1", "--ref_num_gpus_per_node", str(args.gpus), "--advantage_estimator", "rloo",
           "--n_samples_per_prompt", str(args.n),
           "--rollout_batch_size", str(args.prompts), "--micro_rollout_batch_size", str(args.micro_rollout),
           "--train_batch_size", str(args.prompts * args.n), "--micro_train_batch_size", str(args.micro_train),
           "--generate_max_len", str(args.new_tokens), "--prompt_max_len", "128", "--num_episodes", "1",
           "--max_samples", str(args.prompts * args.steps), "--zero_stage", "3", "--bf16",
           "--actor_learning_rate", "1e-6", "--init_kl_coef", "0.02", "--temperature", "1.0", "--seed", "1",
           "--save_path", str(out), "--logging_steps", "1"]
    if args.grad_ckpt:
        cmd.append("--gradient_checkpointing")
    if args.liger:
        cmd.append("--use_liger_kernel")
    if args.kl_loss:
        cmd += KL_LOSS["rlrun"]
    return cmd + list(args.rlrun_extra)


# --kl-loss: the KL to the reference as a term of the loss (k3, GRPO's), 0.02 as in the reward otherwise, in each
# system's own words; without it every system puts k1 into the reward. OpenRLHF and verl still run the old
# policy's forward in make_experience then; rlrun skips it only when told (--old_logprobs train, a lever of
# its own that changes no result with one optimizer step per rollout: the pipeline's rlrun extras).
KL_LOSS = {"rlrun": ["--use_kl_loss", "--kl_estimator", "k3"],
           "openrlhf": ["--algo.kl.use_loss", "--algo.kl.estimator", "k3"],
           "verl": {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.02,
                    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "algorithm.use_kl_in_reward": False}}


# rlrun's placements (OpenRLHF runs colocated only here): everything on the actor's GPUs; the reference on the
# actor's GPUs and the engines on GPUs of their own; or every group and engine on GPUs of its own.
PLACEMENTS = {"colocated": ["--colocate_all_models", "--vllm_enable_sleep"], "actor-ref": ["--colocate_actor_ref"],
              "split": []}


def system_env(name: str, base: dict, *, ray_tmp: str, shim: str, verl_path: str = "",
               run_out: Path | None = None) -> dict:
    """The environment of one system's run: ``base`` (this process's, with :data:`ENV`), a Ray temp dir of
    its own, no Ray address to join, the project on the path; for OpenRLHF also the shim folder (the stand-in
    flash_attn, and the sitecustomize.py of :data:`OPENRLHF_CHANGE`), which every other system runs without;
    for verl its own folder first (antlr4 4.9.3 for Hydra, where the shared site holds 4.13 for math-verify)
    and its file logger's path in ``run_out``. Ray's workers inherit it: each system starts its own local Ray.
    A store port the caller's shell set is left out: each system's engines pick their own."""
    env = {k: v for k, v in base.items() if k not in ("RAY_ADDRESS", "VLLM_DP_MASTER_PORT", STORE_PORT_MARK)}
    paths = [str(PROJECT)]
    if name == "openrlhf":
        paths.append(shim)
    elif name == "verl":
        paths.insert(0, verl_path)
        env["HYDRA_FULL_ERROR"] = "1"
        if run_out is not None:
            env["VERL_FILE_LOGGER_PATH"] = str(run_out / "metrics.jsonl")
    env["RAY_TMPDIR"] = ray_tmp
    env["PYTHONPATH"] = ":".join([*paths, base.get("PYTHONPATH", "")])
    return env


def openrlhf_command(args, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "openrlhf.cli.train_ppo_ray", "--actor.model_name_or_path", args.model,
           "--data.prompt_dataset", args.data, "--data.input_key", "message", "--data.label_key", "answer",
           "--data.apply_chat_template", "--reward.remote_url", str(HERE / "openrlhf_reward.py"),
           "--vllm.num_engines", str(args.engines), "--vllm.tensor_parallel_size", str(args.tp),
           "--vllm.gpu_memory_utilization", str(args.gpu_util), "--train.colocate_all", "--vllm.enable_sleep",
           "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(args.gpus), "--ref.num_nodes", "1",
           "--ref.num_gpus_per_node", str(args.gpus), "--algo.advantage.estimator", "rloo",
           "--rollout.n_samples_per_prompt", str(args.n), "--rollout.batch_size", str(args.prompts),
           "--rollout.micro_batch_size", str(args.micro_rollout), "--train.batch_size", str(args.prompts * args.n),
           "--train.micro_batch_size", str(args.micro_train), "--rollout.max_new_tokens", str(args.new_tokens),
           "--data.max_len", str(128 + args.new_tokens),
           "--train.num_episodes", "1", "--data.max_samples", str(args.prompts * args.steps), "--ds.zero_stage", "3",
           "--ds.param_dtype", "bf16", "--ds.attn_implementation", "sdpa", "--actor.adam.lr", "1e-6",
           "--algo.kl.init_coef", "0.02", "--rollout.temperature", "1.0", "--train.seed", "1",
           "--ckpt.output_dir", str(out), "--ckpt.path", str(out / "ckpt")]
    if args.grad_ckpt:
        cmd.append("--actor.gradient_checkpointing_enable")
    if args.liger:  # the actor and the reference (AutoLigerKernelForCausalLM)
        cmd.append("--ds.use_liger_kernel")
    if args.kl_loss:
        cmd += KL_LOSS["openrlhf"]
    return cmd


def verl_command(args, out: Path, train_file: Path) -> list[str]:
    """verl's own trainer at the shape of the other two, as Hydra overrides of its ppo_trainer config.

    Batch sizes are in prompts where verl counts prompts (``data.train_batch_size``, ``ppo_mini_batch_size``:
    one optimizer step over the whole rollout batch, as ``--train_batch_size prompts x n`` does in the others)
    and in samples per GPU for the micro-batches. Its rollout replicas are ``n_gpus_per_node / TP`` (one per
    TP group of the hybrid engine); the bench asks as many engines as that."""
    model = Path(args.model).resolve() if Path(args.model).exists() else args.model  # Hydra may chdir
    o = {
        "data.train_files": train_file, "data.val_files": train_file, "data.prompt_key": "prompt",
        "data.train_batch_size": args.prompts, "data.train_max_samples": args.prompts * args.steps,
        "data.max_prompt_length": 128, "data.max_response_length": args.new_tokens, "data.shuffle": False,
        "data.seed": 1,
        "actor_rollout_ref.hybrid_engine": True,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.enable_gradient_checkpointing": bool(args.grad_ckpt),
        "actor_rollout_ref.model.use_liger": bool(args.liger),
        "actor_rollout_ref.model.use_remove_padding": False,
        "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
        "actor_rollout_ref.actor.optim.lr": "1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size": args.prompts,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": args.micro_train,
        "actor_rollout_ref.actor.ppo_epochs": 1, "actor_rollout_ref.actor.use_kl_loss": False,
        "actor_rollout_ref.actor.entropy_coeff": 0,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": args.micro_rollout,
        "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.rollout.n": args.n,
        "actor_rollout_ref.rollout.temperature": 1.0,
        "actor_rollout_ref.rollout.gpu_memory_utilization": args.gpu_util,
        "actor_rollout_ref.rollout.tensor_model_parallel_size": args.tp,
        "actor_rollout_ref.rollout.enable_prefix_caching": False,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": args.micro_rollout,
        "algorithm.adv_estimator": "rloo", "algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "kl",
        "algorithm.kl_ctrl.type": "fixed", "algorithm.kl_ctrl.kl_coef": 0.02,
        "reward.custom_reward_function.path": HERE / "verl_reward.py",
        "reward.custom_reward_function.name": "compute_score",
        "trainer.nnodes": 1, "trainer.n_gpus_per_node": args.gpus, "trainer.total_epochs": 1,
        "trainer.total_training_steps": args.steps, "trainer.logger": "[console,file]",
        "trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": -1,
        "trainer.resume_mode": "disable", "trainer.project_name": "side_by_side",
        "trainer.experiment_name": "verl",
        "trainer.default_local_dir": out / "ckpt", "hydra.run.dir": out / "hydra",
    }
    if args.kl_loss:
        o.update(KL_LOSS["verl"])
    text = {k: str(v) if not isinstance(v, bool) else str(v).lower() for k, v in o.items()}
    return [sys.executable, "-m", "verl.trainer.main_ppo", *(f"{k}={v}" for k, v in text.items()),
            *args.verl_extra]


def startup_line(row: dict) -> str:
    """rlrun's ``startup/<who>/<mark>_s`` of step 1 as one line, by who, in order of each one's first mark."""
    from trainer.startup import from_metrics, render

    return render(from_metrics(row), 0.0)


def verl_records(rows: list[dict], input_key: str = "message", label_key: str = "answer",
                 source: str = "side_by_side") -> list[dict]:
    """The bench's records as verl's RL dataset rows: ``prompt`` as chat messages (a plain string becomes one
    user message), ``data_source``, ``reward_model.ground_truth`` (the label, text), ``extra_info.index``."""
    out = []
    for i, row in enumerate(rows):
        prompt = row[input_key]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        out.append({"data_source": source, "ability": "copy",
                    "prompt": [{"role": str(m["role"]), "content": str(m["content"])} for m in messages],
                    "reward_model": {"style": "rule", "ground_truth": str(row.get(label_key, ""))},
                    "extra_info": {"split": "train", "index": i}})
    return out


def write_verl_data(src: Path, dst_dir: Path) -> Path:
    """``src`` (the bench's jsonl) as verl's training file in ``dst_dir``: parquet through pyarrow (on the GPU
    image), or jsonl, which verl 0.9.1's RLHFDataset also reads, where pyarrow is missing."""
    rows = [json.loads(line) for line in Path(src).read_text().splitlines() if line.strip()]
    records = verl_records(rows)
    dst_dir.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path = dst_dir / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path
    path = dst_dir / "train.parquet"
    pq.write_table(pa.Table.from_pylist(records), path)
    return path


class MemorySampler:
    """Every GPU's used memory (nvidia-smi, all processes counted) sampled each second on a thread; the peak
    per GPU in MiB. The same reading for both systems, whatever their own accounting."""

    def __init__(self) -> None:
        import threading

        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            if not shutil.which("nvidia-smi"):
                return
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True)
            for line in out.stdout.splitlines():
                idx, used = (int(x) for x in line.split(","))
                self.peak[idx] = max(self.peak.get(idx, 0), used)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run(name: str, cmd: list[str], env: dict, log: Path, deadline: float,
        done: Callable[[], bool] | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` in a session of its own until it ends, ``done()`` says every step it was run for is logged
    (then it is stopped: the final model save and teardown are not what is measured, and a 7B's save costs a
    minute), or ``deadline`` (monotonic); returns (exit code, 0 when stopped after its steps, None when
    stopped at the deadline; seconds)."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=PROJECT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        rc: int | None = None
        while rc is None and time.monotonic() < deadline:
            try:
                rc = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                if done is not None and done():
                    print(f"{name}: every step logged after {time.monotonic() - t0:.0f} s; stopping it", flush=True)
                    _stop(proc)
                    return 0, time.monotonic() - t0
        if rc is None:
            print(f"{name}: stopped at the deadline after {time.monotonic() - t0:.0f} s", flush=True)
            _stop(proc)
    return rc, time.monotonic() - t0


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # its own session: the processes this run started
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_gpu_free(limit_mib: int = 3000, timeout: float = 60) -> int:
    """Wait until GPU 0 holds less than ``limit_mib`` (the last run's processes are gone); returns MiB used."""
    used = -1
    end = time.monotonic() + timeout
    while time.monotonic() < end and shutil.which("nvidia-smi"):
        used = nvidia_smi_used_mib()
        if 0 <= used < limit_mib:
            break
        time.sleep(2)
    return used


def cuda_arch() -> str | None:
    """GPU 0's compute capability ("9.0"): DeepSpeed's JIT builds (OpenRLHF's FusedAdam) cannot parse the
    image's TORCH_CUDA_ARCH_LIST ("9.0a": ValueError: invalid literal for int() ... '0a')."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def rlrun_steps(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for prev, row in zip([None, *rows], rows, strict=False):
        row["phases"] = {p: row.get(f"timing/{p}", 0.0) for p in RLRUN_PHASES}
        # the step as timed by the trainer (with --async_train generation overlaps the rest: no sum)
        row["step_s"] = row.get("timing/step", sum(row["phases"].values()))
        row["wall_s"] = row["time"] - prev["time"] if prev else None
        # --profile_step: that step ran under torch.profiler, slower; the medians leave it out
        row["profiled"] = any(k.startswith("profile/") for k in row)
    return rows


STEP_RE = re.compile(r"Global step (\d+): (\{.*\})")
NUM_RE = re.compile(r"'(timing/[a-z_]+)': (?:np\.float64\()?([0-9.eE+-]+)")


def openrlhf_steps(log: Path) -> list[dict]:
    rows = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        m = STEP_RE.search(line)
        if not m:
            continue
        timing = {k.removeprefix("timing/"): float(v) for k, v in NUM_RE.findall(m.group(2))}
        rows.append({"step": int(m.group(1)), "phases": {p: timing.get(p, 0.0) for p in OPENRLHF_PHASES},
                     "step_s": timing.get("step_total", sum(timing.get(p, 0.0) for p in OPENRLHF_PHASES))})
    return rows


VERL_STEP_RE = re.compile(r"\bstep:(\d+) - (.*)$")
VERL_NUM_RE = re.compile(r"\btiming_s/([a-z_]+):(?:np\.float\d+\()?([0-9.eE+-]+)")


def verl_steps(log: Path, jsonl: Path | None = None) -> list[dict]:
    """verl's steps, from its file logger's jsonl (``{"step": N, "data": {...}}`` a line) where there is one,
    else from its console lines (``step:N - timing_s/gen:5.1 - ...``, numpy floats as ``np.float64(5.1)``,
    behind Ray's ``(TaskRunner pid=...)``). Each step's phases are :data:`VERL_PHASES` plus their
    make_experience (:data:`VERL_EXPERIENCE` summed); ``step_s`` is verl's own ``timing_s/step``."""
    found: list[tuple[int, dict]] = []
    if jsonl is not None and jsonl.exists():
        for line in jsonl.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # empty, or being written
                continue
            data = rec.get("data", {}) if isinstance(rec, dict) else {}
            timing = {k.removeprefix("timing_s/"): float(v) for k, v in data.items()
                      if k.startswith("timing_s/") and "/" not in k[9:] and isinstance(v, (int, float))}
            if timing:
                found.append((int(rec["step"]), timing))
    if not found and log.exists():
        for line in log.read_text(errors="replace").splitlines():
            m = VERL_STEP_RE.search(line)
            if m:
                timing = {k: float(v) for k, v in VERL_NUM_RE.findall(m.group(2))}
                if timing:
                    found.append((int(m.group(1)), timing))
    rows = []
    for step, timing in found:
        phases = {p: timing.get(p, 0.0) for p in VERL_PHASES}
        phases["make_experience"] = sum(phases[p] for p in VERL_EXPERIENCE)
        rows.append({"step": step, "phases": phases,
                     "step_s": timing.get("step", sum(phases[p] for p in VERL_PHASES))})
    return rows


def steady(rows: list[dict]) -> list[dict]:
    """The steps every median is taken over: those after the first (step 1 compiles, warms up), a profiled one
    left out (``profiled``: rlrun's --profile_step)."""
    return [r for r in rows[1:] if not r.get("profiled")] or [r for r in rows if not r.get("profiled")] or rows


def medians(rows: list[dict]) -> dict:
    """Each phase's median over the :func:`steady` steps."""
    later = steady(rows)
    if not later:
        return {}
    out = {p: statistics.median(r["phases"][p] for r in later) for p in later[0]["phases"]}
    out["step"] = statistics.median(r["step_s"] for r in later)
    walls = [r["wall_s"] for r in later if r.get("wall_s")]
    if walls:
        out["wall"] = statistics.median(walls)
    out["steps_measured"] = len(later)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="/tmp/side_by_side")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--deadline", type=float, default=560, help="seconds for the whole run")
    p.add_argument("--system-deadline", type=float, default=0,
                   help="seconds for each system at most (0: --deadline only): a slow one leaves time")
    p.add_argument("--systems", default="bare,rlrun,openrlhf",
                   help="any of bare,rlrun,openrlhf,verl, run in that order; "
                        "one that fails leaves the others' figures")
    p.add_argument("--gpus", type=int, default=1, help="GPUs of the one node: actor and reference ranks")
    p.add_argument("--placement", choices=sorted(PLACEMENTS), default="colocated",
                   help="rlrun only: split places the engines (and the reference) on GPUs of their own")
    p.add_argument("--engines", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--gpu-util", type=float, default=0.5)
    p.add_argument("--target-ratio", type=float, default=None,
                   help="print this target beside rlrun's step / OpenRLHF's (issue 38 at 7B: 0.5)")
    p.add_argument("--target-step", type=float, default=None,
                   help="print this target (seconds) beside rlrun's step (issue 38 at 7B: 8)")
    p.add_argument("--micro-train", type=int, default=8)
    p.add_argument("--micro-rollout", type=int, default=None, help="default: --prompts")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing in both systems")
    p.add_argument("--liger", action="store_true",
                   help="Liger's fused kernels in every system: rlrun --use_liger_kernel, OpenRLHF "
                        "--ds.use_liger_kernel, verl actor_rollout_ref.model.use_liger")
    p.add_argument("--kl-loss", action="store_true",
                   help="the KL (k3, 0.02) as a loss term in every system instead of k1 in the reward: rlrun "
                        "--use_kl_loss, OpenRLHF --algo.kl.use_loss, verl actor.use_kl_loss (see KL_LOSS)")
    p.add_argument("--params", type=float, default=0.0, help="the model's parameters, for the train phase's MFU")
    p.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 per GPU (H100 SXM: 989.4)")
    p.add_argument("--rlrun-extra", type=shlex.split, default=[],
                   help="more flags for rlrun only, one string: --rlrun-extra='--async_train --is_correction tis'")
    p.add_argument("--shim", default=str(HERE / "openrlhf_shim"), help="the stand-in flash_attn (see its README)")
    p.add_argument("--verl-extra", type=shlex.split, default=[],
                   help="more Hydra overrides for verl only, one string: --verl-extra='trainer.use_v1=false'")
    p.add_argument("--verl-path", default="/tmp/site/verl-only",
                   help="put first on verl's PYTHONPATH (collect.sh installs antlr4 4.9.3 there for Hydra)")
    args = p.parse_args(argv)
    args.micro_rollout = args.micro_rollout or args.prompts
    start = time.monotonic()
    deadline = start + args.deadline
    out = Path(args.out).resolve()  # absolute: verl's Hydra runs it in a folder of its own
    out.mkdir(parents=True, exist_ok=True)
    systems = args.systems.split(",")
    base_env = {**os.environ, **ENV}
    results: dict = {"shape": {"prompts": args.prompts, "n": args.n, "new_tokens": args.new_tokens, "steps": args.steps,
                               "gpus": args.gpus, "engines": args.engines, "tp": args.tp, "grad_ckpt": args.grad_ckpt, "liger": args.liger, "kl_loss": args.kl_loss,
                               "placement": args.placement, "rlrun_extra": args.rlrun_extra,
                               "target_ratio": args.target_ratio, "target_step": args.target_step,
                               "params": args.params}}

    if "bare" in systems:
        cmd = [sys.executable, str(HERE / "vllm_bench.py"), "bare", "--model", args.model, "--data", args.data,
               "--json", str(out / "bare.json"), "--prompts", str(args.prompts), "--n", str(args.n),
               "--max-tokens", str(args.new_tokens), "--repeat", "3", "--gpu-util", "0.5"]
        env = {**base_env, "PYTHONPATH": f"{PROJECT}:{os.environ.get('PYTHONPATH', '')}"}
        rc, secs = run("bare", cmd, env, out / "bare.log", min(deadline, time.monotonic() + 200))
        results["bare"] = json.loads((out / "bare.json").read_text()) if rc == 0 else {"error": f"exit {rc}"}
        results["bare"]["process_s"] = secs
        print(f"bare: {results['bare']}", flush=True)
        wait_gpu_free()

    def steps_of(name: str, run_out: Path) -> list[dict]:
        if name == "rlrun":
            return rlrun_steps(run_out)
        if name == "openrlhf":
            return openrlhf_steps(out / "openrlhf.log")
        return verl_steps(out / "verl.log", run_out / "metrics.jsonl")

    for name in ("rlrun", "openrlhf", "verl"):
        if name not in systems:
            continue
        run_out = out / name
        shutil.rmtree(run_out, ignore_errors=True)
        run_out.mkdir(parents=True)
        if name == "verl":
            try:  # verl is optional: what stops it here must not cost the others' figures
                cmd = verl_available() and verl_command(args, run_out,
                                                        write_verl_data(Path(args.data), run_out))
            except Exception as exc:  # noqa: BLE001 - reported in the results, not raised
                cmd, results["verl"] = None, {"error": f"preparing verl's data: {exc!r}"}
            if not cmd:
                results.setdefault("verl", {"error": "verl is not installed (bench/gpu/collect.sh verl/)"})
                print(f"verl: skipped: {results['verl']['error']}", flush=True)
                save(out, results)
                continue
            if args.engines * args.tp != args.gpus:
                print(f"verl: its rollout replicas are GPUs / TP = {args.gpus // args.tp}, not --engines "
                      f"{args.engines}", flush=True)
        else:
            cmd = rlrun_command(args, run_out) if name == "rlrun" else openrlhf_command(args, run_out)
        ray_tmp = tempfile.mkdtemp(prefix=f"sbs{name[0]}", dir="/tmp")  # short: Ray's socket paths
        env = system_env(name, base_env, ray_tmp=ray_tmp, shim=args.shim, verl_path=args.verl_path,
                         run_out=run_out)
        if name == "openrlhf":
            print(f"openrlhf: the one change made to OpenRLHF: {OPENRLHF_CHANGE}", flush=True)
            if cuda_arch():
                env["TORCH_CUDA_ARCH_LIST"] = cuda_arch()
        def logged(name=name, run_out=run_out) -> bool:
            try:  # a line being written is not a step yet
                rows = steps_of(name, run_out)
            except ValueError:
                return False
            return len(rows) >= args.steps

        with MemorySampler() as mem:
            own = min(deadline, time.monotonic() + args.system_deadline) if args.system_deadline else deadline
            rc, secs = run(name, cmd, env, out / f"{name}.log", own, logged)
        rows = steps_of(name, run_out)
        results[name] = {"exit": rc, "seconds": secs, "steps": rows, "median": medians(rows),
                         "peak_mib": dict(sorted(mem.peak.items())),
                         "first_step_s": rows[0]["step_s"] if rows else None}
        if name == "openrlhf":
            results[name]["change"] = OPENRLHF_CHANGE
        print(f"{name}: exit {rc} after {secs:.0f} s, {len(rows)} steps; median {results[name]['median']}", flush=True)
        if rc not in (0, None):
            print("".join((out / f"{name}.log").read_text(errors="replace").splitlines(True)[-40:]), flush=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        save(out, results)  # after each system: a later one that hangs or kills the stage leaves these
        wait_gpu_free()

    save(out, results)
    table(results)
    return 0


def save(out: Path, results: dict) -> None:
    (out / "side_by_side.json").write_text(json.dumps(results, indent=1, default=str))


def verl_available() -> bool:
    """Whether verl and Hydra can be imported here (found, not imported: importing verl takes seconds)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("verl", "hydra"))


def mfu(train_s: float, tokens: float, params: float, gpus: int, peak_tflops: float, grad_ckpt: bool) -> float:
    """Model FLOPs utilisation of a train phase: 6 N T (forward + backward; 8 N T with gradient checkpointing's
    second forward) over the GPUs' dense peak for the phase's time."""
    flops = (8 if grad_ckpt else 6) * params * tokens
    return flops / (train_s * gpus * peak_tflops * 1e12)


def table(r: dict) -> None:
    a, b, bare = r.get("rlrun", {}).get("median", {}), r.get("openrlhf", {}).get("median", {}), r.get("bare", {})
    c, with_verl = r.get("verl", {}).get("median", {}), "verl" in r
    sh = r["shape"]
    print(f"\none step: {sh['prompts']} prompts x {sh['n']} samples x {sh['new_tokens']} new tokens, RLOO, "
          f"{sh.get('placement', 'colocated')} placement, actor on {sh.get('gpus', 1)} GPU(s), {sh.get('engines', 1)} engine(s) x TP {sh.get('tp', 1)}")
    width = 52 if with_verl else 34
    print(f"{'phase':<{width}}{'rlrun':>10}{'OpenRLHF':>10}" + (f"{'verl':>10}" if with_verl else ""))
    rows4 = [  # the label of the two-system table, the verl column's note, then each system's key
        ("generate (OpenRLHF: generation)", "; verl: gen", "generate", "generation", "gen"),
        ("engine sleep", "", "sleep", None, None),
        ("make_experience", " (verl: reward+old_log_prob+ref+adv)", "make_experience", "make_experience",
         "make_experience"),
        ("train (OpenRLHF: ppo_train)", "; verl: update_actor", "train", "ppo_train", "update_actor"),
        ("sync (OpenRLHF: broadcast)", "; verl: update_weights", "sync", "broadcast", "update_weights"),
        ("step (sum of phases)", "; verl: its timing_s/step", "step", "step", "step"),
        ("step (wall, between log lines)", "", "wall", None, None)]
    for label, note, ka, kb, kc in rows4:
        if with_verl and note:
            label = label[:-1] + note + ")" if note.startswith(";") else label + note
        va = f"{a[ka]:.2f} s" if ka in a else "-"
        vb = f"{b[kb]:.2f} s" if kb and kb in b else "-"
        vc = f"{c[kc]:.2f} s" if kc and kc in c else "-"
        print(f"{label:<{width}}{va:>10}{vb:>10}" + (f"{vc:>10}" if with_verl else ""))
    verl_steps_measured = f", verl {c.get('steps_measured', 0)}" if with_verl else ""
    print(f"steps measured (after the first): rlrun {a.get('steps_measured', 0)}, "
          f"OpenRLHF {b.get('steps_measured', 0)}{verl_steps_measured}")
    for name in ("rlrun", "openrlhf", "verl"):
        got = r.get(name, {})
        if got.get("peak_mib"):
            print(f"{name}: peak GPU memory per GPU (MiB, nvidia-smi): {got['peak_mib']}; step 1 {got.get('first_step_s')}")
        if got.get("error"):
            print(f"{name}: {got['error']}")
    rows = r.get("rlrun", {}).get("steps", [])
    later = steady(rows)  # the steps the medians above are of
    tokens = statistics.median(x.get("tokens/real", 0.0) for x in later) if len(rows) > 1 else 0.0
    if rows and any(k.startswith("startup/") for k in rows[0]):  # where step 1's start-up went (trainer.startup)
        print(f"rlrun start-up (s after its driver's process began): {startup_line(rows[0])}")
    norms = [x["policy/grad_norm"] for x in rows if "policy/grad_norm" in x]
    if norms:  # a step is only a train step if a gradient reached the optimizer (the 2026-11-24 0.5B step did not)
        print(f"rlrun policy gradient norm by step: {', '.join(f'{n:.3g}' for n in norms)}"
              + ("  NO GRADIENT at some step: its train phase trained nothing" if min(norms) == 0 else ""))
    if sh.get("params") and tokens:
        for name, med, key in (("rlrun", a, "train"), ("OpenRLHF", b, "ppo_train"),
                               ("verl", c, "update_actor")):
            if key in med and med[key] > 0:
                print(f"{name} train-phase MFU: {100 * mfu(med[key], tokens, sh['params'], sh.get('gpus', 1), 989.4, sh.get('grad_ckpt', False)):.1f} % "
                      f"({tokens:,.0f} tokens a step, {sh['params'] / 1e9:.2f}B parameters)")
    if "openrlhf" in r:
        print(f"the one change made to OpenRLHF: {OPENRLHF_CHANGE}")
    if "step" in a and "step" in b:
        print(f"rlrun step / OpenRLHF step: {a['step'] / b['step']:.2f}x{_target(sh.get('target_ratio'), 'x')}")
    if "step" in a and "step" in c:
        print(f"rlrun step / verl step: {a['step'] / c['step']:.2f}x")
    if "step" in a:
        print(f"rlrun {sh.get('placement', 'colocated')} step: {a['step']:.2f} s{_target(sh.get('target_step'), ' s')}")
    if "generate" in a and "seconds" in bare:
        print(f"rlrun generate / bare LLM.generate ({bare['seconds']:.2f} s, {bare['tok_s']:,.0f} tok/s): "
              f"{a['generate'] / bare['seconds']:.2f}x (target <= 1.25)")
    if "sync" in a:
        print(f"rlrun {sh.get('placement', 'colocated')} sync: {a['sync']:.3f} s")
    gib = [x.get("sync/gib", 0.0) for x in later]
    if "sync" in a and gib and a["sync"] > 0:
        print(f"rlrun weight push, gather included: {statistics.median(gib) * 2**30 / a['sync'] / 1e9:.1f} GB/s "
              f"({statistics.median(gib):.2f} GiB in {a['sync']:.3f} s)")
    before = {p: [x[f"timing/sync/{p}"] for x in later if f"timing/sync/{p}" in x] for p in ("ready", "wake")}
    if all(before.values()):  # the sync's parts before its push: the engines' start awaited, their weights woken
        print("rlrun sync before its push: " + ", ".join(f"{p} {statistics.median(v):.3f} s" for p, v in before.items()))
    parts = {p: [x[f"sync/{p}_s"] for x in later if f"sync/{p}_s" in x]
             for p in ("gather", "handles", "load", "release", "finish")}
    if all(parts.values()):  # the shared (colocated) push, by part, on policy rank 0
        buckets = statistics.median(x.get("sync/buckets", 0) for x in later if "sync/buckets" in x)
        print(f"rlrun weight push by part ({buckets:.0f} buckets): "
              + ", ".join(f"{p} {statistics.median(v):.3f} s" for p, v in parts.items()))
    # make_experience's forwards in the workers (the rest of the phase is around them), and how long after the
    # driver's call each model's last rank started its forward (a rank still busy, the transfers)
    for key, label in (("forward", "forwards (slowest rank, at once)"),
                       ("forward_wait", "forwards started after (last rank)")):
        by_model = {m: [x[f"timing/{key}/{m}"] for x in later if f"timing/{key}/{m}" in x]
                    for m in ("policy", "ref", "critic")}
        if any(by_model.values()):
            print(f"rlrun make_experience's {label}: "
                  + ", ".join(f"{m} {statistics.median(v):.3f} s" for m, v in by_model.items() if v))
    around = {p: [x[f"timing/make_experience/{p}"] for x in later if f"timing/make_experience/{p}" in x]
              for p in ("build", "return", "post")}
    if all(around.values()):  # the rest of make_experience: the driver's padding, the results' way back, its work
        print("rlrun make_experience around its forwards: "
              + ", ".join(f"{p} {statistics.median(v):.3f} s" for p, v in around.items()))
    if "wait_rollout" in a or any("async/staleness" in x for x in rows):
        gen, rest = a.get("generate", 0.0), a.get("make_experience", 0.0) + a.get("train", 0.0) + a.get("sync", 0.0)
        print(f"async: step {a['step']:.2f} s vs max(generate {gen:.2f}, make_experience + train + sync "
              f"{rest:.2f}) = {max(gen, rest):.2f} s: {a['step'] / max(gen, rest, 1e-9):.2f}x (target <= 1.1)")


def _target(value: float | None, unit: str) -> str:
    """' (target <= 0.5x)' where the run was given a target (--target-ratio, --target-step), else nothing."""
    return f" (target <= {value:g}{unit})" if value is not None else ""


if __name__ == "__main__":
    raise SystemExit(main())
