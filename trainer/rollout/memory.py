"""GPU memory between colocated engines and the models (``--vllm_enable_sleep``, vLLM on GPUs).

Engines that share the models' GPUs hand their memory to training after they generate: they sleep (vLLM sleep
level 2: weights and KV cache released) and wake before the next weight push, their weights first (the push
fills them; their contents are undefined until then) and their KV cache once the weights are in (the engine's
own ``finish_weight_update``). Before they wake, the models' allocators hand back the blocks they cache when a
GPU has less free memory than its engines need back (:func:`needs_room`); emptying them costs the next step its
allocations, so only then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Free memory a GPU must have beyond what a waking engine takes back (fragmentation, the CUDA graphs' pool).
WAKE_MARGIN = 1.1


def needs_room(free: list[tuple[str, int]], wake_need: dict[str, int]) -> bool:
    """Whether any GPU has less free memory than its sleeping engines need to wake: ``free`` is each model
    rank's view of its device (UUID, free bytes), ``wake_need`` the bytes the engines' sleep freed per device
    (summed over engines that share one), with :data:`WAKE_MARGIN`. A GPU no engine sleeps on needs nothing;
    without GPUs there is nothing to make room for."""
    return any(nbytes < WAKE_MARGIN * wake_need.get(device, 0) for device, nbytes in free)


class EngineMemory:
    """The engines' sleep and wake around training (see the module docstring).

    Args:
        engines: the rollout engines (``sleep``, ``wake``).
        models: the model groups on the engines' GPUs (``async_run("device_free")``, ``async_run("empty_cache")``).
        sleeps: whether the engines sleep at all (``--vllm_enable_sleep``, vLLM, GPUs); if not, every call is a
            no-op.
    """

    def __init__(self, engines: Any, models: Sequence[Any], sleeps: bool) -> None:
        self.engines, self.models, self.sleeps = engines, list(models), sleeps
        self.wake_need: dict[str, int] = {}  # bytes the engines' last sleep freed, per GPU

    def sleep(self) -> int:
        """Every engine releases its weights and KV cache; returns the bytes freed. What the engines freed on each
        GPU, summed, is what waking them needs back there."""
        if not self.sleeps:
            return 0
        self.wake_need = self.engines.sleep()
        return sum(self.wake_need.values())

    def wake_weights(self) -> None:
        """Before a weight push: the engines' weights' memory back, room made for it first where needed."""
        if not self.sleeps:
            return
        self.make_room()
        self.engines.wake(tags=["weights"])

    def make_room(self) -> bool:
        """If a GPU has less free memory than its engines need back, the models hand their allocators' cached
        blocks back. Returns whether they did."""
        import ray

        free = ray.get([ref for g in self.models for ref in g.async_run("device_free")])
        if not needs_room(free, self.wake_need):
            return False
        ray.get([ref for g in self.models for ref in g.async_run("empty_cache")])
        return True
