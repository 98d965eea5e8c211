"""Event capture in Dagster: the pages as a day-partitioned asset, its index check, reconciliation."""
