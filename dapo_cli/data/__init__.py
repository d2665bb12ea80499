"""Datasets: the DAPO parquet schema, raw-file preparation, synthetic tasks."""
