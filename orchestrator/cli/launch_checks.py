"""Checks and displays of `launch` before anything is created: the secrets, the quota pre-check, the dry run's
table and the warnings of the spec's check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from orchestrator.cli.render import console, duration, err_console, money, table
from orchestrator.costmodel.launch_plan import LaunchPlan, plan_spec
from orchestrator.model.cloud_errors import ProviderError
from orchestrator.model.errors import UserError
from orchestrator.model.spec import JobSpec
from orchestrator.model.torch_spec import secret_problems
from orchestrator.providers.gce.quotas import Quotas, headroom, quota_needs, quota_problems, read_quotas

if TYPE_CHECKING:
    from orchestrator.control.validate import ValidatedLaunch

__all__ = ["check_quotas", "check_secrets", "headroom", "print_dry_run", "print_warnings", "quota_problems",
           "read_spec_quotas"]


def check_secrets(spec: JobSpec) -> None:
    """Every secret the spec names can be read here now, for `launch` and its dry run alike (a typo fails before
    anything is created; the values are read again when each task starts, and never stored)."""
    if problems := secret_problems(spec):
        raise UserError("; ".join(problems) + "; nothing was created")


def print_warnings(checked: ValidatedLaunch) -> None:
    """What the check allows but warns about (a price not verified, ssh open to the internet), on stderr: where
    stdout is the JSON of a dry run, or the launch's own display."""
    for warning in checked.result.warnings:
        err_console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)


def read_spec_quotas(spec: JobSpec, plan: LaunchPlan | None = None,
                     ) -> tuple[dict[str, dict[str, float]], dict[str, Quotas]] | None:
    """The quota needs per region of a spec whose provider reads quotas, and those regions' quotas (one read
    each); else None.

    A failure to *read* quotas (network, permissions) never blocks: it is one warning line, and the
    create-time QUOTA_EXCEEDED handling still applies.
    """
    from orchestrator.providers.registry import quota_source  # lazy: the provider backends (~20 ms)

    try:
        source = quota_source(spec)
        if source is None:
            return None
        needs = quota_needs(list((plan or plan_spec(spec)).slots))
        return needs, read_quotas(source, needs)
    except ProviderError as exc:
        err_console.print(f"[yellow]warning:[/yellow] could not read quotas, not pre-checked ({escape(str(exc))})",
                          soft_wrap=True)
        return None


def check_quotas(spec: JobSpec, plan: LaunchPlan | None = None) -> None:
    """Refuse, before anything is created, a cloud cluster that needs more quota than the project has free."""
    found = read_spec_quotas(spec, plan)
    if found is None:
        return
    problems = quota_problems(*found)
    if problems:
        raise UserError(f"not enough quota ({len(problems)} problem(s)):\n  " + "\n  ".join(problems))


def print_dry_run(checked: ValidatedLaunch) -> None:
    spec, launch_plan = checked.spec, checked.plan
    slots = launch_plan.slots
    rows = [[s.name, s.role.value, s.gpu or "—", s.machine_type, s.zone, "spot" if s.spot else "on-demand",
             s.batch or "", f"{s.price_per_hour:.4f}"] for s in slots]
    total = launch_plan.cluster_usd_per_hour
    console.print(f"[bold]{spec.name}[/bold]: provider {spec.provider.kind}, {spec.mode.value} training, "
                  f"{spec.training.train_steps} steps, storage {spec.storage}")
    if checked.planned is not None and checked.planned.chosen is not None:
        console.print(f"planner chose: {checked.planned.chosen.describe()}")
    console.print(table(f"would create {len(slots)} instances ({launch_plan.shape}), price book "
                        f"{launch_plan.price_book}",
                        ["slot", "role", "gpu", "machine", "zone", "billing", "batch", "$/h"], rows))
    console.print(f"hourly cost of the whole cluster: [bold]{money(total)}/h[/bold]")
    if (est := checked.estimate) is not None:
        console.print(f"predicted: {duration(est.time_s)} of training, {money(est.cost_usd)} "
                      "(cost model, with expected revocation overhead; distribution: `orchestrator simulate`)")
    for warning in checked.result.warnings:  # placeholder / unverified prices, a GPU's end of support ahead
        console.print(f"[bold red]warning:[/bold red] {escape(warning)}")
    for note in checked.notes:  # an ssh inventory's GPUs and prices, which the plan does not count
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    limits = [f"budget {money(spec.policy.budget_usd)}" if spec.policy.budget_usd else "",
              f"deadline {duration(spec.policy.deadline)}" if spec.policy.deadline else ""]
    if any(limits):
        console.print(f"within the policy: {', '.join(x for x in limits if x)}")
    found = read_spec_quotas(spec, launch_plan)
    if found is not None:
        console.print(table("quota headroom", ["region", "metric", "needs", "free", "limit", ""],
                            [[h.scope, h.metric, f"{h.need:g}", f"{h.free:g}", f"{h.limit:g}",
                              "ok" if h.ok else "[red]NOT ENOUGH[/red]"] for h in headroom(*found)]))
        if quota_problems(*found):
            console.print("[red]launch would be refused: not enough quota (see above)[/red]")
    console.print("[green]spec is valid; nothing was created (dry run)[/green]")
