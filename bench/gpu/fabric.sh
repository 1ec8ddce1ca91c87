#!/usr/bin/env bash
# `rlrun check --fabric` (issue 32) on the miniature's two loopback Ray nodes: site.yml brings them up,
# the check runs twice (table, then --json), playbooks/teardown.yml takes them down again.
#
#   bash bench/gpu/fabric.sh cpu OUT   # here, after `make venv`: bench/gpu/miniature/inventory (127.0.0.7 and
#                                      # 127.0.0.8, 2 CPUs each, gloo over lo): one gloo rank per node
#   bash bench/gpu/fabric.sh x4 OUT    # nvidia-h100-x4 / nvidia-h200-x4, once the carried packages are in
#                                      # /tmp/site (bench/gpu/carry.py install, or bench/gpu/miniature/run.sh x4):
#                                      # inventory-x4, node1 GPUs 0,1 and node2 GPUs 2,3, each its own NCCL_HOSTID
#
# OUT gets site.log, status.txt, fabric.txt (the table), fabric.json (the report and findings), nccl.txt (the
# NCCL lines the report rests on, per pair), verdict.txt, teardown.log, summary.txt (seconds per stage).
# The target on x4: P2P/CUMEM between the two GPUs of a node, NET/Socket between the nodes, as NCCL_DEBUG says;
# verdict.txt says whether the report shows exactly that (cpu: gloo on lo between the nodes). Exit status: the
# check's (0: no error finding), or 1 when the verdict fails or the cluster does not come up.
# Nothing is stopped by name: teardown.yml ends this cluster's own processes, by pidfile.
set -uo pipefail
kind=${1:?usage: fabric.sh cpu|x4 OUT}
out=$(realpath -m "${2:?usage: fabric.sh cpu|x4 OUT}")
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
here=bench/gpu/miniature
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
stage() {  # stage NAME CMD...: run, append its seconds and exit code to the summary
  local name=$1 t0 ms rc
  shift
  t0=$(date +%s%N)
  "$@"
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-12s %5d.%01d s  rc=%s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) "$rc" >>"$summary"
  return $rc
}
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8 LANG=C.UTF-8
export ANSIBLE_CONFIG=$root/ansible.cfg ANSIBLE_FORCE_COLOR=0

case $kind in
  cpu)
    inv=$here/inventory
    cluster=mini8
    venv=$(realpath -m "${VENV:-.venv}")
    [ -x "$venv/bin/ansible-playbook" ] || { echo "no $venv/bin/ansible-playbook: run make venv first"; exit 1; }
    export PATH=$venv/bin:$PATH
    python=$venv/bin/python
    ;;
  x4)
    inv=$here/inventory-x4
    cluster=mini8x4
    [ -f /tmp/site/.installed ] || { echo "nothing installed in /tmp/site: carry and install the packages first" \
      "(bench/gpu/carry.py install --site /tmp/site, see bench/gpu/collect.sh)"; exit 1; }
    # As bench/gpu/miniature/run.sh x4: NVLink multicast off, the dashboard's web build stubbed (Ray's Jobs
    # API will not start without the directory), /tmp/site and the checkout on the path.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    build=/tmp/site/ray/dashboard/client/build
    mkdir -p $build/static
    [ -f $build/index.html ] || echo "<html><body>Ray dashboard web UI not installed</body></html>" >$build/index.html
    export PYTHONPATH=/tmp/site:$root PATH=/tmp/site/bin:$PATH
    python=python3
    ;;
  *) echo "unknown kind $kind: expected cpu or x4" >&2; exit 2 ;;
esac
if ! command -v start-stop-daemon >/dev/null; then  # the x4 image: as run.sh
  mkdir -p /tmp/rlrun-shims && cp $here/start-stop-daemon /tmp/rlrun-shims/ && chmod +x /tmp/rlrun-shims/*
  export PATH=/tmp/rlrun-shims:$PATH
fi
{
  echo "host: $(uname -n) $(nproc) CPUs; python3: $(command -v "$python") $("$python" -V 2>&1)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name --format=csv,noheader && nvidia-smi topo -m
} >"$out/env.txt" 2>&1

teardown() { stage teardown ansible-playbook -i $inv playbooks/teardown.yml >"$out/teardown.log" 2>&1; }
stage site ansible-playbook -i $inv site.yml >"$out/site.log" 2>&1
rc=$?
tail -1 "$summary"
if [ $rc -ne 0 ]; then
  grep -B2 -A25 -E "fatal|ERROR" "$out/site.log" | head -60
  teardown
  exit 1
fi
rlrun=$HOME/.rlrun/$cluster/node1/venv/bin/rlrun  # the entry point python_stack wrote (the checkout's code)
stage status "$rlrun" -i $inv status >"$out/status.txt" 2>&1
cat "$out/status.txt"

stage check "$rlrun" -i $inv check --fabric >"$out/fabric.txt" 2>"$out/fabric.err"
check_rc=$?
tail -1 "$summary"
cat "$out/fabric.err" "$out/fabric.txt"
stage check-json "$rlrun" -i $inv check --fabric --json >"$out/fabric.json" 2>"$out/fabric-json.err"
tail -1 "$summary"
teardown

# The verdict: the transports the report names, against the target, and NCCL's own lines beside them.
"$python" bench/gpu/fabric_verdict.py "$kind" "$out"
verdict=$?
echo "--- summary"
cat "$summary"
[ $verdict -ne 0 ] && exit 1
exit $check_rc
