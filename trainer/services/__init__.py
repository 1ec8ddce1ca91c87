"""The scaffolding of rlrun's two deployed HTTP services and of their clients.

The services themselves live with what they serve: the reward service in ``trainer.reward.server``
(``python -m trainer.reward.server``, deployed by roles/reward_server) and the retrieval service in
``trainer.retrieval`` (``python -m trainer.retrieval serve``, deployed by roles/retriever). Both run on
their hosts under gunicorn, outside Ray; their clients run inside the Ray job. What they share is here,
written once:

* ``cli``: the command line, declared from a table of :class:`~trainer.services.cli.Flag` rows (both
  spellings of each flag, one-line errors with exit status 2, ports and positive numbers checked);
* ``token``: the bearer token, read by a service from its 0600 file and by a client from its environment;
* ``app``: the Flask app factory (the token check, JSON errors, ``Allow`` on 405, opaque 500s);
* ``serve``: gunicorn driven in code, with ``worker.ReadFirstWorker`` (requests read whole, against
  deadlines, before a thread sees them) and ``ratelog`` (log lines a flood cannot multiply);
* ``client``: the HTTP client base (retries with backoff, TLS against a CA, bearer token, one-line errors).

Nothing here imports torch or Ray; Flask and gunicorn are imported by ``app``, ``serve`` and ``worker``
only, so a client (``client``, ``token``) loads neither.
"""
