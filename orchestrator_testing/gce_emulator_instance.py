"""instances.insert in the GCE emulator: validate the request body (400s like GCE) and build the instance."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.model.gce_rules import FLEX_START, SPOT, STANDARD, load_gce_rules
from orchestrator_testing.gce_emulator_model import (
    LABEL_KEY_RE,
    LABEL_VALUE_RE,
    NAME_RE,
    PROJECT_NUMBER,
    ApiError,
    EmulatorConfig,
    InstanceRecord,
    bundled_gpus,
    fingerprint,
    invalid,
    last_segment,
    link,
    machine_vcpus,
    region_of,
)


def build_instance(
    config: EmulatorConfig, project: str, zone: str, req: dict[str, Any], inst_id: str, stamp: str
) -> InstanceRecord:
    """Validate an instances.insert body (400s like GCE) and build the instance's REST representation."""
    name = _name(req)
    machine_url, machine, cpus = _machine(req, zone)
    labels = _labels(req)
    gpu, gpu_count, accelerators = _gpus(config, project, zone, req, machine_url)
    scheduling = _scheduling(req.get("scheduling") or {}, gpu is not None, machine)
    _google_rules(req, machine, scheduling["provisioningModel"], accelerators)
    spot = scheduling["provisioningModel"] == "SPOT"
    body = _body(config, project, zone, req, name, inst_id, stamp)
    body.update(
        machineType=link(project, f"zones/{zone}/machineTypes/{machine}"),
        scheduling=scheduling,
        labels=labels,
        labelFingerprint=fingerprint(sorted(labels.items())),
    )
    if accelerators:
        body["guestAccelerators"] = accelerators
    return InstanceRecord(
        project,
        zone,
        name,
        body,
        max_run_s=_max_run_s(scheduling, stamp),
        spot=spot,
        legacy_preemptible=bool(scheduling["preemptible"]) and not spot,
        termination_action=scheduling.get("instanceTerminationAction", "STOP"),
        gpu=gpu,
        gpu_count=gpu_count,
        cpus=cpus,
    )


def _google_rules(req: dict[str, Any], machine: str, model: str, accelerators: list[dict[str, Any]]) -> None:
    """What GCE refuses by machine family (data/gce_rules.csv, the same rules the product plans with):
    provisioning models, boot disk types, gVNIC, flex-start's fields, GPUs per N1 VM."""
    rules = load_gce_rules()
    rule = rules.family(machine)
    if rule is None:
        return
    if model not in rule.provisioning:
        offered = " or ".join(sorted(rule.provisioning))
        raise invalid("resource.scheduling.provisioningModel", model,
                      f"Machine type {machine} supports provisioning models {offered} only.")
    if model == FLEX_START:
        affinity = (req.get("reservationAffinity") or {}).get("consumeReservationType")
        if affinity != "NO_RESERVATION":
            raise invalid("resource.reservationAffinity.consumeReservationType", affinity or "",
                          "FLEX_START instances require consumeReservationType NO_RESERVATION.")
        seconds = int(((req.get("scheduling") or {}).get("maxRunDuration") or {}).get("seconds", 0))
        if not rules.flex_min_run_s <= seconds <= rules.flex_max_run_s:
            raise invalid("resource.scheduling.maxRunDuration.seconds", seconds,
                          f"FLEX_START instances must run between {rules.flex_min_run_s:.0f} and "
                          f"{rules.flex_max_run_s:.0f} seconds.")
    boot: dict[str, Any] = next((d for d in req.get("disks") or [] if d.get("boot")), {})
    # No diskType: GCE picks a type the family boots from; a named one must be one of them.
    disk_type = last_segment(str((boot.get("initializeParams") or {}).get("diskType") or rule.default_disk))
    if disk_type not in rule.boot_disks:
        raise invalid("resource.disks[0].initializeParams.diskType", disk_type,
                      f"[{disk_type}] features are not compatible for creating instance of machine type {machine}; "
                      f"supported boot disk types: {', '.join(rule.boot_disks)}.")
    nics = req.get("networkInterfaces") or [{}]
    if rule.gvnic_required and any(nic.get("nicType") != "GVNIC" for nic in nics):
        raise invalid("resource.networkInterfaces[0].nicType", nics[0].get("nicType", ""),
                      f"Machine type {machine} requires nicType GVNIC.")
    for i, acc in enumerate(accelerators):
        kind, count = last_segment(acc["acceleratorType"]), int(acc["acceleratorCount"])
        if (wrong := rules.gpu_count_message(machine, kind, count)) is not None:
            raise invalid(f"resource.guestAccelerators[{i}].acceleratorCount", count, wrong)


def _name(req: dict[str, Any]) -> str:
    name = str(req.get("name", ""))
    if not NAME_RE.match(name):
        raise invalid(
            "resource.name", name, "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"
        )
    return name


def _no_machine(machine_url: str, machine: str, zone: str) -> ApiError:
    return invalid(
        "resource.machineType",
        machine_url,
        f"Machine type with name '{machine}' does not exist in zone '{zone}'.",
    )


def _machine(req: dict[str, Any], zone: str) -> tuple[str, str, int]:
    """(machineType URL, machine type, vCPUs) of a valid machine type in ``zone``."""
    machine_url = str(req.get("machineType", ""))
    machine = last_segment(machine_url)
    cpus = machine_vcpus(machine)
    if cpus is None or (f"zones/{zone}/" not in machine_url and "/" in machine_url):
        raise _no_machine(machine_url, machine, zone)
    return machine_url, machine, cpus


def _labels(req: dict[str, Any]) -> dict[str, Any]:
    labels = dict(req.get("labels") or {})
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key) or not LABEL_VALUE_RE.match(str(value)):
            raise invalid(
                "labels",
                f"{key}={value}",
                "Label keys and values must be lowercase letters, "
                "digits, '-' or '_' (at most 63 characters).",
            )
    return labels


def _gpus(
    config: EmulatorConfig, project: str, zone: str, req: dict[str, Any], machine_url: str
) -> tuple[str | None, int, list[dict[str, Any]]]:
    """(GPU, count, guestAccelerators): attached ones, or those an accelerator-optimized type comes with."""
    machine = last_segment(machine_url)
    gpu, gpu_count, accelerators = _accelerators(config, project, zone, req.get("guestAccelerators") or [])
    if (bundled := bundled_gpus(machine)) is None:
        return gpu, gpu_count, accelerators
    if accelerators:
        raise invalid(
            "resource.guestAccelerators",
            accelerators[0]["acceleratorType"],
            f"Machine type {machine} comes with its GPUs attached; do not specify guestAccelerators.",
        )
    if bundled[0] not in config.accelerators.get(zone, config.default_accelerators):
        raise _no_machine(machine_url, machine, zone)
    return bundled[0], bundled[1], accelerators


def _metadata_items(config: EmulatorConfig, req: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The request's items, plus where this VM's sshd and work directory are (all VMs share this machine)."""
    items = [dict(item) for item in (req.get("metadata") or {}).get("items") or []]
    if config.ssh_port is not None:
        items.append({"key": "orchestrator-ssh-port", "value": str(config.ssh_port)})
    if config.workdir_root:
        items.append({"key": "orchestrator-workdir", "value": str(Path(config.workdir_root) / name)})
    return items


def _body(
    config: EmulatorConfig, project: str, zone: str, req: dict[str, Any], name: str, inst_id: str, stamp: str
) -> dict[str, Any]:
    """The instance's REST body, less what depends on its machine type, scheduling and labels."""
    metadata_items = _metadata_items(config, req, name)
    tags = list((req.get("tags") or {}).get("items") or [])
    return {
        "kind": "compute#instance",
        "id": inst_id,
        "creationTimestamp": stamp,
        "name": name,
        "description": req.get("description", ""),
        "tags": {"items": tags, "fingerprint": fingerprint(tags)},
        "status": "PROVISIONING",
        "zone": link(project, f"zones/{zone}"),
        "canIpForward": bool(req.get("canIpForward", False)),
        "networkInterfaces": _nics(config, project, zone, req.get("networkInterfaces") or [{}]),
        "disks": _disks(project, zone, name, req.get("disks") or []),
        "metadata": {
            "kind": "compute#metadata",
            "fingerprint": fingerprint(metadata_items),
            "items": metadata_items,
        },
        "serviceAccounts": [
            {
                "email": f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
                if sa.get("email") == "default"
                else sa.get("email"),
                "scopes": list(sa.get("scopes") or []),
            }
            for sa in req.get("serviceAccounts") or []
        ],
        "selfLink": link(project, f"zones/{zone}/instances/{name}"),
        "cpuPlatform": "Unknown CPU Platform",
        "startRestricted": False,
        "deletionProtection": bool(req.get("deletionProtection", False)),
        "fingerprint": fingerprint((name, inst_id)),
    }


def _accelerators(
    config: EmulatorConfig,
    project: str,
    zone: str,
    requested: list[dict[str, Any]],
) -> tuple[str | None, int, list[dict[str, Any]]]:
    available = config.accelerators.get(zone, config.default_accelerators)
    out: list[dict[str, Any]] = []
    gpu: str | None = None
    total = 0
    for i, acc in enumerate(requested):
        url = str(acc.get("acceleratorType", ""))
        kind = last_segment(url)
        count = int(acc.get("acceleratorCount", 0))
        if kind not in available or ("/" in url and f"zones/{zone}/" not in url):
            raise invalid(
                f"resource.guestAccelerators[{i}].acceleratorType",
                url,
                f"Accelerator type '{kind}' does not exist in zone '{zone}'.",
            )
        if count < 1:
            raise invalid(f"resource.guestAccelerators[{i}].acceleratorCount", count, "Must be positive.")
        gpu, total = kind, total + count
        out.append(
            {
                "acceleratorType": link(project, f"zones/{zone}/acceleratorTypes/{kind}"),
                "acceleratorCount": count,
            }
        )
    return gpu, total, out


def _max_run_s(scheduling: dict[str, Any], stamp: str) -> float | None:
    """Seconds from creation until GCE ends the VM itself (maxRunDuration or terminationTime)."""
    if "maxRunDuration" in scheduling:
        return float(scheduling["maxRunDuration"]["seconds"])
    if "terminationTime" in scheduling:
        end = datetime.fromisoformat(str(scheduling["terminationTime"]).replace("Z", "+00:00"))
        return max(0.0, (end - datetime.fromisoformat(stamp)).total_seconds())
    return None


def _time_limit(req: dict[str, Any], model: str, out: dict[str, Any]) -> None:
    """maxRunDuration / terminationTime as GCE validates them (one of them; an action with it)."""
    duration, until = req.get("maxRunDuration"), req.get("terminationTime")
    if duration is not None and until is not None:
        raise invalid("resource.scheduling.terminationTime", until, "Specify maxRunDuration or terminationTime.")
    if duration is not None:
        seconds = int((duration or {}).get("seconds", 0))
        limit = 7 * 86400 if model == "FLEX_START" else 120 * 86400
        if not 30 <= seconds <= limit:
            raise invalid("resource.scheduling.maxRunDuration.seconds", seconds, f"Must be in [30, {limit}].")
        out["maxRunDuration"] = {"seconds": str(seconds)}
    if until is not None:
        try:
            datetime.fromisoformat(str(until).replace("Z", "+00:00"))
        except ValueError:
            raise invalid("resource.scheduling.terminationTime", until, "Must be an RFC 3339 timestamp.") from None
        out["terminationTime"] = str(until)
    if model == "FLEX_START" and duration is None:
        raise invalid("resource.scheduling.maxRunDuration", "", "FLEX_START instances require maxRunDuration.")


def _termination_action(req: dict[str, Any], model: str, out: dict[str, Any]) -> None:
    """instanceTerminationAction as GCE validates it: only with SPOT, FLEX_START or a time limit."""
    action = req.get("instanceTerminationAction")
    limited = req.get("maxRunDuration") is not None or req.get("terminationTime") is not None
    if action and not (model == "SPOT" or limited or model == "FLEX_START"):
        raise invalid(
            "resource.scheduling.instanceTerminationAction",
            action,
            "Requires provisioningModel SPOT or a time limit (maxRunDuration / terminationTime).",
        )
    if model == "FLEX_START" and (action or "DELETE") != "DELETE":
        raise invalid("resource.scheduling.instanceTerminationAction", action, "FLEX_START instances are deleted.")
    if limited and not action:
        raise invalid(
            "resource.scheduling.instanceTerminationAction", "", "Required with maxRunDuration or terminationTime."
        )
    if model == "SPOT" or action:
        if (action or "STOP") not in ("STOP", "DELETE"):
            raise invalid("resource.scheduling.instanceTerminationAction", action)
        out["instanceTerminationAction"] = action or "STOP"


def _scheduling(req: dict[str, Any], has_gpu: bool, machine: str = "") -> dict[str, Any]:
    model = req.get("provisioningModel") or STANDARD
    if model not in (STANDARD, SPOT, FLEX_START):
        raise invalid("resource.scheduling.provisioningModel", model)
    rule = load_gce_rules().family(machine)
    if model == FLEX_START and not (rule is not None and rule.flex_start):
        raise invalid(
            "resource.scheduling.provisioningModel", model, f"FLEX_START is not supported for machine type {machine}."
        )
    _notice(req, model)
    spot = model == "SPOT"
    preemptible = bool(req.get("preemptible", False)) or spot
    maintenance = req.get("onHostMaintenance") or ("TERMINATE" if preemptible else "MIGRATE")
    restart = req.get("automaticRestart", not preemptible)
    if has_gpu and maintenance != "TERMINATE":
        raise invalid(
            "resource.scheduling.onHostMaintenance",
            maintenance,
            "Instances with guest accelerators do not support live migration.",
        )
    if preemptible and (restart or maintenance != "TERMINATE"):
        raise invalid(
            "resource.scheduling",
            "",
            "Preemptible and Spot instances cannot be automatically "
            "restarted and must terminate on host maintenance.",
        )
    out: dict[str, Any] = {
        "onHostMaintenance": maintenance,
        "automaticRestart": bool(restart),
        "preemptible": preemptible,
        "provisioningModel": model,
    }
    _termination_action(req, model, out)
    _time_limit(req, model, out)
    if req.get("preemptionNoticeDuration") is not None:
        out["preemptionNoticeDuration"] = {"seconds": str(int(req["preemptionNoticeDuration"].get("seconds", 0)))}
    return out


def _notice(req: dict[str, Any], model: str) -> None:
    """scheduling.preemptionNoticeDuration (Preview): 0 or 120 s, on Spot VMs only."""
    notice = req.get("preemptionNoticeDuration")
    if notice is None:
        return
    seconds = int((notice or {}).get("seconds", 0))
    if model != SPOT or seconds not in (0, 120):
        raise invalid("resource.scheduling.preemptionNoticeDuration", seconds,
                      "Must be 0 or 120 seconds, and only with provisioningModel SPOT.")


def _disks(project: str, zone: str, name: str, disks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    boot = [d for d in disks if d.get("boot")]
    if len(boot) != 1:
        raise invalid("resource.disks", "", "Exactly one boot disk must be specified.")
    params = boot[0].get("initializeParams") or {}
    source_image = str(params.get("sourceImage", ""))
    if not source_image and not boot[0].get("source"):
        raise invalid("resource.disks[0].initializeParams.sourceImage", "", "Boot disk must have a source.")
    disk_name = params.get("diskName") or name
    return [
        {
            "kind": "compute#attachedDisk",
            "type": "PERSISTENT",
            "mode": "READ_WRITE",
            "source": boot[0].get("source") or link(project, f"zones/{zone}/disks/{disk_name}"),
            "deviceName": boot[0].get("deviceName") or "persistent-disk-0",
            "index": 0,
            "boot": True,
            "autoDelete": bool(boot[0].get("autoDelete", False)),
            "interface": "SCSI",
            "diskSizeGb": str(params.get("diskSizeGb") or 10),
            "architecture": "X86_64",
        }
    ]


def _nics(
    config: EmulatorConfig, project: str, zone: str, nics: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for i, nic in enumerate(nics):
        network = last_segment(nic.get("network") or "default")
        out.append(
            {
                "kind": "compute#networkInterface",
                "name": f"nic{i}",
                "network": link(project, f"global/networks/{network}"),
                "subnetwork": link(
                    project,
                    f"regions/{region_of(zone)}/subnetworks/{last_segment(nic.get('subnetwork') or network)}",
                ),
                "networkIP": config.network_ip,
                "stackType": "IPV4_ONLY",
                **({"nicType": nic["nicType"]} if nic.get("nicType") else {}),
                "fingerprint": fingerprint(i),
                "accessConfigs": [
                    {
                        "kind": "compute#accessConfig",
                        "type": ac.get("type", "ONE_TO_ONE_NAT"),
                        "name": ac.get("name", "External NAT"),
                        "networkTier": "PREMIUM",
                    }
                    for ac in nic.get("accessConfigs") or []
                ],
            }
        )
    return out
