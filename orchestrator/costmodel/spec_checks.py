"""The checks of a spec that need the cost model: does each pinned group's batch fit its GPU's memory?

Here, above the spec, so that ``orchestrator.model.spec`` never imports the cost model (the spec is read and
checked against the catalog first; the cost model judges what it asks for after). ``planning/judge.py`` runs
this for ``plan``, ``launch`` and the dry run, before any planning, with the same one-line field errors.
"""

from __future__ import annotations

from orchestrator.costmodel.batches import memory_params
from orchestrator.costmodel.memory import max_batch
from orchestrator.costmodel.profiles import UnknownModelError
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.spec import FieldError, JobSpec


def batch_fit_errors(spec: JobSpec, catalog: Catalog | None = None) -> list[FieldError]:
    """A field error for every pinned worker group whose per-worker batch does not fit its GPU's memory."""
    cluster, training = spec.cluster, spec.training
    if cluster is None:
        return []  # a searched cluster: the planner keeps each candidate's batches under the memory caps
    cat = catalog or load_catalog()
    errors: list[FieldError] = []
    for i, group in enumerate(cluster.workers):
        batch, gpu = group.batch or training.batch, cat.gpus.get(group.gpu)
        if batch is None or gpu is None:  # an unknown GPU is the spec's own error
            continue
        try:
            cap = max_batch(training.profile_name, gpu.key, cat, memory_params(spec))
        except UnknownModelError:  # training.model.torch not profiled yet: plan / launch profile it first
            return errors
        if batch > cap:
            errors.append(FieldError(
                path=f"cluster.workers[{i}].batch" if group.batch else "training.batch_per_worker",
                message=f"batch {batch} does not fit a {gpu.key}'s {gpu.memory_gb:g} GB "
                        f"for {training.profile_name}; at most {cap}"))
    return errors
