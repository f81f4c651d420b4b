"""Admitting a spec: the one entry `plan`, `launch` and its dry run call, in one order. Read the spec file once,
profile the model it names (its checks need the profile), check the spec, check the provider's set-up once (a
launch and its dry run), choose the calibration by one rule, measure the host's load (a local spec's `plan` and
`launch`), plan once (``judge``), then the secrets and the quota read. What comes back is every finding; the CLI
renders it and decides nothing. A refusal is a ``UserError`` (``PlanRefused`` carries the plan it judged)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.costmodel import DEFAULT_CALIBRATION, Calibration
from orchestrator.costmodel.batches import job_precision, job_runtime
from orchestrator.costmodel.interval import plan_interval
from orchestrator.model.errors import UserError
from orchestrator.model.spec import JobSpec, read_spec_document, spec_from_document
from orchestrator.model.specfile import short
from orchestrator.model.torch_spec import secret_problems
from orchestrator.planning.calibration import planning_calibration, resolve_calibration
from orchestrator.planning.host_load import HostLoad, host_load, with_load
from orchestrator.planning.judge import Judged, PlanRefused, judge
from orchestrator.planning.quotas import QuotaRead, read_spec_quotas, refuse_short_quota
from orchestrator.planning.step_sources import StepSource, measured_interval, step_sources

if TYPE_CHECKING:
    from orchestrator.planning.outlook import DeadlineOutlook

Verb = Literal["plan", "launch", "dry-run", "probe"]  # probe: creates probe jobs, as launch, and needs the interval


@dataclass(frozen=True)
class AdmitOptions:
    verb: Verb
    calibration: str | None = None  # `plan --calibration`: an ID in the results DB or a JSON file
    host_load: str = "measure"  # `plan --host-load`: measure, or a number of other runnable processes
    # Profiles the model a spec document names (the CLI's, which may run the profiler; the daemon's layers never
    # import it): (document, the spec's folder) -> None, raising UserError.
    profile: Callable[[Any, Path], None] | None = None


@dataclass(frozen=True)
class Admission:
    """An admitted spec: the one plan, and everything found on the way, for the verb to render."""

    judged: Judged
    calibration: Calibration | None  # what the plan used (a local spec's with the host's load in it)
    load: HostLoad | None  # the host's other work (a local spec's plan and launch)
    warnings: tuple[str, ...] = ()  # found on the way, besides the plan's own
    quotas: QuotaRead | None = None  # a cloud's quota read (launch, dry run)
    interval: dict[str, Any] | None = None  # the prediction interval (plan)
    outlook: DeadlineOutlook | None = None  # each deadline policy on real traces (plan of a deadline spec)
    sources: tuple[StepSource, ...] = ()  # each chosen worker group's step: measured by a probe, or predicted

    @property
    def spec(self) -> JobSpec:
        return self.judged.spec


def admit(spec_path: Path, options: AdmitOptions) -> Admission:
    """Admit a spec file for a verb; raises ``UserError`` (``SpecError``, ``PlanRefused``), creates nothing."""
    spec = read_spec(spec_path, options.profile)
    if options.verb != "plan":  # `plan` is the cost model's answer and needs no cloud account
        from orchestrator.providers.registry import check_setup  # lazy: the providers' set-up, not for `plan`

        check_setup(spec, probe=options.verb in ("launch", "probe"))  # the dry run sends nothing
    base, warnings = _calibration(spec, options)
    load = _host_load(spec, options)
    calibration = with_load(base, load) if load is not None else base
    idle = None
    if load is not None:  # an idle host's figures from the same planner run, beside the loaded ones
        idle = calibration if load.background == 0 else with_load(base, replace(load, background=0.0))
    try:
        judged = judge(spec, short(str(spec_path), 200), calibration, idle)
    except PlanRefused as refused:
        refused.warnings = warnings  # `plan` shows them with the refused plan
        raise
    if options.verb != "plan" and (problems := secret_problems(judged.spec)):  # before anything is created
        raise UserError("; ".join(problems) + "; nothing was created")
    if options.verb in ("launch", "dry-run"):
        quotas = read_spec_quotas(judged.spec, judged.plan)  # regions.get / projects.get: reads, not requests
        if quotas is not None and quotas.unread is not None:
            warnings = (*warnings, quotas.unread)
        if options.verb == "launch":
            refuse_short_quota(quotas)
            # stored with the job: the daemon holds each worker's measured pace to its group's interval
            interval, sources = _interval(judged, calibration)
            return Admission(judged, calibration, load, warnings, quotas, interval, None, sources)
        return Admission(judged, calibration, load, warnings, quotas)
    interval, sources = _interval(judged, calibration)
    if options.verb == "probe":
        return Admission(judged, calibration, load, warnings, None, interval, None, sources)
    from orchestrator.planning.outlook import deadline_outlook  # lazy: the availability simulator, deadline specs

    # on_revocation: deadline: each policy on real traces, also with the work at the interval's slow end
    outlook = deadline_outlook(judged.spec, interval["relative"] if interval is not None else None, calibration)
    return Admission(judged, calibration, load, warnings, None, interval, outlook, sources)


def read_spec(spec_path: Path, profile: Callable[[Any, Path], None] | None = None) -> JobSpec:
    """The spec file read once: its document, the model it names profiled (or taken from the cache), checked."""
    document = read_spec_document(spec_path)
    if profile is not None:  # the factory runs in a child process without the controller's secrets
        profile(document, spec_path.resolve().parent)
    return spec_from_document(document, spec_path)


def _interval(judged: Judged, calibration: Calibration | None
              ) -> tuple[dict[str, Any] | None, tuple[StepSource, ...]]:
    """The plan's prediction interval and each chosen worker group's step with its interval."""
    interval = plan_interval(judged.result, calibration or DEFAULT_CALIBRATION, job_runtime(judged.spec.training),
                             job_precision(judged.spec.training))
    sources = step_sources(judged.spec, judged.result, calibration, interval["relative"] if interval else 0.0)
    return measured_interval(interval, sources, judged.result), sources  # every group probed: the probes' spread


def _calibration(spec: JobSpec, options: AdmitOptions) -> tuple[Calibration | None, tuple[str, ...]]:
    """The one rule: the named calibration, else the newest stored one the spec's GPUs may read, else the
    shipped one; a calibration fitted on emulated GPUs never plans real ones."""
    named = options.calibration
    base = resolve_calibration(named) if named is not None else planning_calibration(spec)
    if base is not None and base.emulated and not spec.provider.emulates_gpus:
        return None, (f"calibration {base.name} was fitted on emulated (local) GPUs; planning real GPUs with the "
                      "shipped one (data/calibration.json) instead",)
    return base, ()


def _host_load(spec: JobSpec, options: AdmitOptions) -> HostLoad | None:
    """Local workers share this host's cores with whatever else runs on it: `plan` counts the load now. A launch
    and its dry run plan on the calibration's own host, as before: whether a spec is admitted never depends on
    the host's momentary load (CI 2026-12-02: a loaded host pushed a launch past its deadline)."""
    if not spec.provider.emulates_gpus or options.verb != "plan":
        return None
    return host_load(options.host_load.strip())


def judge_file(spec_path: Path, calibration: Calibration | None = None) -> Judged:
    """The spec file read and judged with a given calibration, no set-up, load or secrets (tests, bench/)."""
    return judge(read_spec(spec_path), short(str(spec_path), 200), calibration)
