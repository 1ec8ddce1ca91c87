"""rlrun: provision a Ray RL cluster from an Ansible inventory and run jobs on it."""
__version__ = "0.1.0"
