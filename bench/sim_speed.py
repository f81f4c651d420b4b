"""Simulated jobs per minute: a 64k-step job on 4 spot K80 workers + 1 PS + chief (2019-02 prices).

Run: python bench/sim_speed.py [--runs N] [--seed S] [--steps N] [--no-shortcut]. It also reports how
many runs needed the event loop (the others had no revocation and are copied from one reference run).
"""

from __future__ import annotations

import argparse
import time

from orchestrator.costmodel.revocation.model import load_revocation_model
from orchestrator.sim.engine import SimCluster, SimSlot
from orchestrator.sim.montecarlo import run_monte_carlo


def bench_cluster(train_steps: int = 64000) -> SimCluster:
    slots = [
        SimSlot("ps-0", "ps", price_per_hour=0.143),
        SimSlot("chief-0", "chief", price_per_hour=0.143),
        *(
            SimSlot(
                f"worker-{i}",
                "worker",
                gpu="k80",
                zone="us-central1-c",
                spot=True,
                price_per_hour=0.256,
                on_demand_price_per_hour=0.723,
                step_rate=4.0,
                batch=128,
            )
            for i in range(4)
        ),
    ]
    return SimCluster(
        tuple(slots),
        train_steps=train_steps,
        ps_capacity_steps_per_s=40.0,
        preemptible=True,
        name="bench-4xk80",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=64000)
    ap.add_argument("--no-shortcut", action="store_true", help="send every run through the event loop")
    args = ap.parse_args()
    model = load_revocation_model()
    cluster = bench_cluster(args.steps)
    run_monte_carlo(cluster, 200, args.seed, model=model)  # warm-up (fits are cached already)
    t0 = time.perf_counter()
    mc = run_monte_carlo(cluster, args.runs, args.seed, model=model, shortcut=not args.no_shortcut)
    dt = time.perf_counter() - t0
    s = mc.summary()
    print(
        f"{args.runs} jobs in {dt:.2f} s = {args.runs / dt * 60:,.0f} jobs/min "
        f"({mc.simulated_runs} needed the event loop: {mc.simulated_runs / max(dt, 1e-9) * 60:,.0f}/min)"
    )
    print(
        f"time p50 {s['time_s']['p50'] / 3600:.2f} h, cost mean ${s['cost_usd']['mean']:.2f}, "
        f"revocations mean {s['revocations']['mean']:.2f}"
    )


if __name__ == "__main__":
    main()
