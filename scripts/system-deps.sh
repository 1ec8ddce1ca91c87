#!/usr/bin/env bash
# The system packages `make test` needs, in one list; `.ci/run` and `make test`
# both run this first.
#   scripts/system-deps.sh          install what is missing (as root), or fail at
#                                   once with the exact install line (not root)
#   scripts/system-deps.sh --check  only say what is missing (exit 1 if anything)
# Debian / Ubuntu package names. The whole suite needs root as well: the
# multinode tests make hosts from network namespaces (tests/lab/netns.py).
set -euo pipefail

# command:package. ps, ss, start-stop-daemon: the supervised services and their
# checks; ip, unshare, mount, ssh, ssh-keygen, sshd: the network-namespace hosts;
# systemd-analyze: the systemd unit test; nft: the firewall role (its test and
# the multinode scenario); curl, make: the README's commands;
# munged, slurmctld, slurmd, sbatch, nsenter, setpriv, shellcheck: the Slurm tests
# (tests/lab/slurm.py runs a private Slurm; no daemon is started by the packages).
pairs=(
  ps:procps ss:iproute2 ip:iproute2 start-stop-daemon:dpkg curl:curl make:make
  unshare:util-linux mount:mount ssh:openssh-client ssh-keygen:openssh-client
  /usr/sbin/sshd:openssh-server systemd-analyze:systemd /usr/sbin/nft:nftables
  nsenter:util-linux setpriv:util-linux /usr/sbin/munged:munge /usr/sbin/slurmctld:slurmctld
  /usr/sbin/slurmd:slurmd sbatch:slurm-client shellcheck:shellcheck
)

need=()
for pair in "${pairs[@]}"; do
  cmd=${pair%%:*} pkg=${pair##*:}
  if ! command -v "$cmd" >/dev/null 2>&1 && [[ " ${need[*]} " != *" $pkg "* ]]; then
    need+=("$pkg")
  fi
done

line="apt-get install -y --no-install-recommends ${need[*]}"
if [ "$(id -u)" != 0 ]; then
  # Checked first: without root nothing of the suite's multinode part can run.
  echo "make test needs root (the multinode tests make hosts from network namespaces);" \
       "run it as root, or run \`make check\` (lint + unit tests, no cluster)" >&2
  if [ ${#need[@]} -gt 0 ]; then
    echo "missing system packages: ${need[*]}; install them with: sudo $line" >&2
  fi
  exit 1
fi
[ ${#need[@]} -eq 0 ] && exit 0
if [ "${1:-}" = --check ]; then
  echo "missing system packages: ${need[*]}; install them with: $line" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "missing system packages: ${need[*]} (Debian names), and no apt-get here to install them" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive $line -qq
