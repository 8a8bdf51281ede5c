"""ASGI entry point of the demo site: `gunicorn -k asgi loomsite.asgi:application` (gunicorn's own asyncio worker,
in the locks; no other ASGI server is). benchmarks/api_waiters.py serves the API through it to compare waiting
callers with `loom_serve_api`'s worker (docs/http-api.md "ASGI or gunicorn's gthread worker")."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomsite.settings")
application = get_asgi_application()
