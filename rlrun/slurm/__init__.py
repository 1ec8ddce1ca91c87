"""`rlrun slurm`: the same secured Ray cluster, and the same job, inside a Slurm allocation.

- :mod:`rlrun.slurm.spec`: the node-start spec (``ray start`` flags, env files,
  reward service command) evaluated from the roles' own files (roles/cluster,
  ray_node, accel_env, reward_server) with Ansible's templar, with the values
  only the allocation knows left as shell variables.
- :mod:`rlrun.slurm.ports`: the per-job port block, derived from the job id.
- :mod:`rlrun.slurm.script`: renders the sbatch script (``job.sbatch.j2``).
- :mod:`rlrun.slurm.runtime`: the helpers the script calls on the nodes
  (``python -m rlrun.slurm.runtime ...``).
- :mod:`rlrun.slurm.control`: sbatch / squeue / scontrol / scancel for
  ``rlrun slurm submit|status|logs|cancel``.
"""
