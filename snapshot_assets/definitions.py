"""The code location: everything Dagster loads from `snapshot_assets.definitions`."""

from __future__ import annotations

import dagster as dg

from snapshot_assets.archive_jobs import verify_archive_job

defs = dg.Definitions(jobs=[verify_archive_job])
