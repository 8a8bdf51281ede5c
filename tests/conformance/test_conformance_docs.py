"""docs/backends.md stays true to the store interfaces and to the conformance suite.

Every abstract method of each store base has a row saying whether its contract exercises it; every
method a contract claims to cover is called in that contract; every backend's test module
subclasses every contract once. A new abstract method without a row fails here, naming the row to add.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from journal.store.base import JournalStore
from leases.store.base import LeaseStore
from projections.store.base import ProjectionStore
from queues.store.base import QueueStore
from tests.conformance.journal import JournalStoreContract
from tests.conformance.leases import LeaseStoreContract
from tests.conformance.projections import ProjectionStoreContract
from tests.conformance.queues import QueueStoreContract

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "backends.md"
STORES = {
    "JournalStore": (JournalStore, JournalStoreContract),
    "LeaseStore": (LeaseStore, LeaseStoreContract),
    "ProjectionStore": (ProjectionStore, ProjectionStoreContract),
    "QueueStore": (QueueStore, QueueStoreContract),
}
BACKEND_MODULES = ("test_conformance_sqlite.py", "test_conformance_postgres.py")
ROW = re.compile(r"^\| `(?P<name>\w+)` \| (?P<kind>abstract|shared) \| (?P<covered>yes|no) \|", re.M)


def documented(store: str) -> dict[str, tuple[str, str]]:
    """The rows of the section `### \\`<store>\\`` of docs/backends.md: name -> (kind, covered)."""
    text = DOC.read_text()
    start = text.index(f"### `{store}`")
    end = text.find("\n### ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    return {m["name"]: (m["kind"], m["covered"]) for m in ROW.finditer(section)}


@pytest.mark.parametrize("store", STORES)
def test_every_abstract_method_has_a_row_saying_whether_the_contract_covers_it(store):
    base, contract = STORES[store]
    rows = documented(store)
    missing = sorted(set(base.__abstractmethods__) - set(rows))
    assert not missing, f"docs/backends.md, section `{store}`: add a row for each of {missing}"
    stale = sorted(name for name in rows if not hasattr(base, name))
    assert not stale, f"docs/backends.md, section `{store}`: {stale} are not methods of {store} any more"
    for name, (kind, covered) in rows.items():
        expected_kind = "abstract" if name in base.__abstractmethods__ else "shared"
        assert kind == expected_kind, f"docs/backends.md: `{name}` is {expected_kind}, the row says {kind}"
        expected_covered = "yes" if name in contract.covers else "no"
        assert covered == expected_covered, (
            f"docs/backends.md: `{name}` covered={covered}, but {contract.__name__}.covers says {expected_covered}")
    undocumented = sorted(set(contract.covers) - set(rows))
    assert not undocumented, f"docs/backends.md, section `{store}`: add rows for the covered {undocumented}"


@pytest.mark.parametrize("store", STORES)
def test_a_contract_calls_every_method_it_claims_to_cover(store):
    base, contract = STORES[store]
    source = "\n".join(inspect.getsource(cls) for cls in contract.__mro__ if cls.__module__.startswith("tests."))
    for name, via in contract.covers.items():
        assert hasattr(base, name), f"{contract.__name__}.covers names {name}, not a method of {store}"
        assert f".{via}(" in source, f"{contract.__name__} claims {name} (through {via}) but never calls {via}"


@pytest.mark.parametrize("module", BACKEND_MODULES)
def test_each_backend_subclasses_every_contract_once(module):
    source = (ROOT / "tests" / "conformance" / module).read_text()
    for _, contract in STORES.values():
        subclasses = re.findall(rf"^class Test\w+\({contract.__name__}\):", source, re.M)
        assert len(subclasses) == 1, f"tests/conformance/{module} must subclass {contract.__name__} exactly once"
    assert all(f"`{contract.__name__}`" in DOC.read_text() for _, contract in STORES.values())


def test_the_journal_store_is_its_five_interfaces_each_listed_with_its_contract():
    """docs/backends.md lists the journal's interfaces with their abstract methods and conformance classes:
    every abstract method of JournalStore belongs to exactly one interface, the one its row names."""
    from journal.store import base
    from tests.conformance import journal as contracts

    interfaces = (base.LogStore, base.ExecutionStore, base.WaitStore, base.OtherAppsStore, base.PrivacyStatements)
    own = {cls.__name__: {n for n in getattr(cls, "__abstractmethods__", ()) if n in vars(cls)} for cls in interfaces}
    assert set().union(*own.values()) == set(JournalStore.__abstractmethods__)
    assert sum(map(len, own.values())) == len(JournalStore.__abstractmethods__)
    text = DOC.read_text()
    for cls in interfaces:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{cls.__name__}"))
        named = set(re.findall(r"`(\w+)`", row.split(" | ")[2]))
        assert named == own[cls.__name__], cls.__name__
        contract = re.findall(r"`(\w+Contract)`", row)[-1]
        assert issubclass(JournalStoreContract, getattr(contracts, contract)), contract
