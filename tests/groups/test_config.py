"""`groups = [...]`: members resolved, defaults, and every bad group a clear ConfigError naming it."""

from __future__ import annotations

import datetime as dt

import pytest

from snapshot_assets.config import ConfigError, parse_config

DSN = "host=127.0.0.1 dbname=bank user=u"


def _config(groups: str, *, other_dsn: str = DSN, third: str = "postgres") -> str:
    source = 'type = postgres, dsn = "{dsn}", table = {table}'
    tables = [source.format(dsn=DSN, table="accounts"), source.format(dsn=other_dsn, table="transfers"),
              'type = generator, table = gen' if third == "generator" else source.format(dsn=DSN, table="audit")]
    return "snapshotter {\n  tables = [\n" + "\n".join(
        f"    {{ source {{ {s} }}, diff.interval = {10 + i}s, destinations = [ {{ type = local, path = /tmp/a }} ] }}"
        for i, s in enumerate(tables)) + f"\n  ]\n  groups = {groups}\n}}\n"


def test_group_members_and_defaults() -> None:
    cfg = parse_config(_config("[ { name = ledger, tables = [ public.accounts, transfers ] } ]"), file="g.conf")
    (group,) = cfg.groups
    assert group.name == "ledger"
    assert group.tables == ("public.accounts", "public.transfers")
    assert group.key_prefix == "groups/ledger/"
    assert group.diff_interval == dt.timedelta(seconds=10)  # the shortest of its members'
    assert cfg.group("ledger") is group
    assert [t.group for t in cfg.tables] == ["ledger", "ledger", ""]


def test_group_settings() -> None:
    cfg = parse_config(_config('[ { name = ledger, tables = [ public.accounts, public.transfers ], '
                               'key_prefix = "cuts/ledger/", diff { interval = 1m } } ]'), file="g.conf")
    assert cfg.groups[0].key_prefix == "cuts/ledger/"
    assert cfg.groups[0].diff_interval == dt.timedelta(minutes=1)


@pytest.mark.parametrize(("groups", "message"), [
    ("[ { name = ledger, tables = [ public.accounts, public.nope ] } ]", "unknown table 'public.nope'"),
    ("[ { name = ledger, tables = [ public.accounts, public.accounts ] } ]", "table public.accounts is listed twice"),
    ("[ { name = ledger, tables = [ public.accounts ] }, { name = other, tables = [ public.accounts ] } ]",
     "table public.accounts is already in group 'ledger'"),
    ("[ { name = ledger, tables = [ public.accounts ] }, { name = ledger, tables = [ public.audit ] } ]",
     "group 'ledger' is configured twice"),
    ("[ { name = ledger, tables = [] } ]", "lists no table"),
    ("[ { tables = [ public.accounts ] } ]", "name: is required"),
    ('[ { name = "a b", tables = [ public.accounts ] } ]', "is not a group name"),
    ("[ { name = ledger, tables = [ public.accounts ], surprise = 1 } ]", "unknown key 'surprise'"),
    ('[ { name = ledger, tables = [ public.accounts ], key_prefix = "accounts/" } ]', "be no table's key_prefix"),
    ("[ { name = ledger, tables = [ public.accounts ], diff { interval = 0s } } ]", "must be greater than 0"),
])
def test_bad_groups(groups: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"g\.conf: snapshotter\.groups") as err:
        parse_config(_config(groups), file="g.conf")
    assert message in str(err.value)


@pytest.mark.parametrize("other", ["host=127.0.0.1 dbname=other user=u", "postgresql://u@127.0.0.1:5433/bank",
                                   "postgresql://u@db.example/bank"])
def test_members_of_another_host_port_or_database_are_refused(other: str) -> None:
    with pytest.raises(ConfigError, match="come from different sources"):
        parse_config(_config("[ { name = ledger, tables = [ public.accounts, public.transfers ] } ]",
                             other_dsn=other), file="g.conf")


@pytest.mark.parametrize("same", ["postgresql://other-user:secret@127.0.0.1:5432/bank",
                                  "dbname=bank port=5432 host=127.0.0.1 user=v"])
def test_two_spellings_of_one_database_are_one_source(same: str) -> None:
    config = parse_config(_config("[ { name = ledger, tables = [ public.accounts, public.transfers ] } ]",
                                  other_dsn=same), file="g.conf")
    assert config.tables[1].source.dsn == same


def test_members_must_be_postgres_tables() -> None:
    text = _config("[ { name = ledger, tables = [ public.accounts, public.gen ] } ]", third="generator")
    with pytest.raises(ConfigError, match="has a generator source"):
        parse_config(text, file="g.conf")


def test_unknown_group_lookup() -> None:
    cfg = parse_config(_config("[ { name = ledger, tables = [ public.accounts ] } ]"), file="g.conf")
    with pytest.raises(KeyError, match=r"no group 'nope'.*configured: ledger"):
        cfg.group("nope")
