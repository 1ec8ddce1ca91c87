"""Remote reward service: ``python -m trainer.reward.server`` (gunicorn + Flask).

Where it runs: on the hosts of group reward_servers under gunicorn, outside Ray (roles/reward_server
deploys it); the job reaches it through trainer.reward.client. See trainer.reward.server.app for the
HTTP contract and trainer.reward.server.__main__ for the command line; the scaffolding both services
share (flags, token, Flask app, gunicorn) is trainer.services.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ServerConfig", "ServiceConfigError", "create_app"]

# Imported when first asked for: rlrun's inventory checks read the service's rules (dataset.py) on the controller
# and in every play without loading Flask.
_HOMES = {"create_app": "trainer.reward.server.app", "ServerConfig": "trainer.reward.server.config",
          "ServiceConfigError": "trainer.reward.server.config"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
