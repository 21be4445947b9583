"""One way to keep named specs: the training stages, the promotion gates, the pinned-set judges.

Each is extended the same way (its own module plus one registration line), so each keeps
its specs in a :class:`NamedRegistry`: a name taken by another spec is refused unless the
caller replaces it on purpose, a name that must serve as an identifier (a config section,
a metric name) is checked, and an unknown name is an error that lists the known ones.
Registration order is kept: built-ins first, then what a plug-in or a test adds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


S = TypeVar("S", bound=Named)


class NamedRegistry(Generic[S]):
    """Specs by name; ``kind`` names them in errors ("training stage", "gate", "judge");
    ``identifier_because`` (when set) requires names to be Python identifiers and says why."""

    def __init__(self, kind: str, identifier_because: str | None = None):
        self.kind = kind
        self.identifier_because = identifier_because
        self._specs: dict[str, S] = {}

    def add(self, spec: S, replace: bool = False) -> S:
        if self.identifier_because and not spec.name.isidentifier():
            raise ValueError(
                f"{self.kind} name {spec.name!r} must be a Python identifier ({self.identifier_because})"
            )
        if spec.name in self._specs and not replace:
            raise ValueError(f"a {self.kind} named {spec.name!r} is already registered")
        self._specs[spec.name] = spec
        return spec

    def remove(self, name: str) -> None:
        """Forget ``name`` (a test that registered a toy one cleans up with this); absent is fine."""
        self._specs.pop(name, None)

    def get(self, name: str) -> S:
        if name not in self._specs:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self._specs)}")
        return self._specs[name]

    def all(self) -> dict[str, S]:
        """A copy, in registration order."""
        return dict(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)
