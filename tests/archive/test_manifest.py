"""Manifest v1: load, validate, serialise exactly like laredo (Go MarshalIndent), keep unknown fields."""

from __future__ import annotations

import json

import pytest

from snapshot_assets.archive.errors import CorruptManifest, UnsupportedManifestVersion
from snapshot_assets.archive.manifest import Artifact, FormatRef, Manifest, loads
from snapshot_assets.archive.positions import compare_lsn

# What Go's json.MarshalIndent(m, "", "  ") prints for laredo's Manifest struct.
GO_MANIFEST = """{
  "manifest_version": 1,
  "table": "public.users",
  "epoch": 1,
  "updated_at": "2026-06-03T21:40:30Z",
  "head_position": "0/20",
  "artifacts": [
    {
      "kind": "snapshot",
      "epoch": 1,
      "from_position": null,
      "to_position": "0/10",
      "created_at": "2026-06-03T21:40:00Z",
      "row_count": 2,
      "formats": {
        "jsonl": {
          "uri": "s3://b/users/epoch=1/snapshot-0_10.jsonl",
          "size_bytes": 52
        },
        "protobuf": {
          "uri": "s3://b/users/epoch=1/snapshot-0_10.pb",
          "size_bytes": 30
        }
      }
    },
    {
      "kind": "diff",
      "epoch": 1,
      "from_position": "0/10",
      "to_position": "0/20",
      "created_at": "2026-06-03T21:40:30Z",
      "change_count": 1,
      "formats": {
        "jsonl": {
          "uri": "s3://b/users/epoch=1/diff-0_10-0_20.jsonl",
          "size_bytes": 61
        }
      }
    }
  ]
}"""


def test_round_trip_is_byte_identical_to_go() -> None:
    m = loads(GO_MANIFEST)
    assert m.dumps().decode() == GO_MANIFEST
    assert m.head_position == "0/20" and m.artifacts[0].from_position is None
    assert m.artifacts[0].row_count == 2 and m.artifacts[1].change_count == 1
    m.validate(compare_lsn)


def test_zero_counts_are_omitted_and_null_from_is_present() -> None:
    art = Artifact("snapshot", 1, None, "0/1", "2026-01-01T00:00:00Z", {"jsonl": FormatRef("u", 0)})
    doc = art.to_json()
    assert "row_count" not in doc and "change_count" not in doc
    assert doc["from_position"] is None and list(doc)[:3] == ["kind", "epoch", "from_position"]


def test_go_html_escaping_in_manifest() -> None:
    m = Manifest(table="a<b>&c", head_position="")
    assert b'"a\\u003cb\\u003e\\u0026c"' in m.dumps()


def test_unknown_fields_survive_a_rewrite() -> None:
    doc = json.loads(GO_MANIFEST)
    doc["writer"] = {"name": "future", "v": 3}
    doc["artifacts"][0]["checksum"] = "sha256:abc"
    doc["artifacts"][0]["formats"]["jsonl"]["etag"] = "e1"
    m = loads(json.dumps(doc))
    art = Artifact("diff", 1, "0/20", "0/30", "2026-06-03T21:41:00Z", {"jsonl": FormatRef("u", 5)}, change_count=2)
    rewritten = json.loads(m.with_artifact(art, now="2026-06-03T21:41:00Z").dumps())
    assert rewritten["writer"] == {"name": "future", "v": 3}
    assert rewritten["artifacts"][0]["checksum"] == "sha256:abc"
    assert rewritten["artifacts"][0]["formats"]["jsonl"]["etag"] == "e1"
    assert rewritten["head_position"] == "0/30" and len(rewritten["artifacts"]) == 3


@pytest.mark.parametrize("version", [None, 0, 1])
def test_accepts_missing_zero_and_one(version: int | None) -> None:
    doc = json.loads(GO_MANIFEST)
    if version is None:
        del doc["manifest_version"]
    else:
        doc["manifest_version"] = version
    assert loads(json.dumps(doc)).table == "public.users"


def test_rejects_newer_version() -> None:
    with pytest.raises(UnsupportedManifestVersion, match="manifest_version 2 is newer"):
        loads(GO_MANIFEST.replace('"manifest_version": 1', '"manifest_version": 2'))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(manifest_version="1"), "manifest_version must be an integer"),
        (lambda d: d["artifacts"][0].update(kind="blob"), "unknown artifact kind 'blob'"),
        (lambda d: d["artifacts"][1].update(epoch="1"), r"artifacts\[1\].epoch: expected an integer"),
        (lambda d: d["artifacts"][1].update(to_position=7), r"artifacts\[1\].to_position: expected a string"),
        (lambda d: d.update(artifacts={}), "artifacts must be a list"),
    ],
)
def test_structural_errors_name_the_field(mutate: object, message: str) -> None:
    doc = json.loads(GO_MANIFEST)
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(CorruptManifest, match=message):
        loads(json.dumps(doc))


def test_not_json_or_not_object() -> None:
    with pytest.raises(CorruptManifest, match="not valid JSON"):
        loads(b"{")
    with pytest.raises(CorruptManifest, match="expected a JSON object"):
        loads(b"[]")


def _with(doc_changes: dict[str, object], art_index: int | None = None) -> Manifest:
    doc = json.loads(GO_MANIFEST)
    target = doc if art_index is None else doc["artifacts"][art_index]
    target.update(doc_changes)
    return loads(json.dumps(doc))


@pytest.mark.parametrize(
    ("m", "problem"),
    [
        (_with({"from_position": "0/15"}, 1), "does not continue the chain"),
        (_with({"from_position": "0/20"}, 1), "from_position == to_position"),
        (_with({"from_position": ""}, 1), "empty from_position"),
        (_with({"to_position": ""}, 1), "empty to_position"),
        (_with({"head_position": "0/10"}), "head_position '0/10' != last artifact's to_position"),
        (_with({"epoch": 2}), "epoch 2 != epoch of the newest snapshot"),
        (_with({"epoch": 2}, 1), "carries epoch 2 but follows the snapshot of epoch 1"),
        (_with({"to_position": "0/5", "from_position": "0/10"}, 1), "ends before it starts"),
    ],
)
def test_validation_problems(m: Manifest, problem: str) -> None:
    assert any(problem in p for p in m.problems(compare_lsn)), m.problems(compare_lsn)
    with pytest.raises(CorruptManifest, match="is invalid"):
        m.validate(compare_lsn)


def test_retention_keeps_newest_epochs() -> None:
    ref = {"jsonl": FormatRef("u", 1)}
    m = Manifest(table="t")
    for art in [
        Artifact("snapshot", 1, None, "0/1", "", ref), Artifact("diff", 1, "0/1", "0/2", "", ref),
        Artifact("snapshot", 2, None, "0/3", "", ref), Artifact("diff", 2, "0/3", "0/4", "", ref),
        Artifact("snapshot", 3, None, "0/5", "", ref),
    ]:
        m = m.with_artifact(art, now="2026-01-01T00:00:00Z", keep_epochs=2)
    assert [(a.kind, a.epoch) for a in m.artifacts] == [("snapshot", 2), ("diff", 2), ("snapshot", 3)]
    assert m.epoch == 3 and m.head_position == "0/5"
    m.validate(compare_lsn)
