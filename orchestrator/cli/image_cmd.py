"""`orchestrator image bake`: build worker / parameter-server boot images (GCE)."""

from __future__ import annotations

import typer

from orchestrator.cli.render import console
from orchestrator.control.signals import Terminated

app = typer.Typer(no_args_is_help=True)


@app.command("bake")
def bake(
    role: str = typer.Option("worker", "--role", help="worker | ps"),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type the worker image is for (k80, p100, ...)"),
    spec: str | None = typer.Option(None, "--spec", help="a gce job spec giving project and zones"),
) -> None:
    """Create a VM, run the image recipe from images/ over SSH, and make an image from its disk."""
    from orchestrator.control.images import bake_image  # lazy: the Google Cloud SDK (~2 s) only for this verb

    try:
        bake_image(role=role, gpu=gpu, spec_path=spec,
                   say=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    except KeyboardInterrupt as exc:  # bake_image's cleanup has said whether the builder VM is gone
        what, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
        console.print(f"{what}: bake cancelled", markup=False, highlight=False)
        raise typer.Exit(code) from None
