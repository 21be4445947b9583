"""Prefect tasks: each wraps one library call (retries, cache keys, MLflow nesting)."""
