"""`orchestrator image bake`: build worker / parameter-server boot images on the spec's cloud (gce)."""

from __future__ import annotations

import typer

from orchestrator.cli.render import console
from orchestrator.control.signals import Terminated

app = typer.Typer(no_args_is_help=True)


@app.command("bake")
def bake(
    role: str = typer.Option("worker", "--role", help="worker (GPU) | ps (CPU-only parameter server, TensorFlow)"),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU the worker image is for, one GCE sells today, e.g. l4 "
                                   "or h100 (`orchestrator catalog` lists them)"),
    framework: str = typer.Option("tensorflow", "--framework", help="tensorflow | pytorch: the payload the image "
                                  "runs (jobs/tfjob or jobs/torchjob)"),
    spec: str | None = typer.Option(None, "--spec", help="a gce job spec giving project, zones and credentials"),
    name: str | None = typer.Option(None, "--name", help="image name (default: <family>-<UTC time>)"),
) -> None:
    """Create a builder VM (Spot where the machine type has no on-demand), run the image recipe from images/ over
    SSH, and make an image from its disk. Workers start from a Deep Learning VM image (NVIDIA driver), so the
    baked image trains on first boot."""
    from orchestrator.control.images import bake_image  # lazy: the providers' image builders, this verb only

    try:
        bake_image(role=role, gpu=gpu, spec_path=spec, framework=framework, name=name,
                   say=lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True))
    except KeyboardInterrupt as exc:  # bake_image's cleanup has said whether the builder VM is gone
        what, code = ("SIGTERM", 143) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
        console.print(f"{what}: bake cancelled", markup=False, highlight=False)
        raise typer.Exit(code) from None
