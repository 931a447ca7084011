"""The imperative shell around the pure core: ingest, pumps, decisions, Ray glue."""
