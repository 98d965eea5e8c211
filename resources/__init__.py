"""Dagster resources and the pluggable seams they wrap: destinations, subscribers, buffers, sinks."""
