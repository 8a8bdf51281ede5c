"""A shared inventory: restock, and reservations refused by an invariant once the stock is gone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from journal.aggregates import Action, Invariant, State


class Stock(BaseModel):
    stock: int = 0
    reserved: int = 0


class Restocked(BaseModel):
    quantity: int = Field(gt=0)


class Reserved(BaseModel):
    request: str


class Restock(BaseModel):
    quantity: int = Field(gt=0)


class Reserve(BaseModel):
    request: str


in_stock = Invariant("stock > 0", lambda s: s.stock > 0)


@dataclass(frozen=True)
class InventoryDomain:
    state: State
    restock: Action[Stock, Any]
    reserve: Action[Stock, Any]


def declare(name: str, **options) -> InventoryDomain:
    """An inventory state named `name`."""
    state = State(name, Stock, **options)

    @state.on(Restocked)
    def _restocked(s: Stock, e: Restocked) -> dict:
        return {"stock": s.stock + e.quantity}

    @state.on(Reserved)
    def _reserved(s: Stock, e: Reserved) -> dict:
        return {"stock": s.stock - 1, "reserved": s.reserved + 1}

    @state.action(Restock)
    def restock(s: Stock, cmd: Restock) -> Restocked:
        return Restocked(quantity=cmd.quantity)

    @state.action(Reserve, given=[in_stock])
    def reserve(s: Stock, cmd: Reserve) -> Reserved:
        return Reserved(request=cmd.request)

    return InventoryDomain(state, restock, reserve)
