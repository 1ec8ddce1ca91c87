"""Learning: the DeepSpeed model groups and what they compute.

- :mod:`.group`: ranked Ray actor groups on a placement group (``ActorGroup``, ``DistributedWorker``), the
  placement-group reservations and the rendezvous ports the engines reuse;
- :mod:`.model_worker`: one rank of the policy or the reference model; :mod:`.critic_worker`: one rank of
  PPO's critic;
- :mod:`.losses` and :mod:`.algorithms`: pure torch, no Ray (log-probs, KL, the policy and value losses;
  advantages and returns, chosen once from the config); :mod:`.packing`: several samples in one row.

The narrow door: the loop builds an ``ActorGroup`` of ``ModelWorker`` / ``CriticWorker`` per plan group and
calls the workers' methods by name through it (``init_model``, ``batch_logprobs``, ``train_policy``,
``train_critic``, ``train_sft``, ``save_hf``); the weight push calls ``broadcast_weights`` /
``push_weights_shared``, whose work is :mod:`trainer.weights`'. Nothing here imports the rollout side.

Empty on purpose: ``rlrun check --fabric`` ships :mod:`.group` with this file alone (rlrun/fabric/check.py).
"""
