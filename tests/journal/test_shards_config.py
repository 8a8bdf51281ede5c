"""Shard placement and configuration, without shard servers (both backends): the hash is stable, a partition
key groups a tenant, earlier shard counts are consulted, and bad configuration is a system check error."""

from __future__ import annotations

import pytest
from django.test import override_settings
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from journal import shards
from journal.checks import check_shards


def ids(result) -> list[str]:
    return sorted({m.id for m in result})


def test_the_placement_hash_is_stable_across_processes_and_versions():
    # BLAKE2b of the key: fixed values, so a change of the function (which would move streams) fails here.
    assert [shards.slot(f"order-{i}", 2) for i in range(8)] == [shards.slot(f"order-{i}", 2) for i in range(8)]
    assert shards.slot("order-1", 4) == int.from_bytes(
        __import__("hashlib").blake2b(b"order-1", digest_size=8).digest(), "big") % 4
    assert {shards.slot(f"s-{i}", 3) for i in range(60)} == {0, 1, 2}


def test_prefix_key_takes_the_tenant_before_the_first_separator():
    assert shards.prefix_key("acme/order-1") == "acme"
    assert shards.prefix_key("acme:order-1") == "acme"
    assert shards.prefix_key("plain") == "plain"


@override_settings(LOOM_SHARDS=["default", "x1", "x2"], LOOM_SHARD_HISTORY=[1, 2])
def test_placements_list_the_current_then_each_earlier_count_newest_first():
    for i in range(50):
        sid = f"p-{i}"
        found = shards.placements(sid)
        assert found[0] == ["default", "x1", "x2"][shards.slot(sid, 3)]
        expected = []
        for count in (3, 2, 1):
            alias = ["default", "x1", "x2"][shards.slot(sid, count)]
            if alias not in expected:
                expected.append(alias)
        assert found == expected


@override_settings(LOOM_SHARDS=["default", "nowhere"], DATABASE_ROUTERS=["journal.shards.ShardRouter"])
def test_an_alias_missing_from_databases_is_loom_e020():
    assert ids(check_shards()) == ["loom.E020"]


@override_settings(LOOM_SHARDS=["default", "default"], DATABASE_ROUTERS=["journal.shards.ShardRouter"])
def test_an_alias_named_twice_is_loom_e020():
    assert ids(check_shards()) == ["loom.E020"]


@override_settings(LOOM_SHARDS=["default"], LOOM_SHARD_HISTORY=[1])
def test_a_history_count_not_below_the_current_one_is_loom_e020():
    assert ids(check_shards()) == ["loom.E020"]


def test_several_shards_without_the_router_is_loom_e021(settings):
    settings.LOOM_SHARDS = ["default", "nowhere"]
    settings.DATABASE_ROUTERS = []
    assert ids(check_shards()) == ["loom.E020", "loom.E021"]
    settings.DATABASE_ROUTERS = ["journal.shards.ShardRouter"]
    assert ids(check_shards()) == ["loom.E020"]


@pytest.mark.parametrize("value", ["no.such.module.fn", "journal.shards.SHARDED_APPS"])
def test_a_shard_key_that_is_not_an_importable_function_is_loom_e001(settings, value):
    from journal.checks import check_settings

    settings.LOOM_SHARD_KEY = value
    assert any("LOOM_SHARD_KEY" in m.msg for m in check_settings())


def test_unsharded_everything_stays_on_the_journals_database():
    assert shards.shards() == ["default"] and not shards.sharded()
    assert shards.shard_for("anything") == "default"
    with shards.on_stream("anything") as alias:
        assert alias == "default" and shards.current() == "default"
    assert shards.current() is None


@hsettings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=200).filter(lambda s: "\x00" not in s))
def test_any_storable_id_has_one_shard_the_same_every_time(stream_id):
    """Placement reads nothing without a history: any id the database can hold (lone surrogates included, the
    hash takes them as they are) maps to one of the shards, always the same, and to its key's shard: the key of its
    family (a continue_as_new run `<root>~<n>` or a default child id is placed by its root)."""
    with override_settings(LOOM_SHARDS=["default", "x1", "x2"], LOOM_SHARD_KEY="journal.shards.prefix_key"):
        alias = shards.shard_for(stream_id)
        assert alias in ("default", "x1", "x2")
        assert alias == shards.shard_for(stream_id) == shards.placements(stream_id)[0]
        assert alias == ["default", "x1", "x2"][shards.slot(shards.prefix_key(shards.family(stream_id)), 3)]
