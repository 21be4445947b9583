"""Where alignflow keeps what it computes or fetches once and then reuses.

``$ALIGNFLOW_CACHE``, default ``$XDG_CACHE_HOME/alignflow``, else ``~/.cache/alignflow`` (the
XDG convention Hugging Face tools follow too). A top-level module, so that every library
package (models, training) can reach it without importing another.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """alignflow's user cache folder (the same rule as ``training.reference_logps.cache_home``)."""
    if os.environ.get("ALIGNFLOW_CACHE"):
        return Path(os.environ["ALIGNFLOW_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "alignflow"
