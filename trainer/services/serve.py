"""Run a service's Flask app under gunicorn, configured in code (the command is the deployment command).

Both services run the same way: the master checks the configuration and forks the workers; each worker
is a :class:`~trainer.services.worker.ReadFirstWorker` (requests read whole, against the head and body
deadlines of the flags ``--head-timeout``, ``--body-timeout``, ``--keepalive``, ``--max-body-bytes``) and
builds its app after the fork (``load``).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from trainer.services.worker import ConnectionLimits, worker_class_path

__all__ = ["GunicornApp", "serve"]


class GunicornApp(BaseApplication):
    """gunicorn with ``options`` set in code; each worker calls ``load()`` after the fork."""

    def __init__(self, options: dict[str, Any], limits: ConnectionLimits, load: Callable[[], Any]) -> None:
        self._options = options
        self._load = load
        self.worker_limits = limits  # read by ReadFirstWorker in each worker
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 24: no ~/.gunicorn control socket
            self.cfg.set("control_socket_disable", True)

    def load(self) -> Any:
        return self._load()


def serve(args: argparse.Namespace, *, proc_name: str, load: Callable[[], Any], **options: Any) -> None:
    """Serve ``load()``'s app on ``args.host``:``args.port`` with the shared flags' settings (blocks).

    ``options``: further gunicorn settings of this service (they win over the shared ones).
    """
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    limits = ConnectionLimits(args.head_timeout, args.body_timeout, args.keepalive, args.max_body_bytes)
    settings = {
        "bind": f"{host}:{args.port}",
        "workers": args.workers,
        "threads": args.threads,
        "worker_class": worker_class_path(),
        "timeout": 120,
        "graceful_timeout": 30,
        "keepalive": max(1, math.ceil(args.keepalive)),  # gunicorn wants whole seconds; the worker uses limits
        "accesslog": None,
        "errorlog": "-",
        "loglevel": args.log_level,
        "preload_app": False,
        "proc_name": proc_name,
        **options,
    }
    GunicornApp(settings, limits, load).run()
