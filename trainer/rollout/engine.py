"""The rollout-engine interface the training loop talks to, and what it returns.

Two implementations: :class:`trainer.rollout.vllm_engine.VllmEngine` (vLLM, the default) and
:class:`trainer.rollout.hf_engine.HfEngine` (HF ``generate``, the ``--rollout_backend hf`` fallback and the
reference in tests). Both are plain classes; the caller decides whether one runs in-process or as a Ray
actor (``ray.remote(VllmEngine)``), so every argument and result here is picklable.

Conventions shared by both engines:

- prompts are text, tokenized by the engine's own tokenizer (``tokenizer(prompt).input_ids``, i.e. with the
  tokenizer's default special tokens; apply a chat template before calling);
- ``generate`` returns ``len(prompts) * n`` samples, prompt-major (all samples of prompt 0 first);
- ``temperature == 0`` means greedy decoding;
- a response ends at the first EOS token (kept in ``response_token_ids``) or after ``max_new_tokens``;
- ``logprobs`` are the log-probabilities of the sampled tokens under the distribution sampled from, after
  the temperature (vLLM's ``logprobs_mode="processed_logprobs"``; with ``top_p < 1`` vLLM's are also
  renormalised over the nucleus): what the policy computes with ``log_probs_from_logits(..., temperature)``,
  so the two can be compared (``rollout/logprob_mismatch``) and used for importance-sampling correction.
"""

from __future__ import annotations

import abc
import copy
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

#: What ``update_weights`` accepts: a safetensors blob, several blobs (one update), or named tensors.
Weights = bytes | list[bytes] | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]


@dataclass
class Sample:
    """One generated response to one prompt."""

    prompt: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response: str
    logprobs: list[float] | None = None
    finish_reason: str | None = None  # "stop" (EOS) or "length" (max_new_tokens)
    # Multi-turn tool rollouts (generate_with_tools) only: 1 on the response tokens the policy generated,
    # 0 on those a tool inserted; None for a single-turn sample (all generated).
    action_mask: list[int] | None = None
    turns: int = 1  # generation turns
    tool_calls: int = 0


class RolloutEngine(abc.ABC):
    """Generates rollouts and takes new policy weights; see the module docstring for the conventions."""

    def ready(self) -> str:
        """The node this engine runs on, once it has started (as a Ray actor: the first call that returns
        after construction; :class:`trainer.rollout.engines.Engines` waits on it with a deadline)."""
        import socket

        try:
            import ray

            if ray.is_initialized():
                return ray.util.get_node_ip_address()
        except ImportError:  # an engine used without Ray
            pass
        return socket.gethostname()

    def startup(self) -> dict[str, float]:
        """The moments of this engine's start (trainer.startup): process, init, imported, ready."""
        marks = getattr(self, "startup_marks", None)
        return marks.get() if marks is not None else {}

    def pid(self) -> int:
        """This engine's process id (the job's log names it: the process to look at, or to stop)."""
        import os

        return os.getpid()

    @abc.abstractmethod
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
        """``n`` samples for each prompt, prompt-major; ``logprobs=False`` leaves ``Sample.logprobs`` None."""

    def complete(self, contexts: list[list[int]], max_tokens: list[int], stop: Sequence[str],
                 temperature: float, top_p: float, seeds: list[int | None], logprobs: bool = True) -> list[Any]:
        """Continue each token context once (one sample each): stop at EOS (kept), after ``max_tokens[i]``
        new tokens, or after the token that completes one of ``stop`` (kept). Returns
        :class:`trainer.rollout.multiturn.Completion` s (their ``logprobs`` None unless ``logprobs``); the
        multi-turn loop's primitive."""
        raise NotImplementedError(f"{type(self).__name__} does not support multi-turn tool rollouts")

    def stepper(self, logprobs: bool = True) -> Any:
        """A :class:`trainer.rollout.multiturn.Stepper` over this engine, or None (the default) when it cannot take
        requests while it decodes: :meth:`generate_with_tools` then runs the loop in rounds over
        :meth:`complete`."""
        return None

    def generate_with_tools(
        self,
        prompts: list[str],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 1024,
        seed: int | None = None,
        *,
        tools: dict[str, Any] | None = None,
        retriever_url: str | None = None,
        retriever_topk: int = 3,
        max_turns: int = 4,
        retriever_timeout: float = 10.0,
        retriever_retries: int = 3,
        retriever_outage_timeout: float = 0.0,
        logprobs: bool = True,
    ) -> tuple[list[Sample], dict[str, float]]:
        """Multi-turn tool rollouts (:mod:`trainer.rollout.multiturn`, the tools :mod:`trainer.tools`), called in the
        engine's process so a node-local service is the one on this node (``{node_ip}``) and the sandboxes run
        here. ``tools``: the job's tool flags (:func:`trainer.tools.registry.settings`); without it, the search
        tool over ``retriever_url`` (Search-R1's flags). ``n`` samples per prompt, prompt-major; each
        :class:`Sample` carries its ``action_mask`` (0 on inserted tokens), ``turns`` and ``tool_calls``, and the
        engine's log-probs of its response tokens (0 on the inserted ones, which are no actions). Also returns
        where the time went and what the tools did (``RolloutStats.as_dict``). ``logprobs=False``
        (--skip_rollout_logprobs): the engine is not asked for them (on vLLM a dearer step: 46 % on the CPU
        build at the demo's size) and each sample's are None."""
        from trainer.rollout.multiturn import run_tool_rollout, run_tool_rollout_streaming
        from trainer.tools.registry import build_toolbox, search_settings

        check_generate_args(prompts, n, temperature, 1.0 if temperature == 0 else top_p, max_new_tokens)
        if tools is None:
            if retriever_url is None:
                raise ValueError("generate_with_tools needs tools= (the job's tool flags) or retriever_url=")
            tools = search_settings(retriever_url, retriever_topk, max_turns, retriever_timeout, retriever_retries,
                                    retriever_outage_timeout)
        tokenizer = self.tokenizer  # type: ignore[attr-defined]
        boxes = self.__dict__.setdefault("_toolboxes", {})  # one toolbox (clients, pools) per setting, kept
        key = repr(sorted(tools.items()))
        if key not in boxes:
            boxes[key] = build_toolbox(tools, tokenizer)
        box = boxes[key]
        ids = tokenize_prompts(tokenizer, prompts)
        stepper = self.stepper(logprobs=logprobs)
        loop, engine = ((run_tool_rollout, functools.partial(self.complete, logprobs=logprobs)) if stepper is None
                        else (run_tool_rollout_streaming, stepper))
        tool_tokenizer = tokenizer
        if stepper is not None:  # the streaming loop tokenizes the results in its tool thread: its own copy, as
            # a fast tokenizer used from two threads at once can fail ("Already borrowed")
            if "_tool_tokenizer" not in self.__dict__:
                self.__dict__["_tool_tokenizer"] = copy.deepcopy(tokenizer)
            tool_tokenizer = self.__dict__["_tool_tokenizer"]
        rows, stats = loop(
            engine, lambda text: list(tool_tokenizer(text, add_special_tokens=False).input_ids), ids, n=n,
            tool=box, max_turns=box.max_calls, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
            seed=seed, eos_id=tokenizer.eos_token_id)
        samples = [Sample(prompts[r.prompt_index], list(ids[r.prompt_index]), r.response,
                          tokenizer.decode(r.response, skip_special_tokens=True), r.logprobs, r.finish_reason,
                          r.action_mask, r.turns, r.tool_calls) for r in rows]
        return samples, stats.as_dict()

    @abc.abstractmethod
    def update_weights(self, weights: Weights) -> int:
        """Load new weights (HF checkpoint names); returns how many tensors were loaded.

        Implementations reset the prefix cache afterwards: a cached prefix computed with the old weights
        would otherwise be reused.
        """

    @abc.abstractmethod
    def reset_prefix_cache(self) -> None:
        """Forget every cached prompt prefix."""

    @abc.abstractmethod
    def sleep(self) -> int:
        """Free accelerator memory while the trainer runs; returns the bytes freed (0 where unsupported:
        a logged no-op)."""

    @abc.abstractmethod
    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo :meth:`sleep`, all of it or the ``tags`` given (a logged no-op where unsupported)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Release the engine; idempotent. Call before killing the process that hosts it."""

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def check_generate_args(prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int) -> None:
    """Raise ValueError naming the first bad ``generate`` argument."""
    if not isinstance(prompts, list | tuple) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of str (apply the chat template before calling generate)")
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def tokenize_prompts(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt, the same way in every engine (tokenizer defaults for special tokens)."""
    ids = [list(tokenizer(p).input_ids) for p in prompts]
    empty = [i for i, t in enumerate(ids) if not t]
    if empty:
        raise ValueError(f"prompt(s) {empty} tokenize to no tokens; expected at least one token per prompt")
    return ids


def named_tensors(weights: Weights) -> Iterable[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of any :data:`Weights` form (blobs are decoded)."""
    from trainer.weights.buckets import from_safetensors_bytes

    if isinstance(weights, bytes | bytearray | memoryview):
        return from_safetensors_bytes(weights).items()
    if isinstance(weights, list) and weights and isinstance(weights[0], bytes | bytearray):
        return [pair for blob in weights for pair in from_safetensors_bytes(blob).items()]
    if isinstance(weights, Mapping):
        return weights.items()
    return weights
