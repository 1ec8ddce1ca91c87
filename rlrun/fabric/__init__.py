"""`rlrun check --fabric`: run collectives across the live cluster before a job does, and name what breaks.

- ``check.py`` (controller): ships ``job.py`` as a Ray job through the Jobs API, waits for its ``@fabric``
  report, adds the findings and prints the table (or ``--json``).
- ``job.py`` (on the cluster): one rank per GPU (NCCL) or per node (gloo) on a placement group, a
  send/recv between every pair of nodes (and two GPUs of each node), an all-reduce across everything, each
  collective under a deadline (``trainer/collective_deadline.py``).
- ``nccl_log.py``: what NCCL chose, from its ``NCCL_DEBUG=INFO`` lines.
- ``findings.py``: the thresholds, as a table of findings.
"""
