"""Dagster test instances that fail the test which leaves a Dagster context open.

Why: Dagster keeps "the current instance's state storage" in a context variable that each
instance sets when entered and resets when it exits. A context a test builds without `with`
(`build_output_context`, `build_input_context`: each enters an ephemeral instance of its own) is
exited only when the garbage collector finalizes it, at any later moment, maybe in another test;
its reset then puts back the storage of an instance that is long gone, and the next definitions
load in that test opened a deleted SQLite file. Collecting here, while the test's instance is
still current, makes that moment deterministic and names the test that left the context open.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import dagster as dg
from dagster._core.storage.defs_state.base import DefsStateStorage


@contextlib.contextmanager
def checked_instance(**kwargs: Any) -> Iterator[dg.DagsterInstance]:
    """`dg.instance_for_test(**kwargs)`, and at the end of the test a check that Dagster's current
    instance is still this one once everything the test left behind has been finalized."""
    with dg.instance_for_test(**kwargs) as instance:
        yield instance
        gc.collect()
        assert DefsStateStorage.get() is instance.defs_state_storage, (
            "this test left a Dagster context open (built without `with`): finalized now, it switched "
            "Dagster's current instance away from the test's own")
