"""The namespace lab's input checks and names (no root needed: nothing is created)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.netns import Lab, LabError

LAB = Path(__file__).resolve().parents[1] / "lab" / "netns.py"


@pytest.mark.parametrize(("index", "hosts", "message"), [
    (0, {}, "lab index = 0: expected an integer from 1 to 254"),
    (255, {}, "lab index = 255: expected an integer from 1 to 254"),
    (51, {"Head": "10.244.51.11"}, "host name 'Head': expected a lowercase letter"),
    (51, {"h": "10.244.51.x"}, "host h: address '10.244.51.x' is not an IPv4 address"),
    (51, {"h": "10.244.52.11"}, "host h: address 10.244.52.11 must lie in 10.244.51.0/24"),
    (51, {"h": "10.244.51.1"}, "(the bridge)"),
    (51, {"a": "10.244.51.11", "b": "10.244.51.11"}, "host b: address 10.244.51.11 is given to two hosts"),
])
def test_bad_input_is_refused_with_what_was_expected(index, hosts, message):
    with pytest.raises(LabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Lab(index, hosts)


def test_every_name_derives_from_the_index():
    lab = Lab(51, {"head": "10.244.51.11"})
    assert (lab.bridge, lab.netns("head"), lab.veth_prefix, str(lab.dir), str(lab.gateway)) == (
        "rlrun-br51", "rlrun51-head", "rl51v", "/tmp/rlrun-lab51", "10.244.51.1")
    assert lab.ansible_vars("head")["ansible_ssh_private_key_file"] == "/tmp/rlrun-lab51/id_ed25519"


def test_the_cli_names_the_bad_host_spec():
    proc = subprocess.run([sys.executable, str(LAB), "create", "--index", "51", "--host", "head"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--host 'head': expected NAME=ADDRESS" in proc.stderr
