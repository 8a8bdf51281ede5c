"""The JSON HTTP API and its gunicorn server (docs/http-api.md)."""

# The face of loomapi (tests/test_layout.py): what a project may import (its URLs), and the server's
# process helpers bench_http drives.
FACE_MODULES = ("loomapi.urls", "loomapi.process")
