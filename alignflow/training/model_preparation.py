"""One hook for what a stage's mixins switch on its models: the faster CPU paths, the label head.

The mixins change how the policy and a separate reference compute, once the TRL constructor
has built them. TRL's DPO constructor already runs the reference over the data (its
precomputed log-probs) before any mixin's code after ``super().__init__`` runs, so the switches
form one cooperative hook: that pass calls it early, the end of construction calls it again,
and each mixin switches its models once.
"""

from __future__ import annotations

from typing import Any


class PreparedModelsMixin:
    """Base of every mixin that switches a trainer's models: each extends :meth:`prepare_models`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prepare_models()

    def prepare_models(self) -> None:
        """Switch the models; an override calls ``super()`` first and does its part only once
        (the hook may run twice: early, from a pass inside the base constructor, and after it)."""
