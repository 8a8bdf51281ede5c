"""Loom's event journal: fenced, append-only streams of events on PostgreSQL or SQLite."""

# The journal's face (tests/test_layout.py, docs/architecture.md "Apps and their faces"): the modules users
# and the apps above may import; every other module is the journal's inside.
FACE_MODULES = (
    "journal.models", "journal.exceptions", "journal.envelopes", "journal.ids", "journal.jsonvalues",
    "journal.timestamps", "journal.conf", "journal.atomic", "journal.shards", "journal.listen",
    "journal.identity", "journal.task_names",
    # the stores: store_for, the interfaces, and the named fragments other apps' backends splice in
    "journal.backends", "journal.store", "journal.store.base", "journal.store.postgres", "journal.store.sqlite",
    # the admin's seams (add_execution_panel, add_execution_filter, read-only bases, sharded lists)
    "journal.admin_base", "journal.admin_shards", "journal.admin",
    # flows: the package, and the seams leases and queues implement
    "journal.flows", "journal.flows.errors", "journal.flows.events", "journal.flows.registry",
    "journal.flows.retry", "journal.flows.ownership", "journal.flows.interrupt", "journal.flows.plugins",
    "journal.flows.queued",
    # `describe` is the face's function and the name of its module: `from journal.flows import describe` reads
    # as an import of the module (tests/test_layout.py), so the module is in the face too (its one public name)
    "journal.flows.describe",
    "journal.aggregates", "journal.aggregates.declarations", "journal.privacy", "journal.privacy.codec",
    # wave 14: the async faces (astart...), telemetry's hooks and gauge seam, the "server unreachable" test
    # and DatabaseUnavailable's sign list, retention's remove-hook seam, the CLI's replies for the apps' verbs
    "journal.flows.aio", "journal.telemetry", "journal.reach", "journal.retention", "journal.cli",
    # wave 15: aggregate compaction (the worker's retention service runs it)
    "journal.compaction",
    # wave 17: the index rebuild the worker's retention service runs (journal/reindex.py)
    "journal.reindex",
    # loom.W050 as a database check: the long-running commands (loom_worker, loom_serve_api) run it at start-up
    "journal.checks",
)
