#!/usr/bin/env bash
# Two Ray "nodes" on one 4-GPU machine, 2 GPUs each, so that the trainer's groups cross a node boundary.
#
#   bash bench/gpu/two_nodes.sh up LOGDIR      # start them; writes /tmp/rl7nodes.env
#   bash bench/gpu/two_nodes.sh exec CMD...    # run CMD as the job's driver (on node 1, RAY_ADDRESS set)
#   bash bench/gpu/two_nodes.sh down LOGDIR    # NCCL transport lines to LOGDIR/nccl_two_nodes.txt; stop
#
# Each node lives in its own network namespace (rl7n1, rl7n2), joined by one veth pair (10.231.77.11 and
# .12): Ray's nodes talk over it. The namespaces share the hostname, so each node gets its own NCCL_HOSTID
# as well: NCCL then treats them as two hosts (no P2P/SHM between them) and has to use its network
# transport, as between real machines. Where namespaces cannot be made, the nodes use 127.0.0.2 and
# 127.0.0.3 of one namespace instead (MODE=loopback in the env file), with the same NCCL_HOSTIDs.
# Run as root on a machine of your own (the device machine): `down` ends the namespaces' processes.
set -uo pipefail
state=/tmp/rl7nodes.env
port=${RL7_PORT:-6390}
object_store=${RL7_OBJECT_STORE:-8000000000}
cmd=${1:?usage: two_nodes.sh up|exec|down}
shift

node_env() {  # node index -> env assignments
  local i=$1 gpus=$2 ifname=$3
  echo "CUDA_VISIBLE_DEVICES=$gpus NCCL_HOSTID=rl7-node-$i HOME=/tmp/rl7home$i NCCL_DEBUG=INFO" \
       "NCCL_DEBUG_SUBSYS=INIT,NET NCCL_SOCKET_IFNAME=$ifname GLOO_SOCKET_IFNAME=$ifname"
}

up() {
  local logdir=$1 mode=netns ip1=10.231.77.11 ip2=10.231.77.12 if1=rl7a if2=rl7b
  mkdir -p "$logdir" /tmp/rl7home1 /tmp/rl7home2
  if ! { ip netns add rl7n1 && ip netns add rl7n2 &&
         ip link add rl7a netns rl7n1 type veth peer name rl7b netns rl7n2 &&
         ip -n rl7n1 addr add $ip1/24 dev rl7a && ip -n rl7n2 addr add $ip2/24 dev rl7b &&
         ip -n rl7n1 link set rl7a up && ip -n rl7n2 link set rl7b up &&
         ip -n rl7n1 link set lo up && ip -n rl7n2 link set lo up; } 2>"$logdir/netns.err"; then
    echo "network namespaces unavailable ($(tr '\n' ' ' <"$logdir/netns.err")); using loopback addresses"
    ip netns del rl7n1 2>/dev/null; ip netns del rl7n2 2>/dev/null
    mode=loopback ip1=127.0.0.2 ip2=127.0.0.3 if1=lo if2=lo
  fi
  local run1="" run2=""
  if [ $mode = netns ]; then run1="ip netns exec rl7n1" run2="ip netns exec rl7n2"; fi
  local ray=(python3 -m ray.scripts.scripts start --num-gpus 2 --num-cpus 16 --object-store-memory $object_store
             --disable-usage-stats)
  # shellcheck disable=SC2046
  $run1 env $(node_env 1 0,1 $if1) "${ray[@]}" --head --include-dashboard=False --node-ip-address $ip1 --port $port \
    --temp-dir /tmp/rl7ray1 >"$logdir/ray_node1.log" 2>&1 || { echo "head failed"; tail "$logdir/ray_node1.log"; return 1; }
  # shellcheck disable=SC2046
  $run2 env $(node_env 2 2,3 $if2) "${ray[@]}" --address $ip1:$port --node-ip-address $ip2 \
    --temp-dir /tmp/rl7ray2 >"$logdir/ray_node2.log" 2>&1 || { echo "worker failed"; tail "$logdir/ray_node2.log"; return 1; }
  cat >$state <<EOF
MODE=$mode
RUN1="$run1"
NODE1_ENV="$(node_env 1 0,1 $if1)"
RAY_ADDRESS=$ip1:$port
EOF
  $run1 env RAY_ADDRESS=$ip1:$port python3 - <<'EOF'
import time, ray
ray.init()
for _ in range(60):
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) == 2:
        break
    time.sleep(1)
print("nodes:", [(n["NodeManagerAddress"], n["Resources"].get("GPU")) for n in ray.nodes() if n["Alive"]])
assert len(alive) == 2, "the second node did not join"
EOF
  echo "two nodes up ($mode)"
}

run_exec() {
  # shellcheck disable=SC1090
  source $state
  # shellcheck disable=SC2086
  $RUN1 env $NODE1_ENV RAY_ADDRESS=$RAY_ADDRESS "$@"
}

down() {
  local logdir=$1
  grep -rhoE "NCCL INFO (Channel [0-9/]+ : [0-9]+\[[0-9]+\] -> [0-9]+\[[0-9]+\] \[?[a-z]*\]? ?via [A-Za-z/_]+.*|NET/[A-Za-z]+ : Using.*|Using network [A-Za-z]+)" \
    /tmp/rl7ray1/session_latest/logs /tmp/rl7ray2/session_latest/logs 2>/dev/null | sort | uniq -c \
    >"$logdir/nccl_two_nodes.txt"
  for ns in rl7n1 rl7n2; do
    if ip netns list 2>/dev/null | grep -qw $ns; then
      for pid in $(ip netns pids $ns); do kill -9 "$pid" 2>/dev/null; done
      sleep 1
      ip netns del $ns
    fi
  done
}

case $cmd in
  up) up "${1:?LOGDIR}" ;;
  exec) run_exec "$@" ;;
  down) down "${1:?LOGDIR}" ;;
  *) echo "unknown command $cmd: expected up, exec or down" >&2; exit 2 ;;
esac
