"""The controller's watch loop at scale: 100 jobs x 10 instances against the Compute API emulator.

Every job is recorded in a throwaway SQLite DB as PROVISIONING with its 10 instances PROVISIONING, and
every VM exists in the emulator with a long boot delay (PROVISIONING / STAGING, observed as pending), so
a pass observes and reconciles everything but has nothing to do: no create, no SSH. Prints, per pass,
the provider API calls by endpoint (expected: one instances.aggregatedList per page of 500 -> 2) and the
pass time, then the time of the pure ``reconcile()`` over the 100 jobs alone (target: under 1 s).

    python bench/watch_scale.py [--jobs 100] [--per-job 10] [--passes 3] [--page-size 500]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROJECT = "bench-project"
ZONE = "us-central1-c"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"


def spec_yaml(url: str, storage: Path, workers: int) -> str:
    return f"""name: watch
provider: {{kind: gce, project: {PROJECT}, zones: [{ZONE}], api_endpoint: "{url}"}}
storage: {storage}
training: {{job: command, command: "sleep 1", train_steps: 100}}
cluster:
  parameter_servers: {{count: 1, machine_type: n1-standard-4, zone: {ZONE}}}
  chief: {{machine_type: n1-standard-4, zone: {ZONE}}}
  workers: [{{gpu: t4, count: {workers}, spot: true, zone: {ZONE}}}]
policy: {{on_revocation: replace, max_replacements: 4}}
pricing: {{book: 2026-11}}
"""


def vm_body(name: str, labels: dict[str, str], machine_type: str, gpu: str | None,
            spot: bool) -> dict[str, Any]:
    """An instances.insert body like the one GceProvider sends (only what the emulator needs)."""
    scheduling: dict[str, Any] = {"onHostMaintenance": "TERMINATE", "automaticRestart": not spot}
    if spot:
        scheduling.update(provisioningModel="SPOT", instanceTerminationAction="STOP")
    body: dict[str, Any] = {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/{machine_type}",
        "labels": labels,
        "scheduling": scheduling,
        "networkInterfaces": [{"network": "global/networks/default",
                               "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": {"sourceImage": IMAGE}}],
    }
    if gpu:
        body["guestAccelerators"] = [{"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-{gpu}",
                                      "acceleratorCount": 1}]
    return body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--per-job", type=int, default=10, help="instances per job: 1 PS + 1 chief + workers")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--page-size", type=int, default=500)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    os.environ["ORCHESTRATOR_HOME"] = str(tmp / "home")
    os.environ["ORCHESTRATOR_DB_URL"] = f"sqlite:///{tmp}/watch.db"
    sys.path.insert(0, str(REPO))

    import yaml
    from sqlalchemy import select

    from orchestrator.control.driver import job_spec, job_view, run_pass
    from orchestrator.control.launcher import create_job
    from orchestrator.costmodel.slots import expand
    from orchestrator.decide.reconcile import reconcile
    from orchestrator.decide.state import Observation
    from orchestrator.model.instances import InstanceRequest, ObservedInstance, instance_name
    from orchestrator.model.spec import validate_spec
    from orchestrator.model.status import InstanceStatus, JobStatus
    from orchestrator.providers.gce.provider import GceProvider
    from orchestrator.providers.registry import backend_for
    from orchestrator.store import queries
    from orchestrator.store.db import open_session
    from orchestrator.store.models import Instance, Job
    from orchestrator_testing.gce_emulator import GceEmulator

    emu = GceEmulator({"boot_delay_s": 10 * 86400.0})  # every VM stays PROVISIONING / STAGING
    url = emu.start()
    try:
        spec = validate_spec(yaml.safe_load(spec_yaml(url, tmp / "runs", args.per_job - 2)))
        backend = backend_for(spec)
        assert isinstance(backend.provider, GceProvider)
        backend.provider.page_size = args.page_size
        t0 = time.perf_counter()
        with open_session() as session:
            for _ in range(args.jobs):
                job = create_job(session, spec)
                queries.switch_status(session, job, JobStatus.PROVISIONING, "bench")
                now = time.time()
                for slot in expand(spec, book=job.price_book):
                    name = instance_name(job.id, slot.role, slot.index, 0)
                    session.add(Instance(
                        job_id=job.id, name=name, role=slot.role.value, slot_index=slot.index, generation=0,
                        gpu=slot.gpu, machine_type=slot.machine_type, zone=ZONE, spot=slot.spot,
                        price_per_hour=slot.price(slot.spot), batch=slot.batch, port=2222,
                        status=InstanceStatus.PROVISIONING.value, status_reason="bench", requested_at=now,
                        updated_at=now))
                    labels = InstanceRequest(name=name, job_id=job.id, role=slot.role, index=slot.index,
                                             generation=0, zone=ZONE, machine_type=slot.machine_type,
                                             spot=slot.spot).all_labels()
                    body = vm_body(name, labels, slot.machine_type, slot.gpu, slot.spot)
                    emu.state.insert_instance(PROJECT, ZONE, body, None)  # in-process: no HTTP, no waiting
                session.commit()
        snap = emu.snapshot()
        print(f"setup: {args.jobs} jobs, {sum(snap['instances_by_status'].values())} VMs "
              f"{dict(snap['instances_by_status'])}, page size {args.page_size} "
              f"({time.perf_counter() - t0:.1f}s)")

        with open_session() as session:
            for k in range(1, args.passes + 1):
                emu.reset_calls()
                t = time.perf_counter()
                driven = run_pass(session, "bench")
                elapsed = time.perf_counter() - t
                session.expire_all()
                calls = dict(sorted(emu.snapshot()["calls"].items()))
                changed = session.query(Instance).filter(
                    Instance.status != InstanceStatus.PROVISIONING.value).count()
                print(f"pass {k}: {len(driven)} jobs in {elapsed:.3f}s; API calls {calls}; "
                      f"instances no longer provisioning: {changed}")

            # The pieces of a pass: one list, then per job its view; reconcile() alone.
            jobs = list(session.scalars(select(Job)))
            t = time.perf_counter()
            observed = backend.provider.list([j.id for j in jobs])
            list_s = time.perf_counter() - t
            by_job: dict[str, dict[str, ObservedInstance]] = defaultdict(dict)
            for o in observed:
                by_job[o.job_id][o.name] = o
            now = time.time()
            t = time.perf_counter()
            views = []
            for job in jobs:
                js = job_spec(job.spec_yaml)
                views.append(job_view(session, job, js, expand(js, book=job.price_book), now,
                                      backend.stable_addresses))
            view_s = time.perf_counter() - t
            obs = [Observation(instances=by_job[v.id], procs={}) for v in views]
            rounds = []
            actions: Counter[str] = Counter()
            for _ in range(5):
                t = time.perf_counter()
                out = [reconcile(v, o, now) for v, o in zip(views, obs, strict=True)]
                rounds.append(time.perf_counter() - t)
            for acts in out:
                actions.update(type(a).__name__ for a in acts)
            print(f"provider.list over {len(jobs)} jobs: {len(observed)} instances in {list_s:.3f}s")
            print(f"job views (DB: instances + cost per job): {view_s:.3f}s")
            print(f"reconcile() over {len(views)} jobs ({sum(len(v.instances) for v in views)} instances): "
                  f"median {statistics.median(rounds) * 1000:.1f} ms, max {max(rounds) * 1000:.1f} ms "
                  f"(target < 1000 ms); actions: {dict(actions) or 'none'}")
    finally:
        emu.stop()


if __name__ == "__main__":
    main()
