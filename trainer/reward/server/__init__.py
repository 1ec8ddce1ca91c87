"""Remote reward service: ``python -m trainer.reward.server`` (gunicorn + Flask).

See trainer.reward.server.app for the HTTP contract and trainer.reward.server.__main__
for the command line.
"""

from trainer.reward.server.app import create_app
from trainer.reward.server.config import ConfigError, ServerConfig

__all__ = ["ConfigError", "ServerConfig", "create_app"]
