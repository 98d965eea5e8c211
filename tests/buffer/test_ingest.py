"""The ingest loop in-process: resume, acknowledge only what is durable, retry, stop, quiet sources."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from resources.buffer import ChangeBuffer
from resources.ingest import run_ingest
from resources.subscribers.events import Event, TxEnd
from resources.subscribers.generator import GeneratorSubscriber
from tests.buffer.helpers import TABLE, buffer_rows, generator_history, replay, row_history

MIX = {"insert": 0.3, "update": 0.5, "delete": 0.18, "truncate": 0.02}


class SourceError(Exception):
    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class Recording:
    """Wraps a subscriber: checks every acknowledgement against the buffer, can fail on cue."""

    ordering = "lsn"

    def __init__(self, inner: GeneratorSubscriber, buffer: ChangeBuffer, *, failures: int = 0,
                 transient: bool = True, seed: int = 0, fail_after: int | None = None) -> None:
        self.inner = inner
        self.buffer = buffer
        self.acks: list[str] = []
        self.starts: list[str | None] = []
        self.failures = failures
        self.transient = transient
        self._rng = random.Random(seed)
        self._fail_after = fail_after

    def events(self, start: str | None) -> Iterator[Event]:
        self.starts.append(start)
        fail_after = (self._fail_after or self._rng.randint(1, 400)) if self.failures else None
        for n, event in enumerate(self.inner.events(start)):
            if fail_after is not None and n == fail_after:
                self.failures -= 1
                raise SourceError("connection reset", transient=self.transient)
            yield event

    def acknowledge(self, position: str) -> None:
        assert position == self.buffer.durable_position(), "acknowledged a position that is not durable"
        assert not self.acks or position != self.acks[-1]
        self.acks.append(position)
        self.inner.acknowledge(position)

    def close(self) -> None:
        self.inner.close()


def generator(**kw: object) -> GeneratorSubscriber:
    options: dict[str, object] = {"seed": 11, "rows": 200, "changes": 4000, "mix": MIX, "resync_every": 300}
    options.update(kw)
    return GeneratorSubscriber(**options)  # type: ignore[arg-type]


def assert_exact_history(root: Path, gen: GeneratorSubscriber, durable: str | None) -> None:
    rows = buffer_rows(root)
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
    assert row_history(rows) == generator_history(gen, durable)
    assert durable is not None and replay(rows) == gen.table_at(durable)


def test_runs_a_finite_source_to_the_end(tmp_path: Path) -> None:
    gen = generator()
    with ChangeBuffer(tmp_path, TABLE, seal_interval=0.01, seal_changes=500) as buffer:
        source = Recording(gen, buffer)
        result = run_ingest(source, buffer, stop=threading.Event())
    assert result.finished and result.durable_position == gen.end_position()
    assert source.starts == [None] and source.acks[-1] == result.durable_position
    assert_exact_history(tmp_path, gen, result.durable_position)


def test_transient_errors_are_retried_from_the_durable_position(tmp_path: Path) -> None:
    gen = generator()
    errors: list[tuple[Exception, float]] = []
    with ChangeBuffer(tmp_path, TABLE, seal_interval=0.005, seal_changes=300) as buffer:
        source = Recording(gen, buffer, failures=6, seed=3)
        result = run_ingest(source, buffer, stop=threading.Event(), initial_backoff=0.001, max_backoff=0.004,
                            on_error=lambda exc, delay: errors.append((exc, delay)))
    assert result.finished and result.reconnects == 6 == len(errors)
    assert all(d <= 0.004 for _, d in errors)
    assert source.starts[1:] != [None] * 6  # resumed, not re-snapshotted
    assert_exact_history(tmp_path, gen, result.durable_position)


def test_non_transient_error_stops_with_complete_transactions_durable(tmp_path: Path) -> None:
    gen = generator()
    with ChangeBuffer(tmp_path, TABLE, seal_interval=3600.0, seal_changes=10**9) as buffer:
        source = Recording(gen, buffer, failures=1, transient=False, fail_after=1234)
        with pytest.raises(SourceError, match="connection reset"):
            run_ingest(source, buffer, stop=threading.Event())
        durable = buffer.durable_position()
    assert source.acks[-1] == durable
    assert_exact_history(tmp_path, gen, durable)


def test_stop_seals_at_the_last_transaction_end_and_resume_continues(tmp_path: Path) -> None:
    gen = generator(changes=None, rate=5000.0)
    stop = threading.Event()
    with ChangeBuffer(tmp_path, TABLE, seal_interval=10.0) as buffer:
        threading.Timer(0.4, stop.set).start()
        result = run_ingest(Recording(gen, buffer), buffer, stop=stop)
        first = result.durable_position
    assert not result.finished and first is not None
    assert_exact_history(tmp_path, gen, first)
    stop = threading.Event()
    with ChangeBuffer(tmp_path, TABLE, seal_interval=10.0) as buffer:
        source = Recording(gen, buffer)
        threading.Timer(0.3, stop.set).start()
        result = run_ingest(source, buffer, stop=stop)
    assert source.starts == [first]
    assert_exact_history(tmp_path, gen, result.durable_position)


class Quiet:
    """One transaction, then silence until closed."""

    ordering = "lsn"

    def __init__(self, gen: GeneratorSubscriber) -> None:
        self.gen = gen
        self.acks: list[str] = []
        self.closed = threading.Event()

    def events(self, start: str | None) -> Iterator[Event]:
        for event in self.gen.events(start):
            yield event
            if isinstance(event, TxEnd):
                break
        self.closed.wait(30)

    def acknowledge(self, position: str) -> None:
        self.acks.append(position)

    def close(self) -> None:
        self.closed.set()


def test_a_quiet_source_does_not_delay_the_seal(tmp_path: Path) -> None:
    gen = generator(changes=None)
    source = Quiet(gen)
    stop = threading.Event()
    with ChangeBuffer(tmp_path, TABLE, seal_interval=0.2) as buffer:
        runner = threading.Thread(target=run_ingest, args=(source, buffer), kwargs={"stop": stop})
        started = time.monotonic()
        runner.start()
        while len(source.acks) < 2 and time.monotonic() - started < 5:
            time.sleep(0.01)
        sealed_after = time.monotonic() - started
        stop.set()
        runner.join(5)
        assert not runner.is_alive()
    assert len(source.acks) == 2 and sealed_after < 2  # initial load, then the lone transaction
    assert_exact_history(tmp_path, gen, source.acks[-1])
