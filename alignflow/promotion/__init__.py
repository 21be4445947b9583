"""Promotion decisions as pure code: which gates apply, how each is judged, the verdict.

No store is read or written here (:mod:`alignflow.registry.promotion` does that).
"""
