"""Firewall rules: made idempotent (get, then insert or update only what differs), deleted when gone is fine."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from google.api_core import exceptions as gexc

from orchestrator.providers.gce.api import GceApi
from orchestrator.providers.gce.compute_api import compute_v1, message
from orchestrator.providers.gce.observe import last_segment
from orchestrator.providers.gce.requests import Body

log = logging.getLogger(__name__)


class Firewalls:
    """The project's firewall rules, through one ``GceApi``."""

    def __init__(self, api: GceApi) -> None:
        self.api = api

    def all(self) -> list[compute_v1.Firewall]:
        return list(self.api.call("list firewall rules",
                                  partial(self.api.firewalls.list, project=self.api.project, **self.api.kw())))

    def ensure(self, body: Body) -> None:
        """Create the rule (the API's JSON), or update it if the fields we own differ; a concurrent create is fine."""
        rule = message(compute_v1.Firewall, body)
        api, what = self.api, f"firewall {rule.name}"
        try:
            existing = api.call(what, partial(api.firewalls.get, project=api.project, firewall=rule.name, **api.kw()),
                                passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            existing = None
        if existing is not None and firewall_key(existing) == firewall_key(rule):
            return
        if existing is None:
            req: Any = compute_v1.InsertFirewallRequest(project=api.project, firewall_resource=rule,
                                                        request_id=str(uuid.uuid4()))
            call: Callable[..., compute_v1.Operation] = api.firewalls.insert_unary
        else:
            log.info("updating %s to %s", what, firewall_key(rule))
            req = compute_v1.UpdateFirewallRequest(project=api.project, firewall=rule.name, firewall_resource=rule,
                                                   request_id=str(uuid.uuid4()))
            call = api.firewalls.update_unary
        try:
            op = api.call(what, partial(call, request=req, **api.kw()), passthrough=(gexc.Conflict,))
        except gexc.Conflict:
            return  # created concurrently by another controller; the next call reconciles its fields
        api.finish(op, what)

    def delete(self, name: str) -> None:
        """Delete the rule (missing is fine)."""
        api, what = self.api, f"delete firewall {name}"
        req = compute_v1.DeleteFirewallRequest(project=api.project, firewall=name, request_id=str(uuid.uuid4()))
        try:
            op = api.call(what, partial(api.firewalls.delete_unary, request=req, **api.kw()),
                          passthrough=(gexc.NotFound,))
        except gexc.NotFound:
            return
        api.finish(op, what, fine="RESOURCE_NOT_FOUND")


def firewall_key(rule: compute_v1.Firewall) -> tuple[Any, ...]:
    """The fields we own; a difference means the rule must be updated."""
    allowed = sorted((a.I_p_protocol, tuple(sorted(a.ports))) for a in rule.allowed)
    return (rule.direction or "INGRESS", allowed, sorted(rule.source_ranges), sorted(rule.source_tags),
            sorted(rule.target_tags), last_segment(rule.network or "default"))
