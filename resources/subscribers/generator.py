"""The generator source: a deterministic, seeded synthetic table and change stream (needs nothing).

Used by the demo, the benchmarks and the crash tests. Everything is a pure function of the
constructor arguments, so the stream can be regenerated at will: `events(P)` resumes right after
`P` by replaying the model from the seed (cheap: no I/O, no encoding), and `table_at(P)` answers
"what is the table at position P" — the oracle tests and benchmarks check the buffer and the
archive against.

The table (`public.users` by default): id bigint primary key (every tenth id beyond 2^53, so exact
integer keys are exercised), name and email text (with characters JSON must escape), score
double, active boolean, balance bigint (a third of them beyond ±2^53), updated_at timestamptz as
RFC 3339 text, tags a JSON list. The stream is PostgreSQL-shaped: transactions of `tx_size`
changes sharing one commit LSN (`%X/%08X`, strictly increasing), each followed by a TxEnd; an
insert/update/delete/truncate `mix`; updates and deletes favour a hot subset of keys; a fraction
of updates change the primary key; optionally a periodic full re-sync.

`identity="default"` shapes the changes the way PostgreSQL sends them under REPLICA IDENTITY
DEFAULT: a DELETE carries only the key columns, an UPDATE carries none of the old row (only the
old key, when the key changed), and an UPDATE omits the "out-of-line" columns it left unchanged
(`email`, `tags`, standing in for TOASTed values) and names them in `unchanged`. The model keeps
the complete rows, so `table_at` stays the oracle.

Positions are drawn from their own random stream, so the model knows the next position before
generating the transaction at it: `table_at(P)` stops exactly at P without copying the table.
"""

from __future__ import annotations

import datetime as _dt
import random
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from resources.subscribers.events import (
    ChangeEvent,
    Column,
    Event,
    ResyncBegin,
    ResyncEnd,
    SchemaEvent,
    SnapshotRow,
    TableSchema,
    TxEnd,
)
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.gojson import time_text
from snapshot_assets.archive.keys import TypedKey, typed_key
from snapshot_assets.archive.positions import compare_lsn, format_lsn

DEFAULT_START_LSN = 0x1_6B37_4D48
DEFAULT_MIX: Mapping[str, float] = {"insert": 0.3, "update": 0.55, "delete": 0.15, "truncate": 0.0}
KEY_FIELDS = ("id",)
_BASE_TIME = _dt.datetime(2024, 1, 1, tzinfo=_dt.UTC)
_TX_SPACING_US = 250_123
_BIG = 2**53
_FIRST = ("Ada", "Grace", "Linus", "Zoë", "Søren", "Mary-Jane", "José", "Ōtomo", "Li", "Chloé")
_LAST = ("Lovelace", "Hopper", "O'Brien", "Müller", "<Admin>", "Smith & Co", "Nguyễn", "Tanaka", "Ng", "Brown")
_TAGS = ("vip", "beta", "churn-risk", "trial", "emoji-🚀", "quote\"d", "new\nline", "a<b", "eu", "us")
_INT64_MAX = 2**63 - 1
_OUT_OF_LINE = ("email", "tags")  # what identity="default" treats as TOASTed values
IDENTITIES = ("full", "default")


def users_schema(table: str) -> TableSchema:
    """The generated table's columns, in PostgreSQL terms."""
    spec = (("id", "bigint", False), ("name", "text", True), ("email", "text", True),
            ("score", "double precision", True), ("active", "boolean", True), ("balance", "bigint", True),
            ("updated_at", "timestamp with time zone", True), ("tags", "jsonb", True))
    return TableSchema(table, tuple(
        Column(name, type_, nullable, primary_key=name == "id", ordinal=i + 1,
               primary_key_ordinal=1 if name == "id" else 0)
        for i, (name, type_, nullable) in enumerate(spec)))


@dataclass(frozen=True, slots=True)
class _Tx:
    position: str
    changes: tuple[ChangeEvent, ...]


@dataclass(frozen=True, slots=True)
class _Resync:
    position: str


@dataclass(frozen=True, slots=True)
class _Config:
    seed: int
    rows: int
    changes: int | None
    mix: tuple[tuple[str, float], ...]
    hot_keys: float
    hot_share: float
    tx_size: tuple[int, int]
    pk_change: float
    resync_every: int
    start_lsn: int
    identity: str


class _Model:
    """The table and its random walk. `peek()` is the next item's position; `step()` makes it happen."""

    def __init__(self, cfg: _Config) -> None:
        self.cfg = cfg
        self._rng = random.Random(cfg.seed)
        self._position_rng = random.Random(f"positions:{cfg.seed}")
        self.rows: dict[TypedKey, Row] = {}
        self._live: list[TypedKey] = []
        self._slot: dict[TypedKey, int] = {}
        self._ordinal = 0
        self._lsn = cfg.start_lsn
        self._txs = 0
        self._txs_since_resync = 0
        self.emitted = 0
        self._next: str | None = None
        when = _BASE_TIME
        for _ in range(cfg.rows):
            self._put(self._new_row(when))
        self.initial_position = format_lsn(cfg.start_lsn)

    # -- rows ----------------------------------------------------------------------------------

    def _new_id(self) -> int:
        self._ordinal += 1
        return self._ordinal if self._ordinal % 10 else _BIG + self._ordinal

    def _balance(self) -> int:
        if self._rng.random() < 1 / 3:
            return self._rng.choice((1, -1)) * self._rng.randint(_BIG + 1, _INT64_MAX)
        return self._rng.randint(-1_000_000, 1_000_000)

    def _name_email(self, ident: int) -> tuple[str, str]:
        first, last = self._rng.choice(_FIRST), self._rng.choice(_LAST)
        return f"{first} {last}", f"{first.lower()}.{ident % 997}@example.com"

    def _new_row(self, when: _dt.datetime) -> Row:
        ident = self._new_id()
        name, email = self._name_email(ident)
        rng = self._rng
        return {"id": ident, "name": name, "email": email, "score": round(rng.uniform(0, 1000), 3),
                "active": rng.random() < 0.8, "balance": self._balance(), "updated_at": time_text(when),
                "tags": rng.sample(_TAGS, rng.randint(0, 3))}

    def _put(self, row: Row) -> TypedKey:
        key = typed_key(row, KEY_FIELDS)
        if key not in self.rows:
            self._slot[key] = len(self._live)
            self._live.append(key)
        self.rows[key] = row  # rows are replaced, never mutated: emitted images stay valid
        return key

    def _drop(self, key: TypedKey) -> Row:
        row = self.rows.pop(key)
        index = self._slot.pop(key)
        last = self._live.pop()
        if last != key:
            self._live[index] = last
            self._slot[last] = index
        return row

    def _pick(self) -> TypedKey:
        """A live key; `hot_share` of the picks go to the first `hot_keys` fraction of them."""
        n = len(self._live)
        if self._rng.random() < self.cfg.hot_share:
            n = max(1, int(n * self.cfg.hot_keys))
        return self._live[self._rng.randrange(n)]

    # -- the stream ----------------------------------------------------------------------------

    def exhausted(self) -> bool:
        return self.cfg.changes is not None and self.emitted >= self.cfg.changes

    def peek(self) -> str | None:
        """The position of the next item (None: the stream is over); draws only from the position rng."""
        if self._next is None and not self.exhausted():
            self._lsn += self._position_rng.randint(0x28, 0x2000)
            self._next = format_lsn(self._lsn)
        return self._next

    def step(self) -> _Tx | _Resync:
        position = self.peek()
        if position is None:
            raise StopIteration
        self._next = None
        if self.cfg.resync_every and self._txs_since_resync >= self.cfg.resync_every:
            self._txs_since_resync = 0
            return _Resync(position)
        self._txs_since_resync += 1
        self._txs += 1
        when = _BASE_TIME + _dt.timedelta(microseconds=self._txs * _TX_SPACING_US)
        # A limit never cuts a transaction short: the stream ends after the transaction that reaches
        # it, so the stream for `changes=N` is an exact prefix of the stream for any larger limit.
        size = self._rng.randint(*self.cfg.tx_size)
        actions, weights = zip(*self.cfg.mix, strict=True)
        changes = []
        for _ in range(size):
            self.emitted += 1
            action = self._rng.choices(actions, weights)[0]
            changes.append(self._change(action, position, when))
        return _Tx(position, tuple(changes))

    def _change(self, action: str, position: str, when: _dt.datetime) -> ChangeEvent:
        def event(kind: Action, old: Row | None = None, new: Row | None = None) -> ChangeEvent:
            unchanged: tuple[str, ...] = ()
            if self.cfg.identity == "default" and old is not None:
                old, new, unchanged = _as_default_identity(kind, old, new)
            return ChangeEvent(position, kind, old=old, new=new, commit_time=when, sequence=self.emitted,
                               unchanged=unchanged)

        if action == "truncate":
            self.rows.clear()
            self._live.clear()
            self._slot.clear()
            return event(Action.TRUNCATE)
        if action == "insert" or not self._live:
            row = self._new_row(when)
            self._put(row)
            return event(Action.INSERT, new=row)
        key = self._pick()
        if action == "delete":
            return event(Action.DELETE, old=self._drop(key))
        old = self.rows[key]
        new = dict(old, updated_at=time_text(when))
        for column in self._rng.sample(("name", "score", "active", "balance", "tags"), self._rng.randint(1, 3)):
            new[column] = self._new_value(column, old["id"])
        if self._rng.random() < self.cfg.pk_change:
            self._drop(key)
            new["id"] = self._new_id()
        self._put(new)
        return event(Action.UPDATE, old=old, new=new)

    def _new_value(self, column: str, ident: int) -> object:
        if column == "name":
            return self._name_email(ident)[0]
        if column == "score":
            return round(self._rng.uniform(0, 1000), 3)
        if column == "active":
            return self._rng.random() < 0.5
        if column == "balance":
            return self._balance()
        return self._rng.sample(_TAGS, self._rng.randint(0, 3))


def _as_default_identity(kind: Action, old: Row, new: Row | None) -> tuple[Row | None, Row | None, tuple[str, ...]]:
    """(old, new, unchanged) of a change as PostgreSQL sends it under REPLICA IDENTITY DEFAULT."""
    key = {name: old[name] for name in KEY_FIELDS}
    if new is None:
        return key, None, ()
    unchanged = tuple(c for c in _OUT_OF_LINE if new.get(c) is not None and new.get(c) == old.get(c))
    sent = {name: value for name, value in new.items() if name not in unchanged}
    moved = any(new[name] != old[name] for name in KEY_FIELDS)
    return (key if moved else None), sent, unchanged


class GeneratorSubscriber:
    """A `Subscriber` over the synthetic table. See the module docstring.

    `changes=None` streams forever; `rate` paces it (changes per second, None = as fast as
    possible); `mix` weights insert/update/delete/truncate (truncate is off by default);
    `hot_keys` is the hot fraction of the table and `hot_share` the share of updates and deletes
    that go to it; `pk_change` the fraction of updates that change the primary key; `resync_every`
    announces a full re-sync after every N transactions (0 = never); `identity` is the replica
    identity the changes are shaped for (see the module docstring).
    """

    ordering = "lsn"

    def __init__(self, table: str = "public.users", *, seed: int = 0, rows: int = 1000,
                 changes: int | None = None, mix: Mapping[str, float] | None = None, hot_keys: float = 0.1,
                 hot_share: float = 0.5, tx_size: tuple[int, int] = (1, 5), pk_change: float = 0.02,
                 resync_every: int = 0, rate: float | None = None, start_lsn: int = DEFAULT_START_LSN,
                 identity: str = "full") -> None:
        weights = dict(DEFAULT_MIX if mix is None else mix)
        unknown = set(weights) - set(DEFAULT_MIX)
        if unknown or not any(weights.values()) or min(weights.values()) < 0:
            raise ValueError(f"mix needs non-negative weights for {sorted(DEFAULT_MIX)}, got {weights}")
        if not 1 <= tx_size[0] <= tx_size[1]:
            raise ValueError(f"tx_size must be a range (min >= 1, min <= max), got {tx_size}")
        if rows < 0 or (changes is not None and changes < 0) or (rate is not None and rate <= 0):
            raise ValueError("rows and changes must be >= 0 and rate > 0")
        if identity not in IDENTITIES:
            raise ValueError(f"identity must be one of {list(IDENTITIES)}, got {identity!r}")
        self.table = table
        self.schema = users_schema(table)
        self.rate = rate
        self._cfg = _Config(seed, rows, changes, tuple((a, weights.get(a, 0.0)) for a in DEFAULT_MIX),
                            hot_keys, hot_share, tx_size, pk_change, resync_every, start_lsn, identity)
        self.initial_position = format_lsn(start_lsn)
        self.acknowledged: str | None = None
        self._closed = threading.Event()

    def events(self, start: str | None) -> Iterator[Event]:
        """The initial load then the stream (start None), or the stream right after `start`."""
        if start is not None and compare_lsn(start, self.initial_position) < 0:
            raise ValueError(f"table {self.table}: cannot resume the generator at {start!r}, before its "
                             f"initial load at {self.initial_position}")
        self._closed.clear()
        model = _Model(self._cfg)
        yield SchemaEvent(self.schema)
        if start is None:
            yield from self._full_snapshot(model, "initial load", model.initial_position)
        paced_from: float | None = None
        emitted_from = 0
        while not self._closed.is_set():
            position = model.peek()
            if position is None:
                return
            item = model.step()
            if start is not None and compare_lsn(position, start) <= 0:
                continue  # before the resume point: replayed only to rebuild the model
            if isinstance(item, _Resync):
                yield from self._full_snapshot(model, "generator: periodic re-sync", item.position)
                continue
            yield from item.changes
            yield TxEnd(item.position)
            if self.rate is not None:
                if paced_from is None:  # pace from the first transaction sent, not the replay
                    paced_from, emitted_from = time.monotonic(), model.emitted - len(item.changes)
                due = paced_from + (model.emitted - emitted_from) / self.rate
                self._closed.wait(max(0.0, due - time.monotonic()))

    @staticmethod
    def _full_snapshot(model: _Model, reason: str, position: str) -> Iterator[Event]:
        yield ResyncBegin(reason)
        rows = list(model.rows.values())
        yield from (SnapshotRow(row) for row in rows)
        yield ResyncEnd(position, len(rows))

    def acknowledge(self, position: str) -> None:
        if self.acknowledged is None or compare_lsn(position, self.acknowledged) > 0:
            self.acknowledged = position

    def close(self) -> None:
        """Stop a running `events` iterator at its next step (also interrupts rate pacing)."""
        self._closed.set()

    def table_at(self, position: str) -> dict[TypedKey, Row]:
        """The table as of `position`: the initial load plus every transaction at or before it."""
        if compare_lsn(position, self.initial_position) < 0:
            raise ValueError(f"table {self.table}: {position!r} is before the initial load at "
                             f"{self.initial_position}")
        model = _Model(self._cfg)
        while (nxt := model.peek()) is not None and compare_lsn(nxt, position) <= 0:
            model.step()
        return dict(model.rows)

    def end_position(self) -> str | None:
        """The last position of a finite stream (None for an endless one)."""
        if self._cfg.changes is None:
            return None
        model = _Model(self._cfg)
        last = model.initial_position
        while model.peek() is not None:
            last = model.step().position
        return last
