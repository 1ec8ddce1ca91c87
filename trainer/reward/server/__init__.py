"""Remote reward service: ``python -m trainer.reward.server`` (gunicorn + Flask).

Where it runs: on the hosts of group reward_servers under gunicorn, outside Ray (roles/reward_server
deploys it); the job reaches it through trainer.reward.client. See trainer.reward.server.app for the
HTTP contract and trainer.reward.server.__main__ for the command line; the scaffolding both services
share (flags, token, Flask app, gunicorn) is trainer.services.
"""

from trainer.reward.server.app import create_app
from trainer.reward.server.config import ServerConfig, ServiceConfigError

__all__ = ["ServiceConfigError", "ServerConfig", "create_app"]
