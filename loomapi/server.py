"""The API server as a gunicorn application run inside a management command (loom_serve_api).

The command's process is gunicorn's arbiter: kill it and its workers follow (see gunicorn_conf).
"""

from __future__ import annotations

import importlib

from gunicorn.app.base import BaseApplication

from journal import conf
from loomapi import gunicorn_conf


class ApiServer(BaseApplication):
    def __init__(self, options: dict, conn_max_age: int | None):
        self.options = options
        self.conn_max_age = conn_max_age
        super().__init__()

    def load_config(self) -> None:
        for key in dir(gunicorn_conf):
            if key in self.cfg.settings:
                self.cfg.set(key, getattr(gunicorn_conf, key))
        for key, value in self.options.items():
            if value is not None:
                self.cfg.set(key, value)

    def load(self):
        """Runs once in the arbiter (preload): everything a request needs is imported before fork."""
        from django.core.wsgi import get_wsgi_application
        from django.db import connections
        from django.urls import get_resolver

        for module in conf.get("LOOM_FLOW_MODULES"):
            importlib.import_module(module)
        application = get_wsgi_application()
        get_resolver().url_patterns  # noqa: B018  (imports every URLconf, so the views and their flows)
        for alias in connections:
            # Workers keep their connections (opened at boot) instead of reconnecting per request.
            connections[alias].settings_dict["CONN_MAX_AGE"] = self.conn_max_age
        connections.close_all()
        return application
