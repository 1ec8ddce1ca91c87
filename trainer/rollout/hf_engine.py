"""The HF ``generate`` rollout engine: ``--rollout_backend hf`` and the reference the vLLM engine is tested on.

Same interface and conventions as :mod:`trainer.rollout.engine`. No prefix cache, so
:meth:`HfEngine.reset_prefix_cache` has nothing to do; :meth:`HfEngine.sleep` moves the model to CPU when it
lives on a GPU and is a logged no-op otherwise.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch

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


class HfEngine(RolloutEngine):
    """``AutoModelForCausalLM.from_pretrained(model_path)`` + ``generate``.

    Args:
        model_path: HF model directory.
        device: where the model runs (default: CUDA if available, else CPU).
        dtype: torch dtype (default: the checkpoint's).
        batch_size: prompts per ``generate`` call.
    """

    def __init__(
        self,
        model_path: str,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        batch_size: int = 64,
        **_ignored: Any,
    ) -> None:
        self.startup_marks = Marks()  # its process's start, then these (trainer.startup)
        self.startup_marks.mark("init")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.startup_marks.mark("imported")

        if _ignored:
            log.info("HfEngine ignores vLLM-only options: %s", ", ".join(sorted(_ignored)))
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        kwargs: dict[str, Any] = {}
        if dtype is not None:
            kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.model: Any = AutoModelForCausalLM.from_pretrained(model_path, **kwargs).to(self.device).eval()
        self.model_path = str(model_path)
        self.batch_size = batch_size
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        self.startup_marks.mark("ready")

    # --- generation ------------------------------------------------------------------------------------
    @torch.no_grad()
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
        """See :meth:`RolloutEngine.generate`; ``seed`` seeds a forked RNG (global RNG state is kept);
        ``logprobs``: compute the sampled tokens' log-probs (the training loop asks for none)."""
        check_generate_args(prompts, n, temperature, top_p, max_new_tokens)
        if self.model is None:
            raise RuntimeError("this HfEngine was shut down")
        ids = tokenize_prompts(self.tokenizer, prompts)
        samples: list[Sample] = []
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.manual_seed(seed)
            for start in range(0, len(prompts), self.batch_size):
                chunk = slice(start, start + self.batch_size)
                samples += self._generate_batch(prompts[chunk], ids[chunk], n, temperature, top_p, max_new_tokens,
                                                logprobs)
        return samples

    def _generate_batch(
        self, prompts: list[str], ids: list[list[int]], n: int, temperature: float, top_p: float,
        max_new_tokens: int, logprobs: bool = True,
    ) -> list[Sample]:  # fmt: skip
        width = max(len(t) for t in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, t in enumerate(ids):  # left padding
            input_ids[i, width - len(t) :] = torch.tensor(t)
            mask[i, width - len(t) :] = 1
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=logprobs,
            **sampling,
        )
        new_dev = out.sequences[:, width:]
        # Log-probs of the sampled tokens after the temperature (the policy's), one step at a time on the
        # model's device: stacking every step's logits ([batch * n, steps, vocab] float32, 10 GB for 64 x 256
        # tokens of a 152k vocab) and taking the softmax on the CPU cost more than the generation itself.
        logp = _sampled_logprobs(out.logits, new_dev, temperature) if logprobs else None
        new = new_dev.cpu()
        samples = []
        for row in range(new.shape[0]):
            tokens = new[row].tolist()
            finish = "length"
            if self.eos_id is not None and self.eos_id in tokens:
                tokens = tokens[: tokens.index(self.eos_id) + 1]
                finish = "stop"
            p = row // n
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            lps = logp[row, : len(tokens)].tolist() if logp is not None else None
            samples.append(Sample(prompts[p], list(ids[p]), tokens, text, lps, finish))
        return samples

    @torch.no_grad()
    def complete(self, contexts: list[list[int]], max_tokens: list[int], stop: Sequence[str],
                 temperature: float, top_p: float, seeds: list[int | None], logprobs: bool = True) -> list[Completion]:
        """See :meth:`RolloutEngine.complete`. One batched ``generate`` per ``batch_size`` contexts, up to the
        largest budget (each row is cut to its own); a stopping criterion ends a row at a stop string. The
        first seed seeds a forked RNG for the call (rows differ by their place in the batch)."""
        if self.model is None:
            raise RuntimeError("this HfEngine was shut down")
        out: list[Completion] = []
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if seeds and seeds[0] is not None:
                torch.manual_seed(seeds[0])
            for start in range(0, len(contexts), self.batch_size):
                chunk = slice(start, start + self.batch_size)
                out += self._complete_batch(contexts[chunk], max_tokens[chunk], list(stop), temperature, top_p,
                                            logprobs)
        return out

    def _complete_batch(self, ids: list[list[int]], budgets: list[int], stop: list[str], temperature: float,
                        top_p: float, logprobs: bool = True) -> list[Completion]:
        from transformers import StoppingCriteria, StoppingCriteriaList

        width = max(len(t) for t in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, t in enumerate(ids):  # left padding
            input_ids[i, width - len(t) :] = torch.tensor(t)
            mask[i, width - len(t) :] = 1
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=False)
        window = max(len(s) for s in stop) + 8 if stop else 0

        class StopAt(StoppingCriteria):  # a row is done once its recent text holds a stop string
            def __call__(self, seqs: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
                tails = [decode(row[width:][-window:].tolist()) for row in seqs]
                return torch.tensor([any(s in t for s in stop) for t in tails], device=seqs.device)

        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        out = self.model.generate(
            input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
            max_new_tokens=max(max(budgets), 1), eos_token_id=self.eos_id, pad_token_id=self.pad_id,
            stopping_criteria=StoppingCriteriaList([StopAt()]) if stop else None, return_dict_in_generate=True,
            output_logits=logprobs, **sampling)
        new_dev = out.sequences[:, width:]
        logp = _sampled_logprobs(out.logits, new_dev, temperature).tolist() if logprobs else None
        results = []
        for i, (row, budget) in enumerate(zip(new_dev.cpu().tolist(), budgets, strict=True)):
            tokens, finish = row[: max(budget, 0)], "length"
            if self.eos_id is not None and self.eos_id in tokens:
                tokens, finish = tokens[: tokens.index(self.eos_id) + 1], "stop"
            cut = cut_at_stop(tokens, decode, stop) if stop else tokens
            if len(cut) < len(tokens) or (finish == "length" and cut and any(decode(cut).endswith(s) for s in stop)):
                tokens, finish = cut, "stop"
            results.append(Completion(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True), finish,
                                      None if logp is None else logp[i][: len(tokens)]))
        return results

    # --- weights ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def update_weights(self, weights: Weights) -> int:
        """Copy tensors into the model's parameters/buffers by HF name; all names must exist, shapes match."""
        if self.model is None:
            raise RuntimeError("this HfEngine was shut down")
        targets = dict(self.model.named_parameters(remove_duplicate=False))
        targets.update(self.model.named_buffers())
        count = 0
        for name, tensor in named_tensors(weights):
            target = targets.get(name)
            if target is None:
                raise KeyError(f"weight {name!r} is not a parameter or buffer of {self.model_path}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}; the model expects {tuple(target.shape)}"
                )
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            count += 1
        if count == 0:
            raise ValueError("weight update with no tensors: expected at least one (name, tensor)")
        return count

    def reset_prefix_cache(self) -> None:
        """Nothing cached between calls: no-op."""

    # --- memory ----------------------------------------------------------------------------------------
    def sleep(self) -> int:
        """Move the model to the host; returns the bytes freed (0 off CUDA: a logged no-op)."""
        if self.device.type != "cuda":
            log.info("HfEngine sleep() is a no-op on %s", self.device)
            return 0
        before = torch.cuda.memory_allocated(self.device)
        self.model.to("cpu")
        torch.cuda.empty_cache()
        return max(before - torch.cuda.memory_allocated(self.device), 0)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Move the model back to the device (``tags`` is accepted for the engine interface; all of it moves)."""
        if self.device.type != "cuda":
            log.info("HfEngine wake_up() is a no-op on %s", self.device)
            return
        self.model.to(self.device)

    def shutdown(self) -> None:
        self.model = None


def _sampled_logprobs(logits: tuple[torch.Tensor, ...], tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[rows, steps]`` log-probs of ``tokens`` under each step's logits after the temperature (greedy: 1),
    computed a step at a time on the logits' device; CPU float32."""
    scale = temperature if temperature > 0 else 1.0
    return torch.stack([torch.log_softmax(step.float() / scale, dim=-1).gather(-1, tokens[:, t : t + 1]).squeeze(-1)
                        for t, step in enumerate(logits)], dim=1).cpu()
