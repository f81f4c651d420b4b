"""One fault-tolerant data-parallel step over torchft replica groups (each node is one group of one process).

Not torchft's DistributedDataParallel: after a peer's SIGKILL its comm hook asserts on gloo's
``Connection reset by peer`` and takes the survivors down too (torchft 0.2.0). The manager's own
``allreduce`` records the error instead, ``should_commit`` then says no on every survivor, the step is retried
at the next quorum (which has dropped the dead group), and no process restarts.

A step is exact for any membership: every participant puts its weight (its planned batch, then what a re-split gave
it) and its last step's compute time in a shared vector (one small all-reduce, with this step's control flags), all
split the fixed global batch by the same weights, each takes
its slice, its loss is ``sum(cross-entropy) / G`` and the gradients are SUMmed: the global-batch mean, whatever
the per-group batches. Batch-norm running buffers are averaged by the same shares, so the replicas stay equal.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ReduceOp, TCPStore
from torchft import Manager
from torchft.process_group import ProcessGroupGloo

from torchjob.split import offsets, proportional_split

FLAGS = 3  # [notice seen, stop, joining]: flags summed (any > 0 counts; joining: how many groups are joiners)


@dataclass
class StepInfo:
    """What every participant agreed on for one step."""

    step: int
    world: int
    rank: int
    batches: list[int]
    slots: list[int]
    sent: list[bool]  # which participants sent their state to a healing peer at this quorum
    flags: list[float]
    healed_s: list[float | None] = field(default_factory=list)  # each participant's heal at this quorum (None: none)
    compute_s: list[float] = field(default_factory=list)  # each one's compute of its last step's slice (0: none yet)

    @property
    def batch(self) -> int:
        return self.batches[self.rank]

    @property
    def offset(self) -> int:
        return offsets(self.batches)[self.rank]


@dataclass
class FtReplica:
    """This node's replica group: its manager, model and optimizer, and what the last steps measured."""

    manager: Manager
    model: nn.Module
    opt: torch.optim.Optimizer
    global_batch: int
    weight: float
    slot: int
    sent_state: bool = False
    healed_s: float | None = None  # the seconds the last quorum spent healing this replica (None: no heal)
    compute_s: float = 0.0  # forward + backward of its last step's slice, no collective (the re-split's measure)
    extra_state: dict[str, Any] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        self.sent_state = True  # torchft asks for it only to send it to a healing peer
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "extra": dict(self.extra_state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.extra_state = dict(state.get("extra", {}))


def advertised_host(lighthouse: str) -> str:
    """The address peers reach this group at: loopback when the Lighthouse is (one machine), else the host name."""
    host = lighthouse.split("//")[-1].rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1" if host in ("127.0.0.1", "localhost", "::1") else socket.gethostname()


def make_replica(model: nn.Module, opt: torch.optim.Optimizer, *, lighthouse: str, replica_id: str, slot: int,
                 weight: float, global_batch: int, timeout_s: float = 10.0,
                 heartbeat_ms: int = 100, host: str | None = None) -> FtReplica:
    """A replica group of one process: its own TCPStore (the group's), a reconfigurable gloo group, a Manager.
    ``host``: the address its peers reach it at (a VM's internal address), else ``advertised_host``'s."""
    host = host or advertised_host(lighthouse)
    store = TCPStore(host_name=host, port=0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=timeout_s))
    replica = FtReplica(manager=None, model=model, opt=opt, global_batch=global_batch,  # type: ignore[arg-type]
                        weight=weight, slot=slot)
    replica.manager = Manager(
        pg=pg, load_state_dict=replica.load_state_dict, state_dict=replica.state_dict, min_replica_size=1,
        use_async_quorum=False,  # the step's slice needs the quorum first; a heal is applied before forward
        timeout=timedelta(seconds=timeout_s), quorum_timeout=timedelta(seconds=max(60.0, timeout_s)),
        connect_timeout=timedelta(seconds=timeout_s), rank=0, world_size=1, store_addr=host,
        store_port=store.port, lighthouse_addr=lighthouse, replica_id=replica_id, hostname=host,
        heartbeat_interval=timedelta(milliseconds=heartbeat_ms),
        init_sync=False)  # every group seeds its model alike; a late joiner heals from the max step anyway
    replica.store = store  # type: ignore[attr-defined]  # kept alive with the replica (the group's store)
    return replica


def agree(replica: FtReplica, flags: list[float]) -> StepInfo | None:
    """Start the step's quorum (healing this replica if it is behind) and share weights, slots and flags.
    None: a peer failed during it (the step is then retried)."""
    m = replica.manager
    before, t0 = m.current_step(), time.perf_counter()
    replica.sent_state = False
    m.start_quorum()
    replica.healed_s = time.perf_counter() - t0 if m.current_step() != before else None
    n, rank = m.num_participants(), m.participating_rank()
    if rank is None:
        return None
    info = torch.zeros(5 * n + FLAGS, dtype=torch.float64)
    info[rank], info[n + rank], info[2 * n + rank] = replica.weight, float(replica.slot), float(replica.sent_state)
    info[3 * n + rank] = -1.0 if replica.healed_s is None else replica.healed_s  # rank 0 reports every heal
    info[4 * n + rank] = replica.compute_s
    info[5 * n:] = torch.tensor(flags + [0.0] * (FLAGS - len(flags)), dtype=torch.float64)
    m.allreduce(info, reduce_op=ReduceOp.SUM).wait()
    if m.errored() is not None:
        return None
    vals = info.tolist()
    weights = vals[:n]
    if min(weights) <= 0:
        return None  # a participant's entry was lost
    return StepInfo(step=m.current_step(), world=n, rank=rank,
                    batches=proportional_split(replica.global_batch, weights),
                    slots=[int(round(s)) for s in vals[n:2 * n]], sent=[v > 0.5 for v in vals[2 * n:3 * n]],
                    flags=vals[5 * n:], healed_s=[v if v >= 0 else None for v in vals[3 * n:4 * n]],
                    compute_s=vals[4 * n:5 * n])


def train_step(replica: FtReplica, info: StepInfo, loss_of: Callable[[int, int], torch.Tensor]) -> torch.Tensor | None:
    """Forward + backward of this replica's slice (``loss_of(offset, batch)``: sum of cross-entropies / G), one
    SUM all-reduce of the gradients, share-weighted batch-norm buffers and the loss shares, then the optimizer step
    where the quorum commits. Returns the global batch's loss, or None when the step did not commit (buffers put
    back)."""
    model, m = replica.model, replica.manager
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    saved = [b.detach().clone() for b in buffers]
    replica.opt.zero_grad(set_to_none=False)
    t0 = time.perf_counter()
    loss = loss_of(info.offset, info.batch)
    loss.backward()
    replica.compute_s = time.perf_counter() - t0  # before the collective: this group's own compute
    share = info.batch / replica.global_batch
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    total = loss.detach().reshape(1).to(grads[0].dtype)  # the loss shares ride along: the global loss, no extra call
    flat = _flatten_dense_tensors([*grads, *(b.detach() * share for b in buffers), total])
    m.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
    if m.errored() is None:
        out = _unflatten_dense_tensors(flat, [*grads, *buffers, total])
        with torch.no_grad():
            for dst, src in zip([*grads, *buffers, total], out, strict=True):
                dst.copy_(src)
    if not m.should_commit():
        with torch.no_grad():
            for b, v in zip(buffers, saved, strict=True):
                b.copy_(v)
        return None
    replica.opt.step()
    return total


def step_once(replica: FtReplica, flags: list[float],
              loss_of: Callable[[int, int], torch.Tensor]) -> tuple[StepInfo | None, torch.Tensor | None]:
    """One attempt at the next step: (info, loss) when it committed, (info or None, None) when a peer's failure made
    it retry (no process restarts: the next quorum leaves the lost group out)."""
    info = agree(replica, flags)
    if info is None:
        replica.manager.should_commit()  # closes the failed attempt (it says no) so the next quorum starts clean
        return None, None
    loss = train_step(replica, info, loss_of)
    return info, loss
