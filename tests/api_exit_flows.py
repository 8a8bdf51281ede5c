"""Flows that try to end the process that runs them (issue 25): a serve_api process imports them
(LOOM_FLOW_MODULES) to show that a transient call of one is a failed outcome, never a process exit."""

from __future__ import annotations

import importlib
import sys

from pydantic import BaseModel, field_validator

from journal.flows import Context, flow


@flow("tests.exits.system_exit")
def system_exit(ctx: Context, value) -> None:
    sys.exit(value)


@flow("tests.exits.keyboard_interrupt")
def keyboard_interrupt(ctx: Context, value) -> None:
    raise KeyboardInterrupt(value)


@flow("tests.exits.at_import")
def at_import(ctx: Context, value) -> None:
    """Imports a module that raises SystemExit at import (as `venv.__main__` does), inside a step."""
    ctx.step("import", importlib.import_module, "tests.exits_at_import")


class ExitingInput(BaseModel):
    """An input model whose validator exits: it runs in the API process when a durable start is checked."""

    code: int

    @field_validator("code")
    @classmethod
    def _exit(cls, value: int) -> int:
        sys.exit(value)


@flow("tests.exits.at_validation", input_model=ExitingInput)
def at_validation(ctx: Context, value: ExitingInput) -> int:
    return value.code
