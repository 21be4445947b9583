"""alignflow: preference training of language models as a tracked, versioned pipeline.

The library layer: pure Python on torch/transformers/trl. It never imports Prefect,
``tasks`` or ``flows``, so every piece works from a notebook with no orchestrator.
"""

__version__ = "0.1.0"
