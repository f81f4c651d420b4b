"""Global resources of the GCE emulator: firewalls and images, with their global operations."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator_testing.gce_emulator_core import EmulatorCore
from orchestrator_testing.gce_emulator_model import (
    IMAGE_RE,
    NAME_RE,
    ApiError,
    InstanceRecord,
    build_firewall,
    invalid,
    link,
    not_found,
    not_ready,
)


class DiskOwners(EmulatorCore):
    """What the resources need of the state: the engine, and which instance owns a disk (images)."""

    def disk_owner(self, project: str, source_disk: str) -> InstanceRecord:
        raise NotImplementedError


class GlobalResources:
    """Firewalls and images of every project; shares the state's lock, ids and operations."""

    def __init__(self, core: DiskOwners) -> None:
        self.core = core
        self.firewalls: dict[tuple[str, str], dict[str, Any]] = {}
        self.images: dict[tuple[str, str], dict[str, Any]] = {}

    def _global_resource_op(
        self,
        project: str,
        kind: str,
        name: str,
        op_type: str,
        resource_id: str,
        request_id: str | None,
        delay: float | None = None,
        then: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        op = self.core.new_op(project, "global", op_type, link(project, f"global/{kind}/{name}"), resource_id)

        def done() -> None:
            if then is not None:
                then()
            self.core.finish_op(op)

        self.core.after(self.core.config.op_delay_s if delay is None else delay, done)
        return self.core.remember(project, request_id, op)

    def insert_firewall(self, project: str, body: dict[str, Any], request_id: str | None) -> dict[str, Any]:
        with self.core.lock:
            if (previous := self.core.dedupe(project, request_id)) is not None:
                return previous
            name = str(body.get("name", ""))
            if (project, name) in self.firewalls:
                raise ApiError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{project}/global/firewalls/{name}' already exists",
                )
            fw = build_firewall(project, name, body, self.core.new_id(), self.core.clock.timestamp())
            self.firewalls[(project, name)] = fw
            return self._global_resource_op(project, "firewalls", name, "insert", fw["id"], request_id)

    def update_firewall(
        self, project: str, name: str, body: dict[str, Any], request_id: str | None, patch: bool
    ) -> dict[str, Any]:
        with self.core.lock:
            if (previous := self.core.dedupe(project, request_id)) is not None:
                return previous
            old = self.get_firewall(project, name)
            merged = {**old, **body} if patch else {**body, "name": name}
            self.firewalls[(project, name)] = build_firewall(
                project, name, merged, old["id"], old["creationTimestamp"]
            )
            return self._global_resource_op(
                project, "firewalls", name, "patch" if patch else "update", old["id"], request_id
            )

    def get_firewall(self, project: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            fw = self.firewalls.get((project, name))
            if fw is None:
                raise not_found(f"projects/{project}/global/firewalls/{name}")
            return copy.deepcopy(fw)

    def delete_firewall(self, project: str, name: str, request_id: str | None) -> dict[str, Any]:
        with self.core.lock:
            if (previous := self.core.dedupe(project, request_id)) is not None:
                return previous
            fw = self.get_firewall(project, name)
            del self.firewalls[(project, name)]
            return self._global_resource_op(project, "firewalls", name, "delete", fw["id"], request_id)

    def list_firewalls(self, project: str, query: Mapping[str, str]) -> dict[str, Any]:
        with self.core.lock:
            items = [copy.deepcopy(fw) for (p, _), fw in sorted(self.firewalls.items()) if p == project]
            return self._list_body(project, "firewalls", "compute#firewallList", items, query)

    def _list_body(
        self, project: str, kind: str, list_kind: str, items: list[dict[str, Any]], query: Mapping[str, str]
    ) -> dict[str, Any]:
        page, token = self.core.page(items, query, f"{kind}/{project}/{query.get('filter', '')}")
        out: dict[str, Any] = {
            "kind": list_kind,
            "id": f"projects/{project}/global/{kind}",
            "selfLink": link(project, f"global/{kind}"),
        }
        if page:
            out["items"] = page
        if token:
            out["nextPageToken"] = token
        return out

    def resolve_image(self, project: str, source: str) -> dict[str, Any] | None:
        """The image a boot disk refers to; images of other (public) projects are taken on trust."""
        m = IMAGE_RE.match(source)
        if m is None:
            raise invalid("resource.disks[0].initializeParams.sourceImage", source)
        if (m["project"] or project) != project:
            return None
        if m["family"]:
            return self.image_from_family(project, m["name"])
        image = self.get_image(project, m["name"])
        if image["status"] != "READY":
            raise not_ready(f"projects/{project}/global/images/{m['name']}")
        return image

    def insert_image(
        self, project: str, body: dict[str, Any], request_id: str | None, force_create: bool
    ) -> dict[str, Any]:
        with self.core.lock:
            if (previous := self.core.dedupe(project, request_id)) is not None:
                return previous
            name = str(body.get("name", ""))
            if not NAME_RE.match(name):
                raise invalid("resource.name", name)
            if (project, name) in self.images:
                raise ApiError(
                    409,
                    "alreadyExists",
                    f"The resource 'projects/{project}/global/images/{name}' already exists",
                )
            disk_size, source_id = self._image_source(project, body, force_create)
            image = self._image_body(project, name, body, disk_size, source_id)
            self.images[(project, name)] = image

            def ready() -> None:
                image["status"] = "READY"

            return self._global_resource_op(
                project,
                "images",
                name,
                "insert",
                image["id"],
                request_id,
                delay=self.core.config.image_delay_s,
                then=ready,
            )

    def _image_source(self, project: str, body: dict[str, Any], force_create: bool) -> tuple[str, str]:
        """(disk size, source disk's instance id) of a valid image source; a disk must not be in use."""
        if body.get("sourceDisk"):
            inst = self.core.disk_owner(project, str(body["sourceDisk"]))
            if inst.status != "TERMINATED" and not force_create:
                raise ApiError(
                    400,
                    "resourceInUseByAnotherResource",
                    f"The disk resource '{inst.body['disks'][0]['source']}' is already being used by "
                    f"'{inst.path}'",
                )
            return str(inst.body["disks"][0]["diskSizeGb"]), str(inst.body["id"])
        if body.get("sourceImage"):
            self.resolve_image(project, str(body["sourceImage"]))
            return "10", ""
        raise invalid("resource.sourceDisk", "", "One of sourceDisk, sourceImage or rawDisk is required.")

    def _image_body(
        self, project: str, name: str, body: dict[str, Any], disk_size: str, source_id: str
    ) -> dict[str, Any]:
        image: dict[str, Any] = {
            "kind": "compute#image",
            "id": self.core.new_id(),
            "creationTimestamp": self.core.clock.timestamp(),
            "name": name,
            "description": body.get("description", ""),
            "sourceType": "RAW",
            "status": "PENDING",
            "archiveSizeBytes": "0",
            "diskSizeGb": disk_size,
            "labels": dict(body.get("labels") or {}),
            "storageLocations": ["us"],
            "architecture": "X86_64",
            "selfLink": link(project, f"global/images/{name}"),
        }
        for key in ("family", "sourceDisk", "sourceImage"):
            if body.get(key):
                image[key] = body[key]
        if source_id:
            image["sourceDiskId"] = source_id
        return image

    def get_image(self, project: str, name: str) -> dict[str, Any]:
        with self.core.lock:
            image = self.images.get((project, name))
            if image is None:
                raise not_found(f"projects/{project}/global/images/{name}")
            return copy.deepcopy(image)

    def image_from_family(self, project: str, family: str) -> dict[str, Any]:
        with self.core.lock:
            ready = [
                img
                for (p, _), img in self.images.items()
                if p == project and img.get("family") == family and img["status"] == "READY"
            ]
            if not ready:
                raise not_found(f"projects/{project}/global/images/family/{family}")
            return copy.deepcopy(max(ready, key=lambda img: int(img["id"])))

    def delete_image(self, project: str, name: str, request_id: str | None) -> dict[str, Any]:
        with self.core.lock:
            if (previous := self.core.dedupe(project, request_id)) is not None:
                return previous
            image = self.get_image(project, name)
            del self.images[(project, name)]
            return self._global_resource_op(project, "images", name, "delete", image["id"], request_id)

    def list_images(self, project: str, query: Mapping[str, str]) -> dict[str, Any]:
        with self.core.lock:
            items = [copy.deepcopy(img) for (p, _), img in sorted(self.images.items()) if p == project]
            return self._list_body(project, "images", "compute#imageList", items, query)
