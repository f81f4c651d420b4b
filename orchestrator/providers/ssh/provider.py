"""The `ssh` provider: machines you already have (e.g. a university's heterogeneous GPU nodes), listed in a
YAML inventory. Nothing is provisioned:

- ``create`` assigns a free, reachable host matching the request's GPU (any host for CPU roles, CPU-only
  hosts first) and records it in ``user_dir()/ssh-assignments.json`` keyed by instance name;
- ``delete`` kills what the job started there, removes the instance's work directory and frees the host;
- ``list`` reports RUNNING while the host answers SSH and TERMINATED when it does not: a host becoming
  unreachable is this provider's revocation (never ``preempted``: no cloud said so).

One instance per host: cloud tasks all listen on the same TensorFlow port. Inventory::

    known_hosts: ~/.ssh/known_hosts   # the default; relative paths are relative to the inventory
    hosts:
      - {name: node1, host: 10.0.0.5, user: alice, key: ~/.ssh/id_ed25519, gpu: k80, gpus: 2,
         workdir: /scratch/alice/orchestrator, price_per_hour: 0.0}

Host keys are pinned: a host whose key is not in ``known_hosts`` (or differs) is refused, never trusted on
first use (these hosts live long; a spoofed one would get the job's code, data and credentials).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import posixpath
import socket
import stat
import threading
from collections.abc import Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.clock import WALL, Clock
from orchestrator.model.catalog import Catalog, load_catalog
from orchestrator.model.cloud_errors import CapacityError
from orchestrator.model.instances import InstanceRequest, ObservedInstance, ObservedState, Role
from orchestrator.model.names import unknown_name
from orchestrator.model.paths import user_dir
from orchestrator.model.spec import SSH_USER_PATTERN, FieldError, SpecError
from orchestrator.model.specfile import YamlFileError, read_yaml_file
from orchestrator.providers.base import Provider, SupportsHostGpus, SupportsOwnPricing
from orchestrator.transport.base import Endpoint, FatalTransportError, TransportError

if TYPE_CHECKING:  # paramiko and fabric (0.13 s of import) load with the first transport, not with the plan
    from orchestrator.transport.ssh import SshTransport

log = logging.getLogger(__name__)

STATE_FILE = "ssh-assignments.json"


# ---------------------------------------------------------------- inventory


class InventoryHost(BaseModel):
    # No inf/nan: `price_per_hour: .inf` would bill every job infinitely (and pass every budget check as nan).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=63)
    host: str = Field(min_length=1, pattern=r"^[^\x00-\x20\x7f]+$", description="name or address, no spaces")
    port: int = Field(default=22, ge=1, le=65535)
    # A POSIX login name: no spaces, colons or newlines that would smuggle options into an ssh command.
    user: str | None = Field(default=None, pattern=SSH_USER_PATTERN, max_length=32)
    key: Path | None = Field(default=None, description="private key (mode 0600), relative to the inventory")
    gpu: str | None = Field(default=None, description="catalog GPU key, e.g. k80; omit for a CPU-only host")
    gpus: int = Field(default=0, ge=0, le=64)
    workdir: str = Field(default="orchestrator", min_length=1, pattern=r"^[^\x00-\x1f\x7f]+$",
                         description="instances get <workdir>/<name>")
    price_per_hour: float = Field(default=0.0, ge=0, le=10_000)

    @model_validator(mode="after")
    def _gpu_count(self) -> InventoryHost:
        if self.gpu is not None:
            self.gpu = self.gpu.lower()
            if self.gpus == 0:
                self.gpus = 1
        elif self.gpus:
            raise ValueError("gpus is set but gpu (the GPU type) is not")
        return self


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[InventoryHost] = Field(min_length=1)
    known_hosts: Path | None = Field(default=None, description="host keys; default ~/.ssh/known_hosts")

    def host(self, name: str) -> InventoryHost | None:
        return next((h for h in self.hosts if h.name == name), None)


class InventoryError(SpecError):
    """The inventory is invalid; every problem is reported as ``inventory.<field path>: <message>``."""

    what = "SSH inventory"


def _loc(loc: tuple[int | str, ...]) -> str:
    out = "inventory"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def load_inventory(path: str | Path, catalog: Catalog | None = None) -> Inventory:
    path = Path(path).expanduser()
    try:  # a directory, device, non-UTF-8 file, duplicate key or 100k-deep nesting: one clear line
        raw = read_yaml_file(path, "inventory")
    except YamlFileError as e:
        raise InventoryError([FieldError(path="", message=str(e))], str(path)) from None
    try:
        inv = Inventory.model_validate(raw if raw is not None else {})
    except ValidationError as e:
        errors = []
        for err in e.errors():
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            if err.get("type") == "extra_forbidden":
                msg = "unknown field; known: " + ", ".join(InventoryHost.model_fields)
            elif err.get("type") == "missing":
                msg = "required field is missing"
            errors.append(FieldError(path=_loc(tuple(err.get("loc", ()))), message=msg))
        raise InventoryError(errors, str(path)) from None

    catalog = catalog or load_catalog()
    errors = []
    if inv.known_hosts is not None:
        known = inv.known_hosts.expanduser()
        inv.known_hosts = known if known.is_absolute() else (path.parent / known).resolve()
        if not inv.known_hosts.is_file():
            errors.append(FieldError(path="inventory.known_hosts", message=f"{inv.known_hosts} is not a file"))
    seen: set[str] = set()
    for i, h in enumerate(inv.hosts):
        where = f"inventory.hosts[{i}]"
        if h.name in seen:
            errors.append(FieldError(path=f"{where}.name", message=f"'{h.name}' is listed twice"))
        seen.add(h.name)
        if h.gpu is not None and h.gpu not in catalog.gpus:
            msg = unknown_name(h.gpu, "a GPU type", catalog.gpus)
            errors.append(FieldError(path=f"{where}.gpu", message=msg))
        if h.key is not None:
            key = h.key.expanduser()
            h.key = key if key.is_absolute() else (path.parent / key).resolve()
            try:
                mode = stat.S_IMODE(h.key.stat().st_mode)
            except OSError:
                errors.append(FieldError(path=f"{where}.key", message=f"{h.key} does not exist"))
                continue
            if mode & 0o077:
                msg = f"{h.key} has mode {mode:04o}; it must be 0600 (chmod 600 {h.key})"
                errors.append(FieldError(path=f"{where}.key", message=msg))
    if errors:
        raise InventoryError(errors, str(path))
    return inv


# ---------------------------------------------------------------- assignments state


class _State:
    """``ssh-assignments.json``: {"assignments": {instance: {...}}, "cleanup": [{inventory, host, workdir}]}.

    ``cleanup`` lists work directories of deleted instances whose host was unreachable at the time.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        data.setdefault("assignments", {})
        data.setdefault("cleanup", [])
        return data

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write under an exclusive lock (several controllers may share a user_dir)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.with_name(self.path.name + ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.read()
            yield data
            tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.path)  # readers (list) never see half a file


# ---------------------------------------------------------------- provider


class SshInventoryProvider(Provider, SupportsOwnPricing, SupportsHostGpus):
    name = "ssh"

    def __init__(self, inventory: str | Path, *, state_path: Path | None = None,
                 transport: SshTransport | None = None, catalog: Catalog | None = None,
                 probe_timeout_s: float = 2.0, probe_ttl_s: float = 5.0, clock: Clock = WALL) -> None:
        self.clock = clock
        self.inventory_path = Path(inventory).expanduser().resolve()
        self._inv_key = str(self.inventory_path)  # assignments of several inventories share the state file
        self._catalog = catalog
        self.inventory = load_inventory(self.inventory_path, catalog)
        self._mtime = self.inventory_path.stat().st_mtime_ns
        self._state = _State(state_path or user_dir() / STATE_FILE)
        if transport is None:
            from orchestrator.transport.ssh import SshTransport

            transport = SshTransport(connect_timeout_s=5.0, clock=clock)
        self.transport = transport
        self.probe_timeout_s = probe_timeout_s
        self.probe_ttl_s = probe_ttl_s
        self._probes: dict[tuple[str, int], tuple[float, bool]] = {}
        self._probe_lock = threading.Lock()

    # -- inventory and endpoints

    def _hosts(self) -> Inventory:
        """The inventory, re-read when the file changed (nodes added while a job runs)."""
        try:
            mtime = self.inventory_path.stat().st_mtime_ns
            if mtime != self._mtime:
                self.inventory, self._mtime = load_inventory(self.inventory_path, self._catalog), mtime
        except (OSError, InventoryError) as e:
            log.warning("keeping the previous inventory: %s", e)
        return self.inventory

    def _endpoint(self, host: InventoryHost, instance: str) -> Endpoint:
        return self._host_endpoint(host, posixpath.join(host.workdir, instance))

    def _host_endpoint(self, host: InventoryHost, workdir: str) -> Endpoint:
        known = self.inventory.known_hosts
        return Endpoint(workdir=workdir, host=host.host, port=host.port, user=host.user,
                        key_path=str(host.key) if host.key else None, known_hosts=str(known) if known else None)

    def endpoint(self, observed: ObservedInstance) -> Endpoint:
        """Where the transport reaches an instance: its host's address, user, key and work directory."""
        host = self._hosts().host(observed.provider_id.removeprefix("ssh:"))
        if host is None:
            raise TransportError(f"{observed.name}: host {observed.provider_id!r} is not in the inventory")
        return self._endpoint(host, observed.name)

    # -- reachability

    def reachable(self, host: InventoryHost) -> bool:
        """Does the host answer with an SSH banner? Cached for ``probe_ttl_s``; no login needed."""
        key = (host.host, host.port)
        now = self.clock.monotonic()
        with self._probe_lock:
            cached = self._probes.get(key)
        if cached is not None and now - cached[0] < self.probe_ttl_s:
            return cached[1]
        try:
            with socket.create_connection(key, timeout=self.probe_timeout_s) as s:
                s.settimeout(self.probe_timeout_s)
                ok = s.recv(4).startswith(b"SSH-")
        except OSError:
            ok = False
        with self._probe_lock:
            self._probes[key] = (self.clock.monotonic(), ok)
        return ok

    def _probe_all(self, hosts: list[InventoryHost]) -> dict[str, bool]:
        unique = {h.name: h for h in hosts}
        if len(unique) <= 1:
            return {n: self.reachable(h) for n, h in unique.items()}
        with ThreadPoolExecutor(max_workers=min(16, len(unique))) as pool:  # dead hosts time out in parallel
            return dict(zip(unique, pool.map(self.reachable, unique.values()), strict=True))

    # -- Provider

    def create(self, request: InstanceRequest) -> None:
        inv = self._hosts()
        with self._state.update() as st:
            if request.name in st["assignments"]:
                return  # deterministic name: assigned already
            busy = {a["host"] for a in st["assignments"].values() if a["inventory"] == self._inv_key}
            free = pick_order([h for h in inv.hosts if h.name not in busy], request.gpu, request.gpu_count)
            up = self._probe_all(free)
            host = next((h for h in free if up[h.name]), None)
            if host is None:
                what = f"GPU {request.gpu}" if request.gpu else "any host"
                raise CapacityError(
                    f"no free reachable host in {self.inventory_path} for {request.name} ({what}; "
                    f"{len(free)} free but unreachable, {len(busy)} busy)",
                    zone=request.zone, resource=request.gpu or "host")
            self._cleanup(st, host)
            st["assignments"][request.name] = {
                "inventory": self._inv_key, "host": host.name, "job_id": request.job_id,
                "role": request.role.value, "index": request.index, "generation": request.generation,
                "zone": request.zone, "gpu": request.gpu, "spot": request.spot,
                "labels": request.all_labels(), "created_at": self.clock.time(),
            }
        log.info("assigned %s to host %s (%s)", request.name, host.name, host.host)

    def price_per_hour(self, name: str) -> float | None:
        """The assigned host's ``price_per_hour`` from the inventory (what the ledger bills)."""
        host = self._assigned(name)
        return None if host is None else host.price_per_hour

    def gpus_on(self, name: str) -> int | None:
        """The assigned host's ``gpus`` from the inventory; None for a CPU-only host or an unknown instance."""
        host = self._assigned(name)
        return host.gpus if host is not None and host.gpu else None

    def _assigned(self, name: str) -> InventoryHost | None:
        assignment = self._state.read()["assignments"].get(name)
        return self._hosts().host(assignment["host"]) if assignment else None

    def delete(self, name: str, zone: str) -> None:
        with self._state.update() as st:
            rec = st["assignments"].get(name)
            if rec is None or rec["inventory"] != self._inv_key:
                return  # not found is success
            host = self._hosts().host(rec["host"])
            if host is not None:
                ep = self._endpoint(host, name)
                try:
                    if not self.reachable(host):
                        raise TransportError(f"{host.name} unreachable")
                    self.transport.kill_all(ep)
                    self.transport.remove_workdir(ep)
                except TransportError as e:
                    # Free the host anyway (a dead node must not block the job) but kill leftovers before
                    # the host is handed out again: they would hold the TensorFlow port. A refused host key
                    # or login is the job's reason already, in full.
                    why = f"{type(e).__name__}, see the job's reason" if isinstance(e, FatalTransportError) else e
                    log.warning("deleting %s: cannot clean up on %s (%s); retrying on reuse", name, host.name, why)
                    st["cleanup"].append({"inventory": self._inv_key, "host": host.name,
                                          "workdir": ep.workdir})
            del st["assignments"][name]

    def _cleanup(self, st: dict[str, Any], host: InventoryHost) -> None:
        pending = [c for c in st["cleanup"] if c["inventory"] == self._inv_key and c["host"] == host.name]
        for c in pending:
            ep = self._host_endpoint(host, c["workdir"])
            try:
                self.transport.kill_all(ep)
                self.transport.remove_workdir(ep)
            except TransportError as e:
                log.warning("cleanup of %s on %s failed: %s", c["workdir"], host.name, e)
                continue
            st["cleanup"].remove(c)

    def list(self, job_ids: Collection[str] | None = None) -> list[ObservedInstance]:
        wanted = set(job_ids) if job_ids is not None else None
        inv = self._hosts()
        recs = [(n, a) for n, a in self._state.read()["assignments"].items()
                if a["inventory"] == self._inv_key and (wanted is None or a["job_id"] in wanted)]
        hosts = {a["host"]: inv.host(a["host"]) for _, a in recs}
        up = self._probe_all([h for h in hosts.values() if h is not None])
        out: list[ObservedInstance] = []
        for name, a in recs:
            host = hosts[a["host"]]
            alive = host is not None and up.get(host.name, False)
            out.append(ObservedInstance(
                name=name, job_id=a["job_id"], role=Role(a["role"]), index=a["index"],
                generation=a["generation"], zone=a["zone"],
                state=ObservedState.RUNNING if alive else ObservedState.TERMINATED,
                provider_id=f"ssh:{a['host']}", host=host.host if host else None,
                ssh_port=host.port if host else None,
                workdir=posixpath.join(host.workdir, name) if host else None, preempted=False,
                gpu=host.gpu if host else a.get("gpu"), spot=bool(a.get("spot")),
            ))
        return out

    def close(self) -> None:
        self.transport.close()


def pick_order(hosts: list[InventoryHost], gpu: str | None, gpu_count: int = 1) -> list[InventoryHost]:
    """The hosts that fit a request for ``gpu`` (None: a CPU role), in the order ``create`` takes them: GPU roles
    the cheapest matching host; CPU roles CPU-only hosts first (GPUs are for workers), then the cheapest."""
    fit = [h for h in hosts if gpu is None or (h.gpu == gpu.lower() and h.gpus >= max(1, gpu_count))]
    return sorted(fit, key=lambda h: (h.gpu is not None and gpu is None, h.price_per_hour, h.name))
