"""Event capture (RFC-023): publish API, durable per-writer buffer, pages in object storage, page index.

The flow, one module per stage: `service` (gRPC) -> `log` (fsync'd per-writer append log) ->
`buffer` (per-writer flush triggers) -> `pages` + `keys` (encode, compress, name) -> `flush`
(write to a destination with retry and dead letter) -> `index` (page metadata, off the durability
path) -> `replay` (events back, in order, from what the index names).
"""
