"""The test lab (root only): hosts made of network namespaces (netns.py) and cluster
inventories on them (inventory.py), for the multinode tests, molecule/multinode and
bench/bringup.py. It is not part of the shipped rlrun package."""
