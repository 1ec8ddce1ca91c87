"""Run on a lab host that is not a Ray node: try to join the cluster as a worker
without the token, and to connect to it as a client without the token, at once.

    python auth_probe.py GCS_ADDRESS NODE_IP

Prints one JSON object: for "join" and "client", whether the process was still
running after the wait (a worker that got in blocks in `ray start --block`), its
exit code and the tail of its output. Everything it starts runs in sessions of
its own, ended by session id before it exits, so it leaves no process behind.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

gcs, node_ip = sys.argv[1], sys.argv[2]
bin_dir = Path(sys.executable).parent
root = Path(tempfile.mkdtemp(prefix="rlrun-probe-", dir="/tmp"))
# No RAY_AUTH_* at all: a node or client that does not have the token.
env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
env.update(HOME=str(root), RAY_USAGE_STATS_ENABLED="0")
base = 9400
join = [str(bin_dir / "ray"), "start", "--block", "--address", gcs, "--node-ip-address", node_ip,
        "--temp-dir", str(root / "t"), "--num-cpus", "1", "--object-store-memory", "80000000",
        "--node-manager-port", str(base), "--object-manager-port", str(base + 1),
        "--dashboard-agent-listen-port", str(base + 2), "--dashboard-agent-grpc-port", str(base + 3),
        "--runtime-env-agent-port", str(base + 4), "--metrics-export-port", str(base + 5),
        "--min-worker-port", str(base + 100), "--max-worker-port", str(base + 199), "--disable-usage-stats"]
client = [sys.executable, "-c", f"import ray; ray.init(address={gcs!r}); print('CONNECTED', len(ray.nodes()))"]
procs = {name: subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
         for name, argv in (("join", join), ("client", client))}
deadline = time.monotonic() + 120
while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
    time.sleep(0.5)
result = {}
for name, proc in procs.items():
    running = proc.poll() is None
    # End the whole session (whatever `ray start` spawned), by session id.
    for _ in range(3):
        left = subprocess.run(["ps", "-o", "pid=", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.5)
    out = proc.communicate()[0].decode(errors="replace")
    result[name] = {"still_running": running, "rc": proc.returncode, "tail": out[-1500:]}
subprocess.run(["rm", "-rf", str(root)], check=False)
print(json.dumps(result))
