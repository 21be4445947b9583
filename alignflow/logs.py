"""Raising a library logger's level for one block: the libraries we drive narrate too much."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    """Run the block with logger ``name`` at ``level``, then restore the level it had."""
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
