"""Errors of reactions and projections; each docstring reads as its default message."""

from __future__ import annotations


class ProjectionError(Exception):
    """Something about reactions or projections went wrong."""


class DeclarationError(ProjectionError):
    """A reaction, projection or lane is declared in a way that cannot work."""


class LeaseLost(ProjectionError):
    """The subscription's lease was taken over (or expired): this worker's work on it is void."""
