"""Dagster code location that archives live tables as base snapshot + diffs + manifest (laredo format)."""
