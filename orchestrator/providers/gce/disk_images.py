"""Boot images made from a VM's disk (``orchestrator image bake``): stop the VM, image its boot disk."""

from __future__ import annotations

import logging
import uuid
from functools import partial

from google.api_core import exceptions as gexc

from orchestrator.model.cloud_errors import InvalidRequestError
from orchestrator.model.instances import LABEL_MANAGED
from orchestrator.providers.gce.api import GceApi
from orchestrator.providers.gce.compute_api import compute_v1

log = logging.getLogger(__name__)


class DiskImages:
    """The project's images, through one ``GceApi``."""

    def __init__(self, api: GceApi) -> None:
        self.api = api

    def create(self, name: str, source_instance: str, zone: str, family: str | None = None) -> None:
        """Image the instance's boot disk. A running source instance is stopped first: an image of a live
        disk may be inconsistent, and GCE refuses it without forceCreate."""
        api, what = self.api, f"create image {name} from {source_instance}"
        image = compute_v1.Image(name=name, source_disk=self._stopped_boot_disk(source_instance, zone, what),
                                 labels={LABEL_MANAGED: "1"})
        if family:
            image.family = family
        req = compute_v1.InsertImageRequest(project=api.project, image_resource=image, request_id=str(uuid.uuid4()))
        try:
            op = api.call(what, partial(api.images.insert_unary, request=req, **api.kw()), passthrough=(gexc.Conflict,))
        except gexc.Conflict:
            log.info("image %s already exists", name)
            return
        api.finish(op, what)

    def _stopped_boot_disk(self, source_instance: str, zone: str, what: str) -> str:
        """The instance's boot disk, once the instance is stopped (stopping it if it runs)."""
        api = self.api
        try:
            inst = api.call(what, partial(api.instances.get, project=api.project, zone=zone, instance=source_instance,
                                          **api.kw()), zone=zone, passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            raise InvalidRequestError(f"{what}: no instance {source_instance} in {zone}", zone=zone) from None
        boot = next((d for d in inst.disks if d.boot), None)
        if boot is None:
            raise InvalidRequestError(f"{what}: the instance has no boot disk", zone=zone)
        if inst.status not in ("TERMINATED", "SUSPENDED"):
            log.info("stopping %s before imaging its disk", source_instance)
            stop = compute_v1.StopInstanceRequest(project=api.project, zone=zone, instance=source_instance,
                                                  request_id=str(uuid.uuid4()))
            op = api.call(what, partial(api.instances.stop_unary, request=stop, **api.kw()), zone=zone)
            api.finish(op, what, zone=zone)
        return str(boot.source)
