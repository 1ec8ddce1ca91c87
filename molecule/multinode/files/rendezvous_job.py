"""A Ray job that holds the trainer's rendezvous open across every node, as training does.

    python -c "$(cat rendezvous_job.py)" RELEASE_FILE HOLD_SECONDS

One rank per alive node joins a gloo group through the trainer's own handshake
(trainer.learn.group.DistributedWorker: rank 0's rendezvous_address, then
init_process_group on every rank, as ActorGroup does for the policy), and rank 0
hosts a weight-sync group that rank 1 joins (trainer.weights.broadcast.make_sync_group, as
policy rank 0 and a rollout engine do). It prints READY with where every rank
runs and where rank 0's two stores listen, keeps both groups alive until
RELEASE_FILE exists (at most HOLD_SECONDS), then an all-reduce over the group and
a broadcast over the weight-sync group, and prints DONE with their results.
"""

import json
import os
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainer.learn.group import DistributedWorker

release, hold = sys.argv[1], float(sys.argv[2])


class Rank(DistributedWorker):
    def where(self):
        return ray.util.get_node_ip_address()

    def all_reduce(self):
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

    def sync_group(self, addr, port, rank, world):
        from trainer.weights.broadcast import make_sync_group

        fd = self.take_listen_fd(port) if rank == 0 else None
        self.sync = make_sync_group(addr, port, rank, world, "gloo", timeout_s=300, master_listen_fd=fd)
        return rank

    def sync_broadcast(self):
        import torch

        from trainer.weights.broadcast import broadcast_tensor

        value = torch.tensor([7.0]) if self.sync.rank == 0 else torch.zeros(1)
        broadcast_tensor(self.sync, value)
        return value.item()


ray.init()
nodes = sorted((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])
ranks = [ray.remote(num_cpus=0.1)(Rank).options(
    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(i, len(nodes))
    for i, (_ip, node_id) in enumerate(nodes)]
group = ray.get(ranks[0].rendezvous_address.remote())
assert ray.get([r.init_process_group.remote(*group, "gloo") for r in ranks]) == list(range(len(ranks)))
sync = ray.get(ranks[0].rendezvous_address.remote())
ray.get([ranks[0].sync_group.remote(*sync, 0, 2), ranks[1].sync_group.remote(*sync, 1, 2)])
print("READY " + json.dumps({"ranks": ray.get([r.where.remote() for r in ranks]), "group": group, "sync": sync}),
      flush=True)
deadline = time.monotonic() + hold
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.5)
reduced = ray.get([r.all_reduce.remote() for r in ranks])
received = ray.get([ranks[0].sync_broadcast.remote(), ranks[1].sync_broadcast.remote()])
print("DONE " + json.dumps({"released": os.path.exists(release), "all_reduce": reduced, "broadcast": received}),
      flush=True)
