"""rlrun's commands, one module per group; rlrun/cli.py puts them under one click group.

* ``cluster``: validate, up, down, check, status (the cluster against its inventory)
* ``submit``: submit (a command or a preset, checked against the live cluster)
* ``jobs``: list, logs, stop, and one job's status or progress view
* ``presets``: presets (list, or show one resolved)
* ``plot``: plot (jobs' metrics to a PNG)
* ``slurm``: slurm render / submit / status / logs / cancel

``context`` holds what every command shares (the inventory and cluster, options defined once);
``output`` renders what they print (tables, columns, JSON, problem lists), in one place.
"""
