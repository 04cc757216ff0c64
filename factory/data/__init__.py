"""Datasets: the Iceberg catalog, corpus ingest and splits, token packing."""
