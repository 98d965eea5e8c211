"""The write side of the archive: manifest commits, retention, garbage collection, the event outbox."""
