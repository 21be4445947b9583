"""Registered model names: a name that does not exist is reported with the ones that do.

MLflow answers a ``models:/NAME@ALIAS`` for an unknown ``NAME`` with a bare "not found"; the
usual cause is a name guessed from another project (``alignflow-reward`` where the demo
registers ``alignflow-demo-reward``), which the list of registered names makes obvious.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from urllib.parse import urlparse

SHOWN_NAMES = 20  # a registry may hold hundreds; the message lists the first ones


class UnknownModelError(LookupError):
    """The registry holds no model of that name (the message lists the names it does hold)."""


class NoTrackingStore(UnknownModelError):
    """The tracking URI names a local store that is not there: no model can be registered in it."""


def local_store_path(tracking_uri: str) -> Path | None:
    """The file or folder a local tracking URI names (``sqlite:///mlflow.db``, ``file:``, a bare
    path), where MLflow would create an empty store on first use; None for a server or database."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///"))
    scheme = urlparse(tracking_uri).scheme
    if scheme == "file":
        return Path(urlparse(tracking_uri).path)
    return Path(tracking_uri) if scheme == "" else None


def require_store(tracking_uri: str) -> None:
    """Raise :class:`NoTrackingStore` when a local store is missing: a read-only look (promote,
    rollback, eval of ``models:/``) must not leave an empty ``mlflow.db`` or ``mlruns/`` behind."""
    path = local_store_path(tracking_uri)
    if path is not None and not path.exists():
        raise NoTrackingStore(
            f"no MLflow tracking store at {tracking_uri} ({path.resolve()} does not exist); "
            "`alignflow run` here makes one, or point at yours with --tracking-uri or MLFLOW_TRACKING_URI"
        )


def registered_model_names(tracking_uri: str) -> list[str]:
    """Every registered model name in the store, sorted (all pages of the search)."""
    from mlflow import MlflowClient

    client, token = MlflowClient(tracking_uri), None
    names: list[str] = []
    while True:
        page = client.search_registered_models(max_results=1000, page_token=token)
        names.extend(model.name for model in page)
        token = page.token
        if not token:
            return sorted(names)


def _is_registered(tracking_uri: str, name: str) -> bool:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri).get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def unknown_model_message(name: str, tracking_uri: str, names: list[str]) -> str:
    """What to say about ``name`` when the store holds only ``names``."""
    where = f"no registered model {name!r} in {tracking_uri}"
    if not names:
        return f"{where}; the registry is empty (`alignflow run` registers <project>-policy and -reward)"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    more = len(names) - SHOWN_NAMES
    shown = ", ".join(names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")
    return f"{where}{guess}; registered models: {shown}"


def require_registered(tracking_uri: str, name: str) -> None:
    """Raise :class:`UnknownModelError` naming the registered models when ``name`` is not one
    (:class:`NoTrackingStore` when there is no store to hold it)."""
    require_store(tracking_uri)
    if not _is_registered(tracking_uri, name):
        names = registered_model_names(tracking_uri)
        raise UnknownModelError(unknown_model_message(name, tracking_uri, names))
