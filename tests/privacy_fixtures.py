"""Declarations with personal data for the privacy tests: an aggregate, a flow, a plain envelope type."""

from __future__ import annotations

import base64
import contextlib
from typing import Annotated

from pydantic import BaseModel

from journal.aggregates import State
from journal.flows import flow
from journal.privacy import Blob, Sensitive, declare, declare_step

KEY_A = "ka:" + base64.b64encode(bytes(range(32))).decode()
KEY_B = "kb:" + base64.b64encode(bytes(range(32, 64))).decode()
KEY_A_WRONG = "ka:" + base64.b64encode(bytes(range(1, 33))).decode()


class Customer(BaseModel):
    customer_id: str = ""
    email: Annotated[str, Sensitive(subject="customer_id")] = ""
    visits: int = 0


class Registered(BaseModel):
    customer_id: str
    email: Annotated[str, Sensitive(subject="customer_id", discloses=("support",))]


class Visited(BaseModel):
    customer_id: str
    note: Annotated[str, Sensitive(subject="customer_id")] = ""


class Register(BaseModel):
    email: str


customers = State("PrivacyCustomer", Customer)


@customers.on(Registered)
def _registered(state: Customer, e: Registered) -> dict:
    return {"customer_id": e.customer_id, "email": e.email}


@customers.on(Visited)
def _visited(state: Customer, e: Visited) -> dict:
    return {"visits": state.visits + 1}


@customers.action(Register)
def register(state: Customer, cmd: Register, actor) -> Registered:
    return Registered(customer_id=actor, email=cmd.email)


class Age(BaseModel):
    n: Annotated[int, Sensitive(subject="person", forgotten="error")]


class PersonState(BaseModel):
    age: int = 0


class AgeSet(BaseModel):
    person: str
    age: Annotated[int, Sensitive(subject="person", forgotten="error")]


people = State("PrivacyPerson", PersonState)


@people.on(AgeSet)
def _age(state: PersonState, e: AgeSet) -> dict:
    return {"age": e.age}


class Signup(BaseModel):
    customer_id: str
    email: Annotated[str, Sensitive(subject="customer_id")]


class Greeting(BaseModel):
    customer_id: str
    text: Annotated[str, Sensitive(subject="customer_id")]


declare_step("privacy.greet", Greeting)


@flow("test.privacy.signup", input_model=Signup)
def signup(ctx, value: Signup):
    greeting = ctx.step("privacy.greet", lambda: {"customer_id": value.customer_id, "text": f"hi {value.email}"})
    return {"greeted": bool(greeting["text"])}


declare("PrivacyOrder", ["email", "address.street"], subject="customer_id")
declare("PrivacyScan", ["image"], subject="customer_id", blobs=["image"])
declare("PrivacyAttachment", blobs=["data"])
declare("PrivacyTrade", ["buyer_email"], subject="buyer")  # two subjects in one payload
declare("PrivacyTrade", ["seller_email"], subject="seller")


class Photo(BaseModel):
    owner: str
    picture: Annotated[str, Blob()]


class FakeKms:
    """An external key service as LOOM_KEY_SERVICE names one: it holds its master key itself (a real one
    would call out to a KMS) and names it by its own id."""

    calls = 0

    def __init__(self):
        from journal.privacy.keys import LocalKeys

        self._local = LocalKeys(["kms-1:" + base64.b64encode(bytes(range(100, 132))).decode()])

    def wrap(self, key: bytes) -> tuple[str, bytes]:
        FakeKms.calls += 1
        return self._local.wrap(key)

    def unwrap(self, master_id: str, wrapped: bytes) -> bytes:
        FakeKms.calls += 1
        return self._local.unwrap(master_id, wrapped)


class Contact(BaseModel):
    """A state with no marks of its own: its event type is marked by declare() (after the state is built)."""

    customer_id: str = ""
    email: str = ""


class ContactAdded(BaseModel):
    customer_id: str
    email: str


class AddContact(BaseModel):
    email: str


contacts = State("PrivacyContact", Contact, snapshot_every=1)


@contacts.on(ContactAdded)
def _contact(state: Contact, e: ContactAdded) -> dict:
    return {"customer_id": e.customer_id, "email": e.email}


@contacts.action(AddContact)
def add_contact(state: Contact, cmd: AddContact, actor) -> ContactAdded:
    return ContactAdded(customer_id=actor, email=cmd.email)


declare("ContactAdded", ["email"], subject="customer_id")  # after the state: decided at use, not at declaration


class Strict(BaseModel):
    email: Annotated[str, Sensitive(subject="customer_id")]
    customer_id: str
    age: int


@flow("test.privacy.fails", input_model=Signup)
def fails(ctx, value: Signup):
    """Fails twice over with the marked value in the message: a step's own f-string (retried: STEP_FAILED), then
    a pydantic ValidationError whose text holds the input value."""
    with contextlib.suppress(Exception):
        ctx.step("privacy.mail", _mail, value.email)
    Strict.model_validate({"email": value.email, "customer_id": value.customer_id, "age": value.email})


def _mail(address: str):
    raise ValueError(f"could not mail {address}")


@flow("test.privacy.asignup", input_model=Signup)
async def asignup(ctx, value: Signup):
    """test.privacy.signup as an `async def` flow (tests/flows/test_flows_async_features.py):
    the same sealed records."""

    async def greet() -> dict:
        return {"customer_id": value.customer_id, "text": f"hi {value.email}"}

    greeting = await ctx.step("privacy.greet", greet)
    return {"greeted": bool(greeting["text"])}


@flow("test.privacy.fails_long", input_model=Signup)
def fails_long(ctx, value: Signup):
    """Fails twice over with a pydantic ValidationError on a long value holding the marked email: pydantic cuts
    such an input value in the middle, so the clear email is not whole in its text (a step's STEP_FAILED, then
    the flow's EXECUTION_FAILED)."""
    long = f"O'Brien, {value.email}, " + "y" * 80
    with contextlib.suppress(Exception):
        ctx.step("privacy.validate", _validate, long, value.customer_id)
    _validate(long, value.customer_id)


def _validate(text: str, customer_id: str):
    Strict.model_validate({"email": "x@test.invalid", "customer_id": customer_id, "age": text})
