"""Can the job's spot VMs be had now? GCE's capacity advisor, asked for the job's spot shapes.

The deadline policy (decide/deadline.py) decides every tick from whether spot can be had: the availability that the
NSDI'24 traces measured by asking the cloud for spot capacity. On GCE the daemon asks the Compute API's capacity
advisor the same question (``regions.advice.capacity``: AdviceClient.capacity in google-cloud-compute-v1beta, POST
compute/beta/projects/{project}/regions/{region}/advice/capacity; docs.cloud.google.com/compute/docs/instances/
view-vm-availability). The method is in Public Preview and answers for SPOT on the beta API: the v1 API lists it,
but Google's own skill for it (github.com/google/skills, "compute-spot-capacity-advice") says the v1 backend
rejects SPOT and to always use beta. Its obtainability score (0-1) for the job's spot VMs of one shape in their
zones is read as "can be had" from ``timings.SPOT_OBTAINABLE`` up, without a create that fails or a VM that boots.

A pass waits for the advisor only the first time it asks of a shape, and at most ``first_wait_s`` (so a job's
first create is already decided by it); an answer older than ``timings.DEADLINE_TICK_S`` is refreshed on this
object's own thread while the passes read the one before. Unanswered, failed or refused (the advisor's permission
missing, say), the answer is None (unknown): the daemon then reads spot from its creates and preemptions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from functools import partial

from orchestrator.costmodel.slots import Slot
from orchestrator.model import timings
from orchestrator.model.catalog import region_of
from orchestrator.model.cloud_errors import ProviderError
from orchestrator.providers.gce.api import GceApi
from orchestrator.providers.gce.compute_api import compute_v1beta, message
from orchestrator.providers.gce.requests import Body

log = logging.getLogger(__name__)
Score = float | None  # obtainability; None: not known


@dataclass(frozen=True)
class SpotShape:
    """Spot VMs of one shape that the job wants in one region: its machine type, the GPUs attached to it (an N1
    type; none for a type that bundles its GPUs, a3-highgpu-2g) and the zones the slots may use there."""

    region: str
    machine_type: str
    accelerator: str | None
    accelerator_count: int
    zones: tuple[str, ...]


def spot_shapes(slots: Iterable[Slot], bundled: Mapping[str, int], accelerator: Callable[[str], str]
                ) -> Counter[SpotShape]:
    """Shape -> how many of the job's spot slots want it (each in the region of its first zone)."""
    shapes: Counter[SpotShape] = Counter()
    for slot in (s for s in slots if s.spot):
        zones = slot.zones or (slot.zone,)
        region = region_of(zones[0])
        attached = slot.gpu is not None and slot.machine_type not in bundled
        shapes[SpotShape(region, slot.machine_type, accelerator(slot.gpu) if attached and slot.gpu else None,
                         slot.gpu_count if attached else 0,
                         tuple(z for z in zones if region_of(z) == region))] += 1
    return shapes


def zone_shapes(shape: SpotShape) -> list[SpotShape]:
    """The shape in each of its zones alone: what the daemon asks where the job may run spot in several zones."""
    return [replace(shape, zones=(zone,)) for zone in shape.zones]


def advice_request(shape: SpotShape, size: int) -> Body:
    """The ``advice.capacity`` body as the API's JSON (``compute_v1beta.CapacityAdviceRequest``)."""
    selection: Body = {"machineTypes": [shape.machine_type]}
    if shape.accelerator:
        selection["guestAccelerators"] = [{"acceleratorType": shape.accelerator,
                                           "acceleratorCount": shape.accelerator_count}]
    return {"size": size,
            "instanceProperties": {"scheduling": {"provisioningModel": "SPOT"}},
            "instanceFlexibilityPolicy": {"instanceSelections": {"spot": selection}},
            "distributionPolicy": {"targetShape": "ANY", "zones": [{"zone": f"zones/{z}"} for z in shape.zones]}}


class SpotAdvice:
    """The newest obtainability of each (shape, size) asked for, refreshed in the background."""

    def __init__(self, api: GceApi, bundled: Mapping[str, int], accelerator: Callable[[str], str], *,
                 max_age_s: float = timings.DEADLINE_TICK_S, first_wait_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.bundled, self.accelerator = api, bundled, accelerator
        self.max_age_s, self.first_wait_s, self.clock = max_age_s, first_wait_s, clock
        self._scores: dict[tuple[SpotShape, int], tuple[float, Score]] = {}
        self._asking: set[tuple[SpotShape, int]] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gce-advice")
        self._refused = False  # logged once

    def can_have(self, slots: Iterable[Slot]) -> bool | None:
        """Whether every spot shape of ``slots`` scores at least SPOT_OBTAINABLE; None while any is unknown (or
        the job has no spot slot)."""
        scores = self._score(list(spot_shapes(slots, self.bundled, self.accelerator).items()))
        if not scores or any(s is None for s in scores):
            return None
        return all(s is not None and s >= timings.SPOT_OBTAINABLE for s in scores)

    def by_zone(self, slots: Iterable[Slot]) -> dict[str, bool] | None:
        """For each zone of a spot shape that may use two or more, whether every such shape scores at least
        SPOT_OBTAINABLE in that zone alone (the zone the deadline policy runs spot in, ``decide.deadline_zones``);
        None while any is unknown, or where no shape has a choice of zone."""
        keys = [(per_zone, size) for shape, size in spot_shapes(slots, self.bundled, self.accelerator).items()
                if len(shape.zones) > 1 for per_zone in zone_shapes(shape)]
        scores = self._score(keys)
        if not keys or any(s is None for s in scores):
            return None
        answer: dict[str, bool] = {}
        for (shape, _), score in zip(keys, scores, strict=True):
            zone = shape.zones[0]
            answer[zone] = answer.get(zone, True) and score is not None and score >= timings.SPOT_OBTAINABLE
        return answer

    def count(self, slots: Iterable[Slot]) -> int | None:
        """How many more of ``slots``' spot VMs can be had now, where they are of one shape in one zone: the largest
        k such that the advisor scores k of them, and every smaller number, at least SPOT_OBTAINABLE (the elastic
        deadline policy shrinks onto them, ``decide.deadline_elastic``). All of them is asked first, so a pass with
        room for the lot makes one call; None while an answer needed is unknown, or for several shapes or zones."""
        shapes = spot_shapes(slots, self.bundled, self.accelerator)
        if len(shapes) != 1:
            return None
        ((shape, wanted),) = shapes.items()
        if len(shape.zones) != 1:
            return None
        (whole,) = self._score([(shape, wanted)])
        if whole is None or whole >= timings.SPOT_OBTAINABLE:
            return None if whole is None else wanted
        scores = self._score([(shape, size) for size in range(1, wanted)])
        if any(s is None for s in scores):
            return None
        return next((k for k, s in enumerate(scores) if s is not None and s < timings.SPOT_OBTAINABLE), wanted - 1)

    def _score(self, keys: list[tuple[SpotShape, int]]) -> list[Score]:
        """The newest score of each (shape, size); one never asked before is asked now, and the pass waits a
        moment (``first_wait_s``, once for them all) so the job's first decision already has it."""
        first = []
        with self._lock:
            for key in keys:
                at, _ = self._scores.get(key, (None, None))
                if (at is None or self.clock() - at >= self.max_age_s) and key not in self._asking:
                    self._asking.add(key)
                    asked = self._pool.submit(self._refresh, key)
                    if at is None:
                        first.append(asked)
        if first:
            wait(first, timeout=self.first_wait_s)
        with self._lock:
            return [self._scores.get(key, (None, None))[1] for key in keys]

    def _refresh(self, key: tuple[SpotShape, int]) -> None:
        score: Score = None
        try:
            score = self.ask(*key)
        except ProviderError as e:
            if not self._refused:
                log.warning("GCE capacity advice unavailable (spot is then read from creates and preemptions): %s",
                            e.message)
                self._refused = True
        except Exception:  # a pass must never fail on advice
            log.exception("GCE capacity advice failed")
        with self._lock:
            self._scores[key] = (self.clock(), score)
            self._asking.discard(key)

    def ask(self, shape: SpotShape, size: int) -> float:
        """One ``advice.capacity`` call (blocking): the first recommendation's obtainability (none: 0)."""
        answer = self.api.call(
            f"ask for spot capacity advice ({size} x {shape.machine_type} in {shape.region})",
            partial(self.api.advice.capacity, project=self.api.project, region=shape.region,
                    capacity_advice_request_resource=message(compute_v1beta.CapacityAdviceRequest,
                                                             advice_request(shape, size)), **self.api.kw()),
            attempts=self.api.retry.quota_read_attempts)
        recommendations = list(answer.recommendations)
        return float(recommendations[0].scores.obtainability) if recommendations else 0.0

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
