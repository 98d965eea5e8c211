"""Dagster sensors: ingest supervision, re-base triggers, event-outbox retries."""
