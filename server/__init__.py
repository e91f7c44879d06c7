"""The FedPer aggregation server: PROTOCOL.md v1 over FastAPI, state in SQLite, weights in blobs."""
