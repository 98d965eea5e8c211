"""Integration tests against a private PostgreSQL cluster (logical replication source)."""
