"""Weights: how the policy's weights reach the rollout engines, sender and receiver, every transport.

- :mod:`.buckets`: the bucket format (flat per-dtype buffers, their manifests and headers) and safetensors blobs;
- :mod:`.gather`: the sender's source, a ZeRO-3 model's full parameters gathered a bucket at a time;
- :mod:`.broadcast`: the dedicated process group and the bucket stream over it (engines on devices of their own);
- :mod:`.shared`: buckets handed over in place, CUDA IPC or ``/dev/shm`` (engines colocated with the policy),
  with the policy ranks' push (:func:`.shared.push_shared`);
- :mod:`.vllm_worker_ext`: the receiver inside vLLM's workers (``WeightSyncExtension``) and its loader;
- :mod:`.transports`: the transport the placement plan chooses, driven from the loop.

The narrow door: the loop calls ``make_weight_sync(cfg, plan, policy, engines)`` once and ``push()`` after
every training step; the policy's workers call :mod:`.gather`, :mod:`.broadcast` and :func:`.shared.push_shared`,
the engines name ``trainer.weights.vllm_worker_ext.WeightSyncExtension`` to vLLM and decode safetensors blobs
with :mod:`.buckets`. Nothing here imports the rollout or learn packages: the engines and the policy group are
taken as they are handed in.
"""
