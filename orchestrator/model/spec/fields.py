"""Typed spec fields for values that have a grammar: GCE project ids, resource names and paths, CIDR ranges,
ports. Each reaches a request path, a command line or a firewall rule, so a value outside its grammar is
refused while the spec is read (one line naming the field and the form), never sent on.

Grammars (Google's own pages): project ids https://cloud.google.com/resource-manager/docs/creating-managing-projects
(6-30 characters, a lowercase letter first, lowercase letters, digits and hyphens, no trailing hyphen); resource
names https://cloud.google.com/compute/docs/naming-resources (RFC 1035: 1-63 characters).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator

from orchestrator.model.specfile import short

PROJECT_ID = r"[a-z][a-z0-9-]{4,28}[a-z0-9]"
_RESOURCE = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_API_PREFIX = r"(?:https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta|alpha)/)?"
_PROJECT_RE = re.compile(PROJECT_ID)
# a name, family/NAME, images/[family/]NAME, [projects/P/]global/images/[family/]NAME (and as a full API URL)
_IMAGE_RE = re.compile(
    rf"{_API_PREFIX}(?:(?:projects/{PROJECT_ID}/)?global/images/|images/)?(?:family/)?{_RESOURCE}")
# a name, or [projects/P/]global/networks/NAME (and the same as a full API URL)
_NETWORK_RE = re.compile(rf"{_API_PREFIX}(?:(?:projects/{PROJECT_ID}/)?global/networks/)?{_RESOURCE}")
# Ports a task must not take: ssh (the controller's way in) and the privileged ones (< 1024) a task user cannot
# bind; 0 keeps its meaning of "pick one".
MIN_TASK_PORT = 1024


def _project(v: str) -> str:
    if not _PROJECT_RE.fullmatch(v):
        raise ValueError(f"'{short(v)}' is not a GCE project id; use 6-30 lowercase letters, digits and hyphens, "
                         "starting with a letter and not ending with a hyphen (the ID, not the display name)")
    return v


def _image(v: str) -> str:
    if not _IMAGE_RE.fullmatch(v):
        raise ValueError(f"'{short(v)}' is not a GCE image; use NAME, images/family/NAME or "
                         "projects/PROJECT/global/images/(family/)NAME with lowercase names (RFC 1035)")
    return v


def _network(v: str) -> str:
    if not _NETWORK_RE.fullmatch(v):
        raise ValueError(f"'{short(v)}' is not a GCE network; use NAME or [projects/PROJECT/]global/networks/NAME "
                         "with a lowercase name (RFC 1035)")
    return v


def _cidr(v: str) -> str:
    try:
        if "/" not in v:  # "0.0.0.0" may mean one address or everyone (/0): the prefix length is not guessed
            raise ValueError(v)
        net = ipaddress.ip_network(v, strict=True)
    except ValueError:
        raise ValueError(f"'{short(v)}' is not a CIDR range; use ADDRESS/PREFIX with the host bits zero, "
                         "e.g. 203.0.113.7/32") from None
    return str(net)


def _port(v: int) -> int:
    if v != 0 and v < MIN_TASK_PORT:
        raise ValueError(f"{v} is a reserved port (ssh is 22; below {MIN_TASK_PORT} needs root); use 0 (pick one) "
                         f"or {MIN_TASK_PORT}-65535")
    return v


GceProjectId = Annotated[str, AfterValidator(_project)]
GceImage = Annotated[str, AfterValidator(_image)]
GceNetwork = Annotated[str, AfterValidator(_network)]
CidrRange = Annotated[str, AfterValidator(_cidr)]
UserPort = Annotated[int, AfterValidator(_port)]
