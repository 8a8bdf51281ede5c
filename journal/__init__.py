"""Loom's event journal: fenced, append-only streams of events on PostgreSQL or SQLite."""
