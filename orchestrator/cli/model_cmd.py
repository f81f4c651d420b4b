"""`orchestrator model ...`: the verbs and their options. What they do is in cli/model_impl.py, imported when a
verb runs, so `--help` and every other verb start without the cost model."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.listing import format_option
from orchestrator.cli.options import precision_name, runtime_name

app = typer.Typer(no_args_is_help=True, help="Cost model: profile, calibrate, predict, validate.")


@app.command("calibrate")
def calibrate(
    file: Path | None = typer.Argument(
        None, help="measurement CSV (or folder of CSVs, e.g. data/measurements): gpu,runtime,model,batch,step_ms,..."
    ),
    measurements: Path | None = typer.Option(
        None, "--measurements", help="CSV: model,gpu,batch,step_time_s[,...]"
    ),
    from_db: bool = typer.Option(
        False, "--from-db", help="use the step times finished jobs logged in the DB"
    ),
    out: Path | None = typer.Option(None, "--out", help="write the calibration to this JSON file"),
    name: str | None = typer.Option(
        None, "--name", help="name of the calibration (default: calibration-<date>)"
    ),
    save: bool = typer.Option(False, "--save", help="store it in the results DB (always with --from-db)"),
) -> None:
    """Fit the step-time model (per GPU x runtime x model) and network constants to measured points."""
    from orchestrator.cli import model_impl  # lazy: the cost model

    model_impl.calibrate(file, measurements, from_db, out, name, save)


@app.command("predict")
def predict(
    model: str | None = typer.Option(None, "--model", help="a built-in model; `model profile` lists them"),
    gpu: str = typer.Option(..., "--gpu", help="GPU key (k80, v100, a100, h100, ...; data/gpu_arch.csv)"),
    batch: int = typer.Option(..., "--batch", min=1, help="per-worker batch"),
    calibration: str | None = typer.Option(
        None, "--calibration", help="calibration ID (DB) or JSON file (default: the one `plan` reads for a cloud: "
        "the newest stored of real GPUs, else the shipped one)"),
    runtime: str | None = typer.Option(
        None, "--runtime", callback=runtime_name,
        help="tf1-graph, keras-xla, pytorch-eager, torch-compile (default: tf1-graph; "
        "pytorch-eager with --torch)"),
    precision: str = typer.Option("fp32", "--precision", callback=precision_name,
                                  help="fp32, tf32, amp (fp16 mixed) or bf16"),
    torch_ref: str | None = typer.Option(
        None, "--torch", help="your PyTorch model, MODULE:FACTORY (FACTORY(batch) -> (nn.Module, inputs))"),
    measurements: Path | None = typer.Option(
        None, "--measurements", help="with --torch: CSV of measured steps (data/measurements columns; model = "
        "MODULE:FACTORY)"),
    json_out: bool = typer.Option(False, "--json", help="same as --format json"),
    fmt: str = format_option(),
) -> None:
    """Predict one worker's compute step time (and whether the batch fits the GPU's memory)."""
    from orchestrator.cli import model_impl  # lazy: the cost model

    model_impl.predict(model, gpu, batch, calibration, runtime, precision, torch_ref, measurements, json_out, fmt)


@app.command("validate")
def validate(
    measurements: Path | None = typer.Option(None, "--measurements", help="CSV (default: the results DB)"),
    json_out: bool = typer.Option(False, "--json", help="same as --format json"),
    fmt: str = format_option("csv: one row a held-out GPU"),
) -> None:
    """Leave-one-GPU-out validation: fit without each GPU type, predict it from its specs, report the MAPE."""
    from orchestrator.cli import model_impl  # lazy: the cost model

    model_impl.validate(measurements, json_out, fmt)


@app.command("profile")
def profile(
    model: str | None = typer.Option(
        None, "--model", help="per-layer table of this model (default: a summary)"
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="also show per-layer step time on this GPU"),
    batch: int = typer.Option(128, "--batch", min=1, help="batch for the per-layer times"),
    torch_ref: str | None = typer.Option(
        None, "--torch", help="profile your PyTorch model: MODULE:FACTORY (a file path.py:build, pkg.mod:build or "
        "torchvision:resnet50); FACTORY(batch) -> (nn.Module, tuple of inputs); no weights are allocated"),
    precision: str = typer.Option("fp32", "--precision", callback=precision_name,
                                  help="with --torch --gpu: fp32, tf32, amp or bf16"),
    no_cache: bool = typer.Option(False, "--no-cache", help="with --torch: profile again even if cached"),
    json_out: bool = typer.Option(False, "--json", help="with --torch: the profile as JSON (= --format json)"),
    fmt: str = format_option("json / csv: one record a model, or a layer with --model"),
) -> None:
    """Per-layer FLOPs, bytes, parameters and activation memory of a model (analytic, or --torch: measured)."""
    from orchestrator.cli import model_impl  # lazy: the cost model

    model_impl.profile(model, gpu, batch, torch_ref, precision, no_cache, json_out, fmt)
