"""The project's VMs: insert and delete requests (one requestId each), the labelled listing, guest attributes."""

from __future__ import annotations

import logging
from collections.abc import Collection
from functools import partial

from google.api_core import exceptions as gexc

from orchestrator.model.cloud_errors import ProviderError, TransientError
from orchestrator.model.instances import LABEL_JOB, LABEL_MANAGED, InstanceRequest, ObservedInstance
from orchestrator.providers.gce.api import GceApi
from orchestrator.providers.gce.compute_api import compute_v1, message
from orchestrator.providers.gce.observe import observe
from orchestrator.providers.gce.requests import GceRequestSettings, instance_resource
from orchestrator.transport.host_keys import HostKeyPending

log = logging.getLogger(__name__)


class Instances:
    """Sends the VM requests of one provider (its request settings) and reads its VMs back."""

    def __init__(self, api: GceApi, settings: GceRequestSettings, *, use_internal_ip: bool, page_size: int) -> None:
        self.api, self.settings = api, settings
        self.use_internal_ip, self.page_size = use_internal_ip, page_size
        self.stopped_at: dict[str, float] = {}  # VM -> lastStopTimestamp, while listings see it TERMINATED

    def send_insert(self, request: InstanceRequest, request_id: str) -> compute_v1.Operation | None:
        """Send the insert (bounded retries, one requestId); its operation, or None if the VM exists.
        The body comes from ``requests.instance_resource``: the same builder for jobs, dry runs and bakes."""
        api = self.api
        insert = compute_v1.InsertInstanceRequest(project=api.project, zone=request.zone, request_id=request_id,
                                                  instance_resource=message(compute_v1.Instance,
                                                                            instance_resource(request, self.settings)))
        log.info("creating %s (%s, %s%s) in %s", request.name, request.machine_type,
                 f"{request.gpu_count}x{request.gpu}, " if request.gpu else "",
                 "spot" if request.spot else "on-demand", request.zone)
        try:
            return api.call(f"create {request.name} in {request.zone}",
                            partial(api.instances.insert_unary, request=insert, **api.kw()),
                            zone=request.zone, passthrough=(gexc.Conflict,))
        except gexc.Conflict:
            log.info("%s already exists; nothing to do", request.name)
            return None

    def send_delete(self, name: str, zone: str, request_id: str) -> compute_v1.Operation | None:
        """Send the delete (bounded retries, one requestId); its operation, or None if the VM is gone."""
        api = self.api
        req = compute_v1.DeleteInstanceRequest(project=api.project, zone=zone, instance=name, request_id=request_id)
        try:
            return api.call(f"delete {name} in {zone}", partial(api.instances.delete_unary, request=req, **api.kw()),
                            zone=zone, passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            return None

    def observed(self, job_ids: Collection[str] | None = None) -> list[ObservedInstance]:
        """Every managed VM (of these jobs), one aggregated call per page; a partial view is refused."""
        jobs = None if job_ids is None else set(job_ids)
        if jobs is not None and not jobs:
            return []
        expression = f'labels.{LABEL_MANAGED} = "1"'
        if jobs is not None and len(jobs) == 1:
            expression = f'({expression}) AND (labels.{LABEL_JOB} = "{next(iter(jobs))}")'
        observed: list[ObservedInstance] = []
        token = ""
        while True:
            req = compute_v1.AggregatedListInstancesRequest(project=self.api.project, filter=expression,
                                                            max_results=self.page_size, page_token=token)
            page = self.api.call("list instances", partial(self._page, req))
            if page.unreachables:
                # A partial view would make missing VMs look deleted (and get recreated): refuse it.
                raise TransientError(f"list instances: zones unreachable: {', '.join(page.unreachables)}")
            for scoped in page.items.values():
                observed += [o for o in map(self._observe, scoped.instances)
                             if o is not None and (jobs is None or o.job_id in jobs)]
            token = page.next_page_token
            if not token:
                return observed

    def _page(self, req: compute_v1.AggregatedListInstancesRequest) -> compute_v1.InstanceAggregatedList:
        pager = self.api.instances.aggregated_list(request=req, **self.api.kw())
        return next(iter(pager.pages))  # the first page is already fetched; no further call

    def _observe(self, inst: compute_v1.Instance) -> ObservedInstance | None:
        observed, stopped = observe(inst, self.use_internal_ip)
        if stopped is not None:  # it stopped by itself (we delete, never stop): the bill ends there
            self.stopped_at[inst.name] = stopped
        return observed

    def host_keys(self, name: str, zone: str) -> list[str]:
        """``TYPE BASE64`` lines of the SSH host keys VM ``name`` published in its guest attributes (empty
        until its guest agent has); raises HostKeyPending (a transport error, so connecting retries) when the
        API fails."""
        api = self.api
        req = compute_v1.GetGuestAttributesInstanceRequest(project=api.project, zone=zone, instance=name,
                                                           query_path="hostkeys/")
        try:
            attrs = api.call(f"read the host keys of {name}",
                             partial(api.instances.get_guest_attributes, request=req, **api.kw()),
                             zone=zone, passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            return []
        except ProviderError as e:
            raise HostKeyPending(f"cannot read the SSH host keys of {name}: {e}") from None
        lines = []
        for item in attrs.query_value.items:
            if item.namespace != "hostkeys" or not item.value:
                continue
            value = item.value.strip()
            lines.append(value if value.split()[0] == item.key else f"{item.key} {value}")
        return lines

    def get_operation(self, zone: str, name: str) -> compute_v1.Operation:
        api = self.api
        return api.call(f"poll {name}", partial(api.zone_ops.get, project=api.project, zone=zone, operation=name,
                                                **api.kw()), zone=zone)

    def list_operations(self, zone: str, expression: str) -> list[compute_v1.Operation]:
        api = self.api
        req = compute_v1.ListZoneOperationsRequest(project=api.project, zone=zone, filter=expression)
        return api.call(f"list the operations in {zone}",
                        lambda: list(api.zone_ops.list(request=req, **api.kw())), zone=zone)
