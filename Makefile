# Loom for Django: the two everyday commands are `make bench` and `make test`.
# DATABASE_URL picks the database (default: SQLite file loom.sqlite3 in this folder).
VENV ?= .venv
DJANGO ?=
PY := $(VENV)/bin/python

.PHONY: venv bench test lint serve worker migrate

venv:
	@scripts/bootstrap $(VENV) "$(DJANGO)"

migrate: venv
	@$(PY) manage.py migrate --noinput -v0

## The main job: the throughput benchmark on the configured database, recorded and printed.
bench: migrate
	$(PY) manage.py bench_throughput $(ARGS)

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
