"""Registered model names: a name that does not exist is reported with the ones that do.

MLflow answers a ``models:/NAME@ALIAS`` for an unknown ``NAME`` with a bare "not found"; the
usual cause is a name guessed from another project (``alignflow-reward`` where the demo
registers ``alignflow-demo-reward``), which the list of registered names makes obvious.
"""

from __future__ import annotations

import difflib

SHOWN_NAMES = 20  # a registry may hold hundreds; the message lists the first ones


class UnknownModelError(LookupError):
    """The registry holds no model of that name (the message lists the names it does hold)."""


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
    """Raise :class:`UnknownModelError` naming the registered models when ``name`` is not one."""
    if not _is_registered(tracking_uri, name):
        names = registered_model_names(tracking_uri)
        raise UnknownModelError(unknown_model_message(name, tracking_uri, names))
