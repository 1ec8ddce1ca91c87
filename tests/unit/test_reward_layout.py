"""The reward package is torch-free: the service must not import torch, nor the job's reward client."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "modules",
    [
        ["trainer.reward.server.app", "trainer.reward.server.__main__"],
        ["trainer.reward.client", "trainer.reward.local", "trainer.reward.pool"],
    ],
)
def test_reward_modules_do_not_import_torch(modules: list[str]) -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "heavy = sorted(m for m in ('torch', 'ray', 'deepspeed', 'transformers', 'vllm') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"{modules} imported {out.stdout.strip()}"


def test_client_split_is_contiguous_and_even() -> None:
    from trainer.reward.client import _split

    assert _split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert _split(2, 5) == [(0, 1), (1, 2)]
    assert _split(6, 1) == [(0, 6)]


def test_the_role_knows_the_services_extraction_strategies() -> None:
    """roles/reward_server checks reward_server__extract against a list: the service's own. The role's assert asks
    rlrun's rule (tests/integration/test_rules_once.py runs it), which takes the service's list and its check."""
    from rlrun.checks import services
    from trainer.reward.extract import STRATEGIES, validate_strategies

    assert services.STRATEGIES is STRATEGIES and services.validate_strategies is validate_strategies
    assert "query('cluster_problems', 'reward_server__')" in (ROOT / "roles" / "reward_server" / "tasks" /
                                                               "assert.yml").read_text()


def test_the_role_knows_the_services_leniencies() -> None:
    """roles/reward_server checks reward_server__lenient against a list: the service's own (through rlrun's rule,
    as the strategies)."""
    from rlrun.checks import services
    from trainer.reward.forms import LENIENCIES, validate_leniencies

    assert services.LENIENCIES is LENIENCIES and services.validate_leniencies is validate_leniencies
