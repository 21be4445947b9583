"""Prefect flows: the pipelines people run and schedule."""
