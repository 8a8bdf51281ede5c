"""Reactions and read models fed by drains (docs/projections.md)."""

# The face of projections (tests/test_layout.py): what users and the apps above may import.
FACE_MODULES = ("projections.models", "projections.declarations", "projections.exceptions", "projections.service",
                "projections.store")
