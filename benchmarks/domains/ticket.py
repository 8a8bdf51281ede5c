"""A ticket: three actions guarded by invariants (open once, assign while open, close when assigned)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from journal.aggregates import Action, Invariant, State


class Ticket(BaseModel):
    status: str = "new"
    title: str = ""
    assignee: str | None = None
    priority: str = "normal"


class TicketOpened(BaseModel):
    title: str = Field(min_length=1)


class TicketAssigned(BaseModel):
    to: str


class TicketClosed(BaseModel):
    resolution: str


class OpenTicket(BaseModel):
    title: str = Field(min_length=1)


class AssignTicket(BaseModel):
    to: str


class CloseTicket(BaseModel):
    resolution: str = "done"


is_new = Invariant("ticket is not opened yet", lambda s: s.status == "new")
is_open = Invariant("ticket is open", lambda s: s.status == "open")
is_assigned = Invariant("ticket is assigned", lambda s: s.assignee is not None)


@dataclass(frozen=True)
class TicketDomain:
    state: State
    open_ticket: Action[Ticket, Any]
    assign: Action[Ticket, Any]
    close: Action[Ticket, Any]


def declare(name: str, **options) -> TicketDomain:
    """A ticket state named `name`; callers may declare more actions on `.state`."""
    state = State(name, Ticket, **options)

    @state.on(TicketOpened)
    def _opened(s: Ticket, e: TicketOpened) -> dict:
        return {"status": "open", "title": e.title}

    @state.on(TicketAssigned)
    def _assigned(s: Ticket, e: TicketAssigned) -> dict:
        return {"assignee": e.to}

    @state.on(TicketClosed)
    def _closed(s: Ticket, e: TicketClosed) -> dict:
        return {"status": "closed"}

    @state.action(OpenTicket, given=[is_new])
    def open_ticket(s: Ticket, cmd: OpenTicket) -> TicketOpened:
        return TicketOpened(title=cmd.title)

    @state.action(AssignTicket, given=[is_open])
    def assign(s: Ticket, cmd: AssignTicket, actor) -> TicketAssigned:
        return TicketAssigned(to=cmd.to)

    @state.action(CloseTicket, given=[is_open, is_assigned])
    def close(s: Ticket, cmd: CloseTicket) -> TicketClosed:
        return TicketClosed(resolution=cmd.resolution)

    return TicketDomain(state, open_ticket, assign, close)
