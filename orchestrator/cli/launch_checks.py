"""What `launch` and its dry run show of an admitted spec before anything is created: the warnings, the notes,
the dry run's table or its provider's requests, and the quota headroom. Rendering only: planning.admission
decided."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.markup import escape

from orchestrator.cli.render import console, duration, err_console, money, table
from orchestrator.planning.admission import Admission
from orchestrator.planning.quotas import QuotaRead

__all__ = ["print_dry_run", "print_notes", "print_warnings"]


def print_warnings(admitted: Admission) -> None:
    """What the check allows but warns about (a price not verified, ssh open to the internet), on stderr: where
    stdout is the JSON of a dry run, or the launch's own display."""
    for warning in (*admitted.warnings, *admitted.judged.result.warnings):
        err_console.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)


def print_notes(admitted: Admission) -> None:
    """A launch's warnings, the host's load beside an idle host's figures, an inventory's notes (stderr)."""
    print_warnings(admitted)
    if (note := load_note(admitted)) is not None:  # local workers share the cores with what else runs here
        err_console.print(note, highlight=False, markup=False)
    for note in admitted.judged.notes:  # an ssh inventory's GPUs and prices, which the plan does not count
        err_console.print(f"note: {note}", highlight=False, markup=False)


def load_note(admitted: Admission) -> str | None:
    """The load measured at launch and the predicted run under it beside an idle host's (one planner run)."""
    load, idle, now = admitted.load, admitted.judged.idle, admitted.judged.estimate
    if load is None:
        return None
    if idle is None or now is None or not (idle.time_s < float("inf") and now.time_s < float("inf")):
        return f"host load at launch: {load.describe()}"
    return (f"host load at launch: {load.describe()}; predicted {now.time_s:.0f} s of run under it "
            f"({now.time_s / idle.time_s - 1:+.0%} over {idle.time_s:.0f} s on an idle host)")


def print_dry_run(admitted: Admission) -> None:
    """The provider's own dry run (the exact requests a launch would send, as JSON), else the generic table."""
    from orchestrator.providers.registry import dry_run_for  # lazy: the provider backends

    spec, plan = admitted.spec, admitted.judged.plan
    if (provider_dry_run := dry_run_for(spec)) is not None:
        print_warnings(admitted)
        out = provider_dry_run(spec, plan)
        if (found := admitted.quotas) is not None and found.unread is None:  # regions.get / projects.get: reads
            out["quota_headroom"] = [{"scope": h.scope, "metric": h.metric, "needs": h.need, "free": h.free,
                                      "limit": h.limit, "ok": h.ok} for h in found.headroom]
            out["launch_would_be_refused"] = bool(found.problems)
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    _print_table(admitted)


def _print_table(admitted: Admission) -> None:
    judged = admitted.judged
    spec, launch_plan = judged.spec, judged.plan
    slots = launch_plan.slots
    rows = [[s.name, s.role.value, s.gpu or "—", s.machine_type, s.zone, "spot" if s.spot else "on-demand",
             s.batch or "", f"{s.price_per_hour:.4f}"] for s in slots]
    console.print(f"[bold]{spec.name}[/bold]: provider {spec.provider.kind}, {spec.mode.value} training, "
                  f"{spec.training.train_steps} steps, storage {spec.storage}")
    if judged.planned is not None and judged.planned.chosen is not None:
        console.print(f"planner chose: {judged.planned.chosen.describe()}")
    console.print(table(f"would create {len(slots)} instances ({launch_plan.shape}), price book "
                        f"{launch_plan.price_book}",
                        ["slot", "role", "gpu", "machine", "zone", "billing", "batch", "$/h"], rows))
    console.print(f"hourly cost of the whole cluster: [bold]{money(launch_plan.cluster_usd_per_hour)}/h[/bold]")
    if (est := judged.estimate) is not None:
        console.print(f"predicted: {duration(est.time_s)} of training, {money(est.cost_usd)} "
                      "(cost model, with expected revocation overhead; distribution: `orchestrator simulate`)")
    for warning in (*admitted.warnings, *judged.result.warnings):  # unverified prices, a GPU's end of support
        console.print(f"[bold red]warning:[/bold red] {escape(warning)}")
    for note in judged.notes:  # an ssh inventory's GPUs and prices, which the plan does not count
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    limits = [f"budget {money(spec.policy.budget_usd)}" if spec.policy.budget_usd else "",
              f"deadline {duration(spec.policy.deadline)}" if spec.policy.deadline else ""]
    if any(limits):
        console.print(f"within the policy: {', '.join(x for x in limits if x)}")
    _print_quotas(admitted.quotas)
    console.print("[green]spec is valid; nothing was created (dry run)[/green]")


def _print_quotas(found: QuotaRead | None) -> None:
    if found is None or found.unread is not None:
        return
    rows: list[list[Any]] = [[h.scope, h.metric, f"{h.need:g}", f"{h.free:g}", f"{h.limit:g}",
                              "ok" if h.ok else "[red]NOT ENOUGH[/red]"] for h in found.headroom]
    console.print(table("quota headroom", ["region", "metric", "needs", "free", "limit", ""], rows))
    if found.problems:
        console.print("[red]launch would be refused: not enough quota (see above)[/red]")
