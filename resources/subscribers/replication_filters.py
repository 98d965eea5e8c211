"""Subscription filters (`SyncRequest.filters`): the client's spelling and the server's matcher.

A filter is a list of column predicates, ANDed (spec §8):

- `equals`: numbers compare numerically (42 matches 42 and 42.0; a bool is never a number),
  strings and booleans by value;
- `prefix`: matches string values only;
- `in`: membership with the `equals` rules;
- a missing or null column never matches;
- INSERT and UPDATE test the new row, DELETE the old row, TRUNCATE always passes (it is
  structural and applies to the whole replica).

Both sides live here so the client's validation and the server's INVALID_ARGUMENT agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf import struct_pb2

from resources.proto.laredo.replication.v1 import replication_pb2 as pb
from snapshot_assets.archive.changes import Action, Row
from snapshot_assets.archive.formats.protobuf import set_value, to_python

Kind = Literal["equals", "prefix", "in"]
_KINDS: tuple[Kind, ...] = ("equals", "prefix", "in")


@dataclass(frozen=True, slots=True)
class Filter:
    """One predicate as configured: `Filter("tenant_id", "equals", 42)`."""

    field: str
    kind: Kind
    value: Any

    @staticmethod
    def parse(spec: Filter | Mapping[str, Any]) -> Filter:
        """A Filter from itself or from config (`{field = tenant_id, equals = 42}`); ValueError if bad."""
        if isinstance(spec, Filter):
            filt = spec
        else:
            field = spec.get("field")
            kinds = [k for k in _KINDS if k in spec]
            unknown = sorted(set(spec) - {"field", *_KINDS})
            if unknown:
                raise ValueError(f"filter {dict(spec)!r}: unknown keys {unknown}; expected field and one "
                                 f"of {', '.join(_KINDS)}")
            if len(kinds) != 1:
                raise ValueError(f"filter {dict(spec)!r} needs exactly one of {', '.join(_KINDS)}")
            filt = Filter(str(field or ""), kinds[0], spec[kinds[0]])
        filt.validate()
        return filt

    def validate(self) -> None:
        if not self.field:
            raise ValueError("filter field is required")
        if self.kind not in _KINDS:
            raise ValueError(f"filter on {self.field!r}: unknown kind {self.kind!r}")
        if self.kind == "prefix" and not isinstance(self.value, str):
            raise ValueError(f"filter on {self.field!r}: prefix must be a string, got {self.value!r}")
        if self.kind == "in":
            if not isinstance(self.value, (list, tuple)):
                raise ValueError(f"filter on {self.field!r}: in needs a list, got {self.value!r}")
            for item in self.value:
                _scalar(self.field, item)
        if self.kind == "equals":
            _scalar(self.field, self.value)

    def to_proto(self) -> pb.FieldPredicate:
        predicate = pb.FieldPredicate(field=self.field)
        if self.kind == "equals":
            set_value(predicate.equals, self.value)
        elif self.kind == "prefix":
            predicate.prefix = self.value
        else:
            values: struct_pb2.ListValue = getattr(predicate, "in")
            values.SetInParent()
            for item in self.value:
                set_value(values.values.add(), item)
        return predicate


def _scalar(field: str, value: Any) -> None:
    if isinstance(value, (Mapping, list, tuple)):
        raise ValueError(f"filter on {field!r}: {value!r} is not a scalar (string, number, bool)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"filter on {field!r}: {value!r} never equals anything")


def parse_filters(specs: Iterable[Filter | Mapping[str, Any]]) -> tuple[Filter, ...]:
    return tuple(Filter.parse(s) for s in specs)


# --- matching (server side) ---------------------------------------------------------------------

_Normalized = tuple[str, Any]


def _normalize(value: Any) -> _Normalized | None:
    """A comparable form: numbers (not bools) by numeric value, strings and bools by value.

    Python compares int and float exactly (2**60 + 1 != float(2**60)), so no precision is lost the
    way a float64 normalisation would lose it. None and containers never compare equal.
    """
    if value is None or isinstance(value, (Mapping, list, tuple)):
        return None
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    return (type(value).__name__, value)


@dataclass(frozen=True, slots=True)
class _Compiled:
    field: str
    kind: Kind
    prefix: str = ""
    wanted: tuple[_Normalized, ...] = ()

    def matches(self, row: Row) -> bool:
        value = row.get(self.field)
        if value is None:
            return False
        if self.kind == "prefix":
            return isinstance(value, str) and value.startswith(self.prefix)
        normalized = _normalize(value)
        return normalized is not None and normalized in self.wanted


class RowFilter:
    """A compiled filter; an empty one matches everything."""

    def __init__(self, predicates: Sequence[_Compiled] = ()) -> None:
        self._predicates = tuple(predicates)

    def __bool__(self) -> bool:
        return bool(self._predicates)

    def matches_row(self, row: Row | None) -> bool:
        if not self._predicates:
            return True
        if row is None:
            return False
        return all(p.matches(row) for p in self._predicates)

    def matches_change(self, action: Action, old: Row | None, new: Row | None) -> bool:
        if action is Action.TRUNCATE:
            return True
        if action is Action.DELETE:
            return self.matches_row(old)
        return self.matches_row(new)


def compile_filters(predicates: Sequence[pb.FieldPredicate], columns: Iterable[str] = ()) -> RowFilter:
    """Compile wire predicates; ValueError (the server's INVALID_ARGUMENT) names the bad one.

    A predicate needs a field and a match condition; `equals`/`in` need scalars. When the table's
    columns are known, a field that is not one of them is refused too: it could only ever match
    nothing, which is far more likely a typo than an intent.
    """
    known = set(columns)
    compiled: list[_Compiled] = []
    for i, predicate in enumerate(predicates):
        field = predicate.field
        if not field:
            raise ValueError(f"filter[{i}]: field is required")
        if known and field not in known:
            raise ValueError(f"filter[{i}]: column {field!r} is not a column of the table")
        kind = predicate.WhichOneof("match")
        if kind is None:
            raise ValueError(f"filter[{i}] (field {field!r}): a match condition (equals, prefix or in) "
                             "is required")
        if kind == "prefix":
            compiled.append(_Compiled(field, "prefix", prefix=predicate.prefix))
            continue
        raw: list[struct_pb2.Value] = (
            [predicate.equals] if kind == "equals" else list(getattr(predicate, "in").values)
        )
        wanted: list[_Normalized] = []
        for value in raw:
            python = to_python(value)
            if isinstance(python, (Mapping, list)):
                raise ValueError(f"filter[{i}] (field {field!r}): {kind} needs scalar values, got {python!r}")
            normalized = _normalize(python)
            if normalized is not None:  # null never matches: drop it from the wanted set
                wanted.append(normalized)
        compiled.append(_Compiled(field, "equals" if kind == "equals" else "in", wanted=tuple(wanted)))
    return RowFilter(compiled)
