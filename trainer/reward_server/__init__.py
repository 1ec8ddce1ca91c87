"""Remote reward service: ``python -m trainer.reward_server`` (gunicorn + Flask).

See trainer.reward_server.app for the HTTP contract and trainer.reward_server.__main__
for the command line.
"""

from trainer.reward_server.app import create_app
from trainer.reward_server.config import ConfigError, ServerConfig

__all__ = ["ConfigError", "ServerConfig", "create_app"]
