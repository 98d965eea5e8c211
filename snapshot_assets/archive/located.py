"""Each destination's copy of the manifest names that destination's own objects.

An artifact is written under the same key on every destination, but its URI differs
(`file:///...` on one, `s3://bucket/...` on another). A manifest copy whose URIs pointed at the first
destination would send a consumer of the second one to storage it may not be able to reach, and
would stop working the day the first destination is retired. laredo's readers recompute keys and
ignore the URIs, so this only matters to consumers that follow them (this project's events, people,
tools), and it costs nothing: the URI is the destination's name for the key the layout fixes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from snapshot_assets.archive.formats import FORMATS
from snapshot_assets.archive.manifest import Artifact, Manifest
from snapshot_assets.archive.reader import artifact_key


def located_artifact(art: Artifact, key_prefix: str, uri: Callable[[str], str]) -> Artifact:
    """`art` with every format's URI set to `uri(key)` of its object key (formats this project does
    not know keep the URI they came with)."""
    formats = {fid: replace(ref, uri=uri(artifact_key(key_prefix, art, FORMATS[fid]))) if fid in FORMATS else ref
               for fid, ref in art.formats.items()}
    return replace(art, formats=formats)


def located(manifest: Manifest, key_prefix: str, uri: Callable[[str], str]) -> Manifest:
    """`manifest` as the copy kept on the destination whose URI of a key is `uri(key)`."""
    return replace(manifest, artifacts=tuple(located_artifact(a, key_prefix, uri) for a in manifest.artifacts))
