# Loom for Django: the two everyday commands are `make bench` and `make test`.
# DATABASE_URL picks the database (default: SQLite file loom.sqlite3 in this folder).
VENV ?= .venv
DJANGO ?=
PY := $(VENV)/bin/python
# Without SECRET_KEY in the environment, the processes started here (tests, bench, worker, server) use the
# key generated into var/secret_key; this opt-in lets loom_worker and loom_serve_api accept it with DEBUG off
# (loomsite.E003). Anywhere else, set SECRET_KEY, the same in every process (docs/security.md).
export ALLOW_DEV_SECRET_KEY ?= true

.PHONY: venv bench bench-docs test lint serve worker api migrate

venv:
	@scripts/bootstrap $(VENV) "$(DJANGO)"

migrate: venv
	@$(PY) manage.py migrate --noinput -v0

## The main job: the throughput benchmark on the configured database, recorded and printed.
bench: migrate
	$(PY) manage.py bench_throughput $(ARGS)

## docs/benchmarks.md from recorded runs: every bench command of the docs plan on the configured database
## (run once per database, on a quiet machine; ARGS=--small for a smoke run into --output).
bench-docs: migrate
	$(PY) manage.py bench_docs $(ARGS)

## The test suite against the configured database (SQLite by default).
test: venv
	$(VENV)/bin/pytest $(ARGS)

lint: venv
	$(VENV)/bin/ruff check .

## Browse recorded runs at http://127.0.0.1:8000/bench/ (admin at /admin/).
serve: migrate
	$(PY) manage.py runserver --insecure 127.0.0.1:8000

## A background worker (leases, recovery, projection drains).
worker: migrate
	$(PY) manage.py loom_worker

## The HTTP API on http://127.0.0.1:8001/api/ (gunicorn, warm workers; docs/http-api.md). API_TOKEN is the
## bearer token it accepts (LOOM_API_TOKENS), required: no API runs open.
api: migrate
	@test -n "$(API_TOKEN)" || { echo "make api: give API_TOKEN=<a long secret> (the bearer token the API accepts)" >&2; exit 2; }
	LOOM_API_TOKENS="$(API_TOKEN)" $(PY) manage.py loom_serve_api --workers 2
