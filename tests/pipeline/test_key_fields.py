"""`TablePipeline.key_fields`: the one key every downstream stage folds by.

It is the key the source reported, as the change buffer recorded it; configured `key_fields` only
stand in before anything was ingested, and contradicting the recorded key is an error, not a
silent re-keying.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.buffer import ChangeBuffer
from resources.subscribers.errors import KeyMismatch
from resources.subscribers.events import Column, ResyncBegin, ResyncEnd, SchemaEvent, TableSchema
from snapshot_assets.config import parse_config
from snapshot_assets.pipeline.table import TablePipeline

TABLE = "public.accounts"
SCHEMA = TableSchema(TABLE, (Column("user_id", "bigint", False, primary_key=True, ordinal=1, primary_key_ordinal=1),
                             Column("name", "text", ordinal=2)))


def pipeline(work: Path, key_fields: str = "") -> TablePipeline:
    return TablePipeline(parse_config(f"""
snapshotter {{
  source {{ type = laredo, server = "localhost:4002", table = accounts }}
  {key_fields}
  destinations = [ {{ type = local, path = "{work / 'archive'}" }} ]
  buffer.path = "{work / 'buffer'}"
}}
""", env={}).tables[0])


def ingested(work: Path) -> None:
    with ChangeBuffer(work / "buffer", TABLE) as buf:
        for event in (SchemaEvent(SCHEMA), ResyncBegin("initial load"), ResyncEnd("0/10", 0)):
            buf.append(event)


def test_before_ingest_the_configured_key_or_laredos_default(tmp_path: Path) -> None:
    assert pipeline(tmp_path).key_fields == ("id",)
    assert pipeline(tmp_path, "key_fields = [tenant, user_id]").key_fields == ("tenant", "user_id")


def test_after_ingest_the_key_the_source_reported(tmp_path: Path) -> None:
    ingested(tmp_path)
    assert pipeline(tmp_path).key_fields == ("user_id",)
    assert pipeline(tmp_path, "key_fields = [user_id]").key_fields == ("user_id",)


def test_key_fields_changed_after_ingest_stop_the_pipeline_naming_both(tmp_path: Path) -> None:
    ingested(tmp_path)
    with pytest.raises(KeyMismatch) as caught:
        _ = pipeline(tmp_path, "key_fields = [id]").key_fields
    assert str(caught.value) == (f"{TABLE}: key_fields [id] do not match the key the source reported [user_id] "
                                 f"of {TABLE} (recorded in the change buffer; restart ingest after changing "
                                 "key_fields)")
