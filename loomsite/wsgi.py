"""WSGI entry point, used by gunicorn (see `manage.py loom_serve_api`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomsite.settings")
application = get_wsgi_application()
