"""A pocket calculator: every key press an event; the Act reference's calculator-session shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from journal.aggregates import Action, Invariant, State

KEYS = ("1", "2", "+", "3", "4", "=", "*", "2", "=", "5")  # ten presses; the display ends at "5", 92 before


class Calculator(BaseModel):
    display: str = "0"
    accumulator: float = 0.0
    operator: str | None = None
    fresh: bool = True  # the next digit starts a new number


class DigitPressed(BaseModel):
    digit: int = Field(ge=0, le=9)


class OperatorPressed(BaseModel):
    operator: str = Field(pattern=r"^[-+*/=]$")


class PressDigit(BaseModel):
    digit: int = Field(ge=0, le=9)


class PressOperator(BaseModel):
    operator: str = Field(pattern=r"^[-+*/=]$")


has_room = Invariant("display has room", lambda s: len(s.display) < 16)


def compute(acc: float, op: str | None, value: float) -> float:
    if op == "+":
        return acc + value
    if op == "-":
        return acc - value
    if op == "*":
        return acc * value
    if op == "/":
        return acc / value if value else 0.0
    return value


@dataclass(frozen=True)
class CalculatorDomain:
    state: State
    press_digit: Action[Calculator, Any]
    press_operator: Action[Calculator, Any]


def declare(name: str, **options) -> CalculatorDomain:
    """A calculator state named `name`."""
    state = State(name, Calculator, **options)

    @state.on(DigitPressed)
    def _digit(s: Calculator, e: DigitPressed) -> dict:
        display = str(e.digit) if s.fresh or s.display == "0" else s.display + str(e.digit)
        return {"display": display, "fresh": False}

    @state.on(OperatorPressed)
    def _operator(s: Calculator, e: OperatorPressed) -> dict:
        result = compute(s.accumulator, s.operator, float(s.display))
        return {"accumulator": result, "display": f"{result:g}",
                "operator": None if e.operator == "=" else e.operator, "fresh": True}

    @state.action(PressDigit, given=[has_room])
    def press_digit(s: Calculator, cmd: PressDigit) -> DigitPressed:
        return DigitPressed(digit=cmd.digit)

    @state.action(PressOperator)
    def press_operator(s: Calculator, cmd: PressOperator) -> OperatorPressed:
        return OperatorPressed(operator=cmd.operator)

    return CalculatorDomain(state, press_digit, press_operator)
