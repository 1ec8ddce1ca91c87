"""The job's code and the two services deployed beside it.

* The trainer runs inside the Ray job (``python -m trainer.train_ppo_ray``, submitted by ``rlrun submit``):
  ``config``, ``placement``, ``actors``, ``rollout``, ``sync``, ``loop`` and the job's clients of the services.
* Two HTTP services run on their hosts under gunicorn, outside Ray, deployed by their roles: the reward service
  ``trainer.reward.server`` (roles/reward_server) and the retrieval service ``trainer.retrieval``
  (roles/retriever). They live here because the job imports their pure parts (the answer checks of
  ``trainer.reward``, the index of ``trainer.retrieval``) and their clients.
* ``trainer.services``: what the two services and their clients share (command line, token, Flask app, gunicorn,
  HTTP client).
"""
