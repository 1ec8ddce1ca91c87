"""Bad inventories, as careless operators write them (and as kubespray's validate_inventory catches them):
each is refused by `rlrun validate` with a message naming the file, the variable, the value and what is
expected, and by `ansible-playbook site.yml` with the same message before any host is touched: no fact
gathered, no connection, no state dir, no temp dir, no token written, nothing changed.

The playbook runs are made once per case by a module fixture, forked from one process that imported Ansible
once (about 0.4 s each, two at a time); the in-process checks are pure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlrun.validate import TEMP_DIR_MAX, validate_inventory
from tests.conftest import BIN, PROJECT, ansible_env, playbook, write_inventory

pytestmark = pytest.mark.integration

ADDR, PORT = "127.0.0.9", 9300
P = PORT  # the base inventory's ports: gcs P, dashboard P+1, client P+2, node P+10..P+15, workers P+100..P+399,
# reward P+50
GV = "group_vars/all/main.yml"
LONG = "/tmp/" + "x" * (TEMP_DIR_MAX - 4)  # one byte over


def _ssh(address: str) -> dict:
    """A host 'reached over SSH' on a loopback port nothing listens on: any attempt to touch it fails at once."""
    return {"ansible_connection": "ssh", "ansible_host": address, "ansible_port": 1, "cluster__node_address": address}


# (id, how to break the base inventory, regexes that must all be among the problems)
# how: gv = group_vars/all/main.yml changes (None deletes), head = the head host's vars, workers, heads,
#      hosts = a function changing the parsed hosts.yml, files = {path: text} written as is.
CASES = [
    # --- groups and structure -----------------------------------------------------------------------
    ("two heads", dict(heads=["localhost", "b"]),
     [r"hosts.yml: group ray_head = \['localhost', 'b'\]: must hold exactly one host, the Ray head \(2 found\)"]),
    ("no head", dict(hosts=lambda h: h["all"]["children"]["ray_cluster"]["children"]["ray_head"].update(hosts={})),
     [r"group ray_head = \[\]: must hold exactly one host, the Ray head \(0 found\)"]),
    ("head also a worker", dict(workers={"localhost": {}}),
     [r"groups ray_head and ray_workers = \['localhost'\]: share hosts"]),
    ("workers outside ray_cluster", dict(hosts=lambda h: h["all"]["children"].update(
        ray_workers=h["all"]["children"]["ray_cluster"]["children"].pop("ray_workers") | {"hosts": {"w1": _ssh(
            "127.0.0.11")}})),
     [r"group ray_workers = \['w1'\]: holds hosts outside ray_cluster"]),
    ("no ray_cluster group", dict(hosts=lambda h: h["all"]["children"].update(
        h["all"]["children"].pop("ray_cluster")["children"])),
     [r"group ray_cluster: is missing: put ray_head and ray_workers under ray_cluster"]),
    ("group name typo ray_worker", dict(hosts=lambda h: h["all"]["children"]["ray_cluster"]["children"].update(
        ray_worker={"hosts": {"w1": _ssh("127.0.0.11")}})),
     [r"group ray_worker = \['w1'\]: is not a group rlrun reads: did you mean ray_workers\?",
      r"group ray_cluster = \['w1'\]: holds hosts in neither ray_head nor ray_workers"]),
    ("group name typo reward_server", dict(hosts=lambda h: h["all"]["children"].update(
        reward_server=h["all"]["children"].pop("reward_servers"))),
     [r"group reward_server = \['localhost'\]: is not a group rlrun reads: did you mean reward_servers\?"]),
    ("hosts as a list", dict(files={"hosts.yml": "all:\n  children:\n    ray_cluster:\n      children:\n"
                                                 "        ray_head:\n          hosts:\n            - localhost\n"}),
     [r"hosts.yml:7: \(file\): group ray_head: hosts must be a mapping .*not a list"]),
    ("misspelt hosts key", dict(files={"hosts.yml": "all:\n  children:\n    ray_cluster:\n      children:\n"
                                                    "        ray_head:\n          hots:\n            localhost:\n"}),
     [r"hosts.yml:6: \(file\): group ray_head: 'hots' is not hosts, vars or children"]),
    ("YAML error in hosts.yml", dict(files={"hosts.yml": "all:\n  children:\n    ray_cluster:\n  children: [\n"}),
     [r"hosts.yml:\d+: \(file\): is not valid YAML \(line \d+, column \d+: "]),
    ("YAML error in group_vars", dict(files={GV: "cluster__name: val\nray_node__gcs_port: [9300\n"
                                                 "cluster__ray_dashboard_port: 9301\n"}),
     [r"group_vars/all/main.yml:3: \(file\): is not valid YAML \(line 3, column \d+"]),
    ("tab indentation in group_vars", dict(files={GV: "ray_node__resources:\n\tgpu: 1\n"}),
     [r"group_vars/all/main.yml:2: \(file\): is not valid YAML \(line 2, column 1: a tab: YAML indents with "
      r"spaces only\)"]),
    ("group_vars file is a list", dict(files={"group_vars/all/extra.yml": "- cluster__name: val\n"}),
     [r"group_vars/all/extra.yml:1: \(file\): must be a mapping of variable: value \(it is a seq\)"]),
    ("vault file without password", dict(files={"group_vars/all/vault.yml": "$ANSIBLE_VAULT;1.1;AES256\n6162\n"}),
     [r"group_vars/all/vault.yml: \(file\): is vault-encrypted: pass --vault-password-file FILE"]),
    ("vaulted token without password", dict(vault_token=True),
     [r"group_vars/all/vault.yml:1: cluster__token = \(vault-encrypted\) \(host localhost\): is "
      r"vault-encrypted: pass --vault-password-file FILE"]),
    # --- names --------------------------------------------------------------------------------------
    ("misspelt port variable", dict(gv={"cluster__ray_gcs_prot": 9300}),
     [r"cluster__ray_gcs_prot = 9300 \(host localhost\): is not a variable of any role: did you mean "
      r"cluster__ray_gcs_port\?"]),
    ("a port under its old name", dict(gv={"ray_node__gcs_port": 9300}),
     [r"ray_node__gcs_port = 9300 \(host localhost\): was renamed: write cluster__ray_gcs_port"]),
    ("the cluster name under its old name", dict(head={"rlrun__cluster_name": "val"}),
     [r"hosts.yml:\d+: rlrun__cluster_name = 'val' \(host localhost\): was renamed: write cluster__name"]),
    ("misspelt cluster name variable", dict(gv={"cluster__nmae": "val"}),
     [r"cluster__nmae = 'val' .*did you mean cluster__name\?"]),
    ("misspelt accelerator variable", dict(gv={"cluster__acclerator": "nvidia"}),
     [r"cluster__acclerator = 'nvidia' .*did you mean cluster__accelerator\?"]),
    ("derived variable set by hand", dict(gv={"cluster__dashboard_url": "http://x:1"}),
     [r"cluster__dashboard_url = 'http://x:1' .*is derived from other variables"]),
    # --- types from the roles' argument specs ---------------------------------------------------------
    ("auth as the string false", dict(gv={"cluster__auth_enabled": "false"}),
     [r"main.yml:\d+: cluster__auth_enabled = 'false' \(host localhost\): is a string: write the boolean false "
      r"without quotes"]),
    ("reward auth as the string yes", dict(gv={"reward_server__auth_enabled": "yes"}),
     [r"reward_server__auth_enabled = 'yes' .*write the boolean true without quotes"]),
    ("boolean given as 1", dict(gv={"python_stack__install": 1}),
     [r"python_stack__install = 1 .*must be a boolean: true or false"]),
    ("visible devices as a string", dict(gv={"accel_env__visible_devices": "0,1"}),
     [r"accel_env__visible_devices = '0,1' .*must be a list of GPU indices"]),
    ("resources as a string", dict(gv={"ray_node__resources": "accel:1"}),
     [r"ray_node__resources = 'accel:1' .*must be a mapping of name: value"]),
    ("install mode not a choice", dict(gv={"python_stack__project_install": "wheel"}),
     [r"python_stack__project_install = 'wheel' .*must be one of editable, copy"]),
    # --- addresses ----------------------------------------------------------------------------------
    ("address octet 256", dict(head={"cluster__node_address": "127.0.0.256"}),
     [r"hosts.yml:\d+: cluster__node_address = '127.0.0.256' \(host localhost\): must be an IPv4 address: each of "
      r"the four numbers is 0-255"]),
    ("address is a host name", dict(head={"cluster__node_address": "head.example"}),
     [r"cluster__node_address = 'head.example' .*\(a host name: Ray's --node-ip-address takes an IP\)"]),
    ("address with a prefix length", dict(head={"cluster__node_address": "10.0.0.5/24"}),
     [r"'10.0.0.5/24' .*a network, not an address"]),
    ("address with leading zeros", dict(head={"cluster__node_address": "10.0.0.05"}),
     [r"'10.0.0.05' .*without leading zeros"]),
    ("address 0.0.0.0", dict(head={"cluster__node_address": "0.0.0.0"}),
     [r"'0.0.0.0' .*not 0.0.0.0, a broadcast or a multicast address"]),
    ("address 127.0.0.1", dict(head={"cluster__node_address": "127.0.0.1"}),
     [r"'127.0.0.1' .*Ray replaces 127.0.0.1 by the host's external address"]),
    ("address with three numbers", dict(head={"cluster__node_address": "10.0.5"}),
     [r"'10.0.5' .*must be an IPv4 address such as 10.0.0.5"]),
    ("address as a number", dict(head={"cluster__node_address": 10}),
     [r"cluster__node_address = 10 .*must be an IPv4 address written as a string"]),
    ("no address at all", dict(head={"cluster__node_address": None}),
     [r"hosts.yml: cluster__node_address \(host localhost\): is not set, nor ansible_host"]),
    ("ansible_host is a name", dict(head={"cluster__node_address": None, "ansible_host": "gpu005.lab"}),
     [r"ansible_host = 'gpu005.lab' .*a host name.*\(cluster__node_address is not set, so ansible_host is used\)"]),
    ("two nodes one address", dict(workers={"w1": _ssh(ADDR)}),
     [r"cluster__node_address = '127.0.0.9' \(host w1\): is also the address of localhost"]),
    # 192.0.2.0/24 is TEST-NET-1 (never routed): nothing may try to reach it, and the test checks nothing did.
    ("loopback address in a cluster across machines",
     dict(workers={"w1": {**_ssh("192.0.2.10"), "cluster__node_address": "10.1.0.4"}}),
     [r"hosts.yml:\d+: cluster__node_address = '127.0.0.9' \(host localhost\): is a loopback address in a cluster "
      r"that spans machines \(w1 reached over SSH elsewhere\)"]),
    # --- ports --------------------------------------------------------------------------------------
    ("port is a word", dict(gv={"cluster__ray_gcs_port": "eighty"}),
     [r"main.yml:\d+: cluster__ray_gcs_port = 'eighty' \(host localhost\): must be a port number: a whole number "
      r"from 1024 to 65535"]),
    ("port above 65535", dict(gv={"cluster__ray_client_server_port": 70000}),
     [r"cluster__ray_client_server_port = 70000 .*from 1024 to 65535"]),
    ("port below 1024", dict(gv={"cluster__ray_dashboard_port": 80}),
     [r"cluster__ray_dashboard_port = 80 .*from 1024 to 65535"]),
    ("port with a fraction", dict(gv={"cluster__ray_node_manager_port": 9310.5}),
     [r"cluster__ray_node_manager_port = 9310.5 .*whole number"]),
    ("port as a boolean", dict(gv={"cluster__ray_metrics_export_port": True}),
     [r"cluster__ray_metrics_export_port = true .*must be a port number"]),
    ("two ports equal", dict(gv={"cluster__ray_dashboard_port": P + 10}),
     [rf"cluster__ray_node_manager_port = {P + 10} \(host localhost\): is also cluster__ray_dashboard_port on this host"]),
    ("port inside the worker range", dict(gv={"cluster__ray_metrics_export_port": P + 150}),
     [rf"cluster__ray_metrics_export_port = {P + 150} .*lies inside the worker port range {P + 100}-{P + 399}"]),
    ("worker range too small", dict(gv={"cluster__ray_max_worker_port": P + 120}),
     [rf"cluster__ray_max_worker_port = {P + 120} .*must be at least cluster__ray_min_worker_port \+ 99 = {P + 199}"]),
    ("worker range upside down", dict(gv={"cluster__ray_min_worker_port": P + 400, "cluster__ray_max_worker_port": P + 100}),
     [rf"cluster__ray_max_worker_port = {P + 100} .*must be at least"]),
    ("worker range beyond 65535", dict(gv={"cluster__ray_max_worker_port": 70000}),
     [r"cluster__ray_max_worker_port = 70000 .*from 1024 to 65535"]),
    ("reward port on a Ray port", dict(gv={"cluster__reward_port": P + 1}),
     [rf"cluster__reward_port = {P + 1} \(host localhost\): is also cluster__ray_dashboard_port on this host"]),
    ("reward port in the worker range", dict(gv={"cluster__reward_port": P + 200}),
     [rf"cluster__reward_port = {P + 200} .*lies inside the worker port range"]),
    # --- the retrieval service (group retrievers; every Ray node with an index and no group) -------------
    ("retriever port on the reward port", dict(gv={"retriever__index_dir": "/srv/index",
                                                   "cluster__retriever_port": P + 50}),
     [rf"cluster__retriever_port = {P + 50} \(host localhost\): is also cluster__reward_port on this host"]),
    ("retriever port in the rendezvous range", dict(gv={"retriever__index_dir": "/srv/index",
                                                        "cluster__retriever_port": P + 30}),
     [rf"cluster__retriever_port = {P + 30} .*lies inside the rendezvous port range {P + 20}-{P + 49}"]),
    ("retriever port in the ephemeral range", dict(gv={"retriever__index_dir": "/srv/index",
                                                       "cluster__retriever_port": 40000}),
     [r"cluster__retriever_port = 40000 .*lies inside the ephemeral port range 32768-60999"]),
    ("retriever port as a word", dict(gv={"retriever__index_dir": "/srv/index", "cluster__retriever_port": "http"}),
     [r"cluster__retriever_port = 'http' .*must be a port number"]),
    ("retrievers outside ray_cluster", dict(hosts=lambda h: h["all"]["children"].update(
        retrievers={"hosts": {"r1": _ssh("127.0.0.12")}}), gv={"retriever__index_dir": "/srv/index"}),
     [r"group retrievers = \['r1'\]: holds hosts outside ray_cluster: a job calls the retrieval service on its own "
      r"Ray node"]),
    ("retrievers with nothing to serve", dict(hosts=lambda h: h["all"]["children"].update(
        retrievers={"hosts": {"localhost": None}})),
     [r"group retrievers \(host localhost\): holds this host, but neither retriever__corpus .* nor "
      r"retriever__index_dir"]),
    ("retriever corpus missing on the controller", dict(gv={"retriever__corpus": "/nonexistent/corpus.jsonl"}),
     [r"retriever__corpus = '/nonexistent/corpus.jsonl' \(host localhost\): does not exist on this machine"]),
    ("retriever token is the cluster token", dict(gv={"cluster__token": "ab" * 32,
                                                      "cluster__retriever_token": "ab" * 32}),
     [r"cluster__retriever_token = \(hidden\) \(host localhost\): is the same as cluster__token: the retrieval "
      r"service needs a token of its own"]),
    ("group name typo retriever", dict(hosts=lambda h: h["all"]["children"].update(
        retriever={"hosts": {"localhost": None}})),
     [r"group retriever = \['localhost'\]: is not a group rlrun reads: did you mean retrievers\?"]),
    ("port as a quoted word on one host", dict(head={"cluster__ray_object_manager_port": "auto"}),
     [r"hosts.yml:\d+: cluster__ray_object_manager_port = 'auto' \(host localhost\): must be a port number"]),
    # --- paths --------------------------------------------------------------------------------------
    ("relative temp dir", dict(gv={"cluster__ray_temp_dir": "ray-tmp"}),
     [r"cluster__ray_temp_dir = 'ray-tmp' .*must be an absolute path"]),
    ("temp dir with a space", dict(gv={"cluster__ray_temp_dir": "/tmp/rlrun 0/val"}),
     [r"cluster__ray_temp_dir = '/tmp/rlrun 0/val' .*contains white space"]),
    ("temp dir too long for Ray's sockets", dict(gv={"cluster__ray_temp_dir": LONG}),
     [rf"cluster__ray_temp_dir = '{LONG}' .*is {TEMP_DIR_MAX + 1} bytes: Ray's socket files below it .* at most "
      rf"{TEMP_DIR_MAX}"]),
    ("long cluster name makes the default temp dir too long",
     dict(gv={"cluster__ray_temp_dir": None, "cluster__name": "a-very-long-cluster-name-for-prod"}),
     [r"cluster__ray_temp_dir = '/tmp/rlrun-\w+/a-very-long-cluster-name-for-prod-localhost' .*\(with the host's "
      r"user .*\).*\(set cluster__ray_temp_dir, or a shorter cluster__name\)"]),
    ("temp dir with ~", dict(gv={"cluster__ray_temp_dir": "~/ray"}),
     [r"'~/ray' .*starts with ~, which nothing expands here"]),
    ("temp dir directly in /tmp", dict(gv={"cluster__ray_temp_dir": "/tmp/ray"}),
     [r"'/tmp/ray' .*sits directly in /tmp, which every user can write"]),
    ("temp dir with ..", dict(gv={"cluster__ray_temp_dir": "/tmp/rlrun-0/../val"}),
     [r"contains '\.\.'"]),
    ("relative spill dir", dict(gv={"cluster__ray_spill_dir": "spill"}),
     [r"cluster__ray_spill_dir = 'spill' .*must be an absolute path"]),
    ("state dir with a shell variable", dict(gv={"cluster__state_dir": "$HOME/.rlrun"}),
     [r"cluster__state_dir = '\$HOME/.rlrun' .*must be an absolute path"]),
    ("venv with a quote", dict(gv={"cluster__venv": "/opt/it's/venv"}),
     [r"cluster__venv = \"/opt/it's/venv\" .*a character a shell or a unit file treats specially"]),
    ("empty hf home", dict(gv={"accel_env__hf_home": ""}),
     [r"accel_env__hf_home = '' .*is empty: expected an absolute path"]),
    # --- cluster name ---------------------------------------------------------------------------------
    ("cluster name with a space", dict(gv={"cluster__name": "my cluster"}),
     [r"cluster__name = 'my cluster' .*must be 1-40 letters, digits"]),
    ("empty cluster name", dict(gv={"cluster__name": ""}),
     [r"cluster__name = '' .*must be 1-40 letters"]),
    ("a worker of another cluster", dict(workers={"w1": {**_ssh("127.0.0.11"), "cluster__name": "other"}}),
     [r"hosts.yml:\d+: cluster__name = 'other' \(host w1\): differs from the head's \('val' on localhost\)"]),
    # --- token and authentication ---------------------------------------------------------------------
    ("empty token", dict(gv={"cluster__token": ""}),
     [r"cluster__token = '' .*is empty: with authentication on, the cluster needs a token"]),
    ("short token", dict(gv={"cluster__token": "changeme"}),
     [r"cluster__token = \(hidden\) .*is 8 characters: use at least 32"]),
    ("token with a space", dict(gv={"cluster__token": "ab" * 20 + " " + "cd" * 20}),
     [r"cluster__token = \(hidden\) .*contains white space"]),
    ("token from an undefined vault variable", dict(gv={"cluster__token": "{{ vault_ray_token }}"}),
     [r"cluster__token = '\{\{ vault_ray_token \}\}' .*refers to 'vault_ray_token', which is not defined"]),
    ("a worker with another token", dict(gv={"cluster__token": "ab" * 32},
                                         workers={"w1": {**_ssh("127.0.0.11"), "cluster__token": "cd" * 32}}),
     [r"cluster__token = \(hidden\) \(host w1\): differs from the head's"]),
    ("a worker without authentication", dict(workers={"w1": {**_ssh("127.0.0.11"), "cluster__auth_enabled": False}}),
     [r"cluster__auth_enabled = false \(host w1\): differs from the head's \(true\)"]),
    # the reward service's own token and HTTPS (roles/cluster: cluster__reward_token, cluster__reward_tls)
    ("reward token is the cluster token", dict(gv={"cluster__token": "ab" * 32, "cluster__reward_token": "ab" * 32}),
     [r"cluster__reward_token = \(hidden\) \(host localhost\): is the same as cluster__token: the reward service "
      r"needs a token of its own"]),
    ("short reward token", dict(gv={"cluster__reward_token": "changeme"}),
     [r"cluster__reward_token = \(hidden\) .*is 8 characters: use at least 32"]),
    ("a worker with another reward token", dict(gv={"cluster__reward_token": "ab" * 32},
                                                workers={"w1": {**_ssh("127.0.0.11"),
                                                                "cluster__reward_token": "cd" * 32}}),
     [r"cluster__reward_token = \(hidden\) \(host w1\): differs from the head's"]),
    ("reward token store relative", dict(gv={"cluster__reward_token_store": "secrets/reward.token"}),
     [r"cluster__reward_token_store = 'secrets/reward.token' .*must be an absolute path"]),
    ("reward TLS as a string", dict(gv={"cluster__reward_tls": "yes"}),
     [r"group_vars/all/main.yml:\d+: cluster__reward_tls = 'yes' \(host localhost\): is a string: write the "
      r"boolean true without quotes"]),
    ("reward TLS on one worker only", dict(workers={"w1": {**_ssh("127.0.0.11"), "cluster__reward_tls": True}}),
     [r"cluster__reward_tls = true \(host w1\): differs from the head's \(false\)"]),
    ("old reward token name", dict(gv={"reward_server__auth_token": "ab" * 32}),
     [r"reward_server__auth_token = '[a-z]+' \(host localhost\): was renamed: write cluster__reward_token"]),
    ("unknown extraction strategy", dict(gv={"reward_server__extract": ["boxed", "magic"]}),
     [r"reward_server__extract = \['boxed', 'magic'\] \(host localhost\): must be null \(the service's default "
      r"order\) or a non-empty list of boxed, answer_tag, .*: magic is not one"]),
    ("extraction strategies as a string", dict(gv={"reward_server__extract": "boxed,hash"}),
     [r"reward_server__extract = 'boxed,hash' .*must be a list"]),
    # --- resources ----------------------------------------------------------------------------------
    ("GPUs as a word", dict(gv={"ray_node__num_gpus": "eight"}),
     [r"ray_node__num_gpus = 'eight' .*must be a whole number of GPUs"]),
    ("negative GPUs", dict(gv={"ray_node__num_gpus": -1}), [r"ray_node__num_gpus = -1 .*whole number of GPUs"]),
    ("half a GPU", dict(gv={"ray_node__num_gpus": 1.5}), [r"ray_node__num_gpus = 1.5 .*whole number of GPUs"]),
    ("zero CPUs", dict(gv={"ray_node__num_cpus": 0}), [r"ray_node__num_cpus = 0 .*1 or more"]),
    ("object store as 10G", dict(gv={"ray_node__object_store_memory": "10G"}),
     [r"ray_node__object_store_memory = '10G' .*must be a number of bytes, at least 78643200"]),
    ("GPUs on a cpu host", dict(gv={"ray_node__num_gpus": 8}),
     [r"ray_node__num_gpus = 8 .*more than 0 on a host whose cluster__accelerator is cpu"]),
    ("expected GPUs differ from the hosts'", dict(gv={"cluster__expected_gpus": 32}),
     [r"cluster__expected_gpus = 32 .*differs from the 0 GPUs the hosts' ray_node__num_gpus add up to"]),
    ("expected nodes more than hosts", dict(gv={"cluster__expected_nodes": 4}),
     [r"cluster__expected_nodes = 4 .*more than the 1 hosts of ray_cluster"]),
    ("expected nodes zero", dict(gv={"cluster__expected_nodes": 0}),
     [r"cluster__expected_nodes = 0 .*must be a whole number, 1 or more"]),
    ("negative custom resource", dict(gv={"ray_node__resources": {"accel": -2}}),
     [r"ray_node__resources = \{'accel': -2\} .*resource 'accel' must be a number >= 0"]),
    ("DeepSpeed op with a shell word", dict(gv={"ray_node__deepspeed_ops": ["cpu_adam; touch /tmp/x"]}),
     [r"ray_node__deepspeed_ops = \['cpu_adam; touch /tmp/x'\] .*must be a list of DeepSpeed op names such as "
      r"\[cpu_adam\]"]),
    # --- accelerator and fabric -----------------------------------------------------------------------
    ("vendor typo", dict(gv={"cluster__accelerator": "nvida"}),
     [r"cluster__accelerator = 'nvida' .*must be nvidia, amd or cpu: did you mean nvidia\?"]),
    ("vendor cuda", dict(gv={"cluster__accelerator": "CUDA"}),
     [r"cluster__accelerator = 'CUDA' .*did you mean nvidia\?"]),
    ("vendor rocm", dict(gv={"cluster__accelerator": "rocm"}), [r"'rocm' .*did you mean amd\?"]),
    ("gloo interface list", dict(gv={"accel_env__gloo_socket_ifname": "eth0,eth1"}),
     [r"accel_env__gloo_socket_ifname = 'eth0,eth1' .*exactly one interface name"]),
    ("gloo interface exclusion", dict(gv={"accel_env__gloo_socket_ifname": "^lo"}),
     [r"'\^lo' .*no \^exclusion"]),
    ("nccl interface with a space", dict(gv={"accel_env__nccl_socket_ifname": "eth0, eth1"}),
     [r"accel_env__nccl_socket_ifname = 'eth0, eth1' .*without spaces"]),
    ("nccl debug level", dict(gv={"accel_env__nccl_debug": "debug"}),
     [r"accel_env__nccl_debug = 'debug' .*VERSION, WARN, INFO or TRACE"]),
    ("RoCE GID index 300", dict(gv={"accel_env__nccl_ib_gid_index": 300}), [r"= 300 .*from 0 to 255"]),
    ("ROCm version as a number", dict(gv={"accel_env__rocm_version": 6.1}),
     [r"accel_env__rocm_version = 6.1 .*write it quoted, e.g. '6.1'"]),
    # roles/accel_env's own assert held these alone before (site.yml refused them after touching the hosts)
    ("ROCm version on a cpu host", dict(gv={"accel_env__rocm_version": "6.2"}),
     [r"accel_env__rocm_version = '6.2' .*is only for AMD GPUs, and this host's cluster__accelerator is cpu: "
      r"remove it, or set cluster__accelerator to amd"]),
    ("ROCm version not a version", dict(gv={"cluster__accelerator": "amd", "accel_env__rocm_version": "6.2-rc"}),
     [r"accel_env__rocm_version = '6.2-rc' .*must be a ROCm version such as '6.2'"]),
    ("extra variable the role writes", dict(gv={"accel_env__nccl_debug": "WARN",
                                                "accel_env__extra": {"NCCL_DEBUG": "INFO"}}),
     [r"accel_env__extra = \{'NCCL_DEBUG': 'INFO'\} .*sets NCCL_DEBUG, which the role writes"]),
    ("extra value with a quote", dict(gv={"accel_env__extra": {"MY_FLAG": "it's"}}),
     [r"accel_env__extra = .*gives MY_FLAG a value with a single quote"]),
    ("extra name not a variable name", dict(gv={"accel_env__extra": {"MY-FLAG": "1"}}),
     [r"accel_env__extra = .*names MY-FLAG: an environment variable's name"]),
    ("visible devices twice", dict(gv={"accel_env__visible_devices": [0, 0]}), [r"lists a GPU twice"]),
    ("visible devices fewer than GPUs", dict(gv={"cluster__accelerator": "nvidia", "ray_node__num_gpus": 4,
                                                 "accel_env__visible_devices": [0, 1]}),
     [r"ray_node__num_gpus = 4 .*more than the 2 GPUs accel_env__visible_devices shows"]),
    ("open files 100", dict(gv={"cluster__nofile_limit": 100}), [r"cluster__nofile_limit = 100 .*from 1024"]),
    # --- reward service -------------------------------------------------------------------------------
    ("no reward workers", dict(gv={"reward_server__workers": 0}), [r"reward_server__workers = 0 .*1 or more"]),
    ("negative reward timeout", dict(gv={"reward_server__timeout": -1}), [r"reward_server__timeout = -1 .*> 0"]),
    ("unknown leniency", dict(gv={"reward_server__lenient": ["units", "unit"]}),
     [r"reward_server__lenient = \['units', 'unit'\] \(host localhost\): must be null \(the service's default: all of "
      r"units, styled_letters\) or a list of units, styled_letters \(empty for none\): unit is not one"]),
    ("unknown prompt template", dict(gv={"reward_server__prompt_template": "llama9"}),
     [r"reward_server__prompt_template = 'llama9' .*must be chatml, none or a string containing \{\}"]),
    ("reward token without the cluster's", dict(gv={"cluster__auth_enabled": False}),
     [r"reward_server__auth_enabled = true .*needs cluster__auth_enabled"]),
    ("a reward-only host's accelerator", dict(
        hosts=lambda h: h["all"]["children"]["reward_servers"].update(hosts={"r1": {**_ssh("127.0.0.12"),
                                                                                   "cluster__accelerator": "gpu"}})),
     [r"cluster__accelerator = 'gpu' \(host r1\): must be nvidia, amd or cpu: did you mean nvidia\?"]),
    # --- templates ----------------------------------------------------------------------------------
    ("state dir from an undefined variable", dict(gv={"cluster__state_dir": "{{ data_root }}/rlrun"}),
     [r"cluster__state_dir = '\{\{ data_root \}\}/rlrun' .*refers to 'data_root', which is not defined"]),
    # --- several at once ----------------------------------------------------------------------------
    ("three problems at once", dict(gv={"cluster__ray_gcs_port": "eighty", "cluster__accelerator": "nvida"},
                                    head={"cluster__node_address": "10.0.0.256"}),
     [r"cluster__ray_gcs_port = 'eighty'", r"cluster__accelerator = 'nvida'", r"cluster__node_address = '10.0.0.256'"]),
]


def build(root: Path, how: dict) -> Path:
    """The base inventory (one local head, valid) broken as `how` says."""
    inv = write_inventory(root, "val", ADDR, PORT, heads=how.get("heads"), workers=how.get("workers"))
    hosts_file, gv_file = inv / "hosts.yml", inv / GV
    hosts = yaml.safe_load(hosts_file.read_text())
    head = hosts["all"]["children"]["ray_cluster"]["children"]["ray_head"]["hosts"]["localhost"]
    for key, value in how.get("head", {}).items():
        if value is None:
            head.pop(key, None)
        else:
            head[key] = value
    if "hosts" in how:
        how["hosts"](hosts)
    hosts_file.write_text(yaml.safe_dump(hosts, sort_keys=False))
    gv = yaml.safe_load(gv_file.read_text())
    for key, value in how.get("gv", {}).items():
        if value is None:
            gv.pop(key, None)
        else:
            gv[key] = value
    gv_file.write_text(yaml.safe_dump(gv, sort_keys=False))
    if how.get("vault_token"):
        (root / "pass").write_text("right\n")
        enc = subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file",
                              str(root / "pass"), "ab" * 32, "--name", "cluster__token"],
                             capture_output=True, text=True, check=True, env=ansible_env())
        (inv / "group_vars" / "all" / "vault.yml").write_text(enc.stdout)
    for rel, text in how.get("files", {}).items():
        (inv / rel).parent.mkdir(parents=True, exist_ok=True)
        (inv / rel).write_text(text)
    return inv


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Every case built, checked by `rlrun validate` (in-process) and by `ansible-playbook site.yml`."""
    out = {}
    for label, how, _ in CASES:
        root = tmp_path_factory.mktemp(re.sub(r"\W+", "-", label)[:40])
        inv = build(root, how)
        before = _tree(root)
        report = validate_inventory(inv)
        out[label] = {"root": root, "inv": inv, "before": before, "problems": [str(p) for p in report.problems],
                      "after_validate": _tree(root)}

    # `ansible-playbook -i INV site.yml` for every case, two at a time, forked from one process that imported
    # Ansible once (tests/integration/playbook_forks.py; test_forked_runs_are_the_scripts_runs compares one
    # with the script's)
    forks = tmp_path_factory.mktemp("forks")
    invs = [str(out[label]["inv"]) for label, _, _ in CASES]
    subprocess.run([sys.executable, "-m", "tests.integration.playbook_forks", str(PROJECT / "site.yml"),
                    str(forks), "2", *invs], check=True, env=ansible_env(), cwd=PROJECT, timeout=900)
    for i, (label, _, _) in enumerate(CASES):
        argv = [str(BIN / "ansible-playbook"), "-i", invs[i], str(PROJECT / "site.yml")]
        out[label]["play"] = subprocess.CompletedProcess(argv, int((forks / f"{i}.rc").read_text()),
                                                         (forks / f"{i}.stdout").read_text(),
                                                         (forks / f"{i}.stderr").read_text())
        out[label]["after_play"] = _tree(out[label]["root"])
    yield out
    for case in out.values():
        shutil.rmtree(case["root"], ignore_errors=True)


def test_the_table_is_large_enough():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("label,how,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_inventory_is_refused_naming_file_variable_value_and_expectation(cases, label, how, expected):
    case = cases[label]
    text = "\n".join(case["problems"])
    for pattern in expected:
        assert re.search(pattern, text), f"{label}: {pattern!r} not among the problems:\n{text}"
    # Offline: validating wrote nothing.
    assert case["after_validate"] == case["before"]
    # The playbook refuses it with the same problems, in its first play, and touches no host.
    play = case["play"]
    out = play.stdout + play.stderr
    assert play.returncode != 0, f"{label}: site.yml passed\n{out[-3000:]}"
    for pattern in expected:
        assert re.search(pattern, out), f"{label}: {pattern!r} not in the playbook's output:\n{out[-4000:]}"
    assert "Error processing keyword 'hosts': The lookup plugin 'rlrun_validate' failed" in out
    assert "TASK [" not in out and "PLAY RECAP" not in out  # the run ended before any task, anywhere
    assert case["after_play"] == case["before"], f"{label}: files appeared: {case['after_play'] - case['before']}"
    assert not (case["root"] / "state").exists() and not (case["inv"] / ".secrets").exists()


def test_forked_runs_are_the_scripts_runs(cases):
    """The fixture's forked runs print and exit exactly as the `ansible-playbook` script does on the same
    inventory (one case, run both ways)."""
    case = cases["three problems at once"]
    script = playbook(case["inv"], "site.yml", timeout=300)
    forked = case["play"]
    assert script.returncode != 0
    assert (forked.returncode, forked.stdout, forked.stderr) == (script.returncode, script.stdout, script.stderr)


def test_the_base_inventory_and_the_examples_pass():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        base = build(Path(tmp), {})
        assert validate_inventory(base).problems == []
    for inv in (PROJECT / "inventory", PROJECT / "examples" / "inventories" / "seed-2node"):
        report = validate_inventory(inv)
        assert report.problems == [], "\n".join(map(str, report.problems))


def test_rlrun_validate_lists_every_problem_and_exits_1(tmp_path):
    inv = build(tmp_path, dict(gv={"cluster__ray_gcs_port": "eighty", "cluster__accelerator": "nvida"}))
    result = subprocess.run([str(BIN / "rlrun"), "-i", str(inv), "validate"], capture_output=True, text=True,
                            timeout=120, env=ansible_env())
    assert result.returncode == 1
    assert f"error: inventory {inv}: 2 problems:" in result.stderr
    assert re.search(r"\n  - group_vars/all/main.yml:\d+: cluster__ray_gcs_port = 'eighty' \(host localhost\): must be "
                     r"a port number", result.stderr), result.stderr
    ok = subprocess.run([str(BIN / "rlrun"), "-i", str(PROJECT / "examples" / "inventories" / "seed-2node"),
                         "validate"], capture_output=True, text=True, timeout=120, env=ansible_env())
    assert ok.returncode == 0 and "ok (cluster vayu, 2 hosts: gpu004, gpu005)" in ok.stdout


def test_tags_validate_runs_the_validate_play_alone(tmp_path):
    """`--tags validate` on a good inventory: the check passes and no later play gathers facts or does
    anything (hosts reached over SSH on a closed port would be unreachable if anything touched them)."""
    inv = build(tmp_path, dict(workers={"w1": {**_ssh("10.255.0.7"), "ansible_host": "127.0.0.11",
                                              "cluster__node_address": "10.255.0.7"}}))
    result = playbook(inv, "site.yml", "--tags", "validate", timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "inventory ok: 2 Ray nodes, 1 reward hosts" in out and "Gathering Facts" not in out
    assert not re.search(r"changed=[1-9]|unreachable=[1-9]|failed=[1-9]", out), out[-2000:]
    assert not (tmp_path / "state").exists()
