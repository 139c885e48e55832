"""Plain DDP, one process per GPU (or per CPU worker with gloo): who am I, and the few collectives
the loop needs. `python train.py` is a world of one, and every function here is then a no-op.

    d = setup_distributed()          # RANK / WORLD_SIZE / LOCAL_RANK from torchrun, if set
    sums = all_reduce({"reward": r, "responses": n}, d)   # named values, summed over ranks
    print0(d, "only rank 0 prints")
"""

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def master(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """t summed elementwise over ranks: a statistic of the whole batch from each rank's share (t
        itself in a world of one). Ranks may differ in the last dimension (a batch's padded width):
        each is zero-padded to the widest first, so the result can be wider than t."""
        if self.world == 1:
            return t
        if t.dim():  # the widest rank's width first (a scalar needs no such round)
            out = torch.nn.functional.pad(t, (0, int(all_reduce_max([t.shape[-1]], self)[0]) - t.shape[-1]))
        else:
            out = t.clone()
        dist.all_reduce(out)
        return out

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """t's elementwise max over ranks (same shape on every rank; t itself in a world of one)."""
        if self.world == 1:
            return t
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX)
        return out


def setup_distributed() -> Dist:
    if "RANK" not in os.environ:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # Rollouts are long: a rank waiting for a slower rank's generation must not time out. device_id
    # binds NCCL's communicator to this rank's GPU up front (no guessing from the current device).
    dist.init_process_group(backend, timeout=datetime.timedelta(hours=2),
                            device_id=device if device.type == "cuda" else None)
    return Dist(rank, world, local_rank, device)


def all_reduce(values, d: Dist, op=None):
    """Sum (or another op) of a few numbers over ranks, for metrics and for lining up micro-batches.
    A dict of named values gives a dict back ({"reward": 3.0} -> {"reward": 3.0 summed}); a list, a list."""
    if isinstance(values, dict):
        return dict(zip(values, all_reduce(list(values.values()), d, op)))
    if d.world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(values: list[float], d: Dist) -> list[float]:
    return all_reduce(values, d, dist.ReduceOp.MAX if d.world > 1 else None)


def close(d: Dist) -> None:
    """Destroy the process group whenever one was made: under `torchrun --nproc_per_node=1` too (a
    world of one, but a real group), or NCCL warns at exit that it was never destroyed."""
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def print0(d: Dist, *a, **kw):
    if d.master:
        print(*a, **kw, flush=True)


def wrap_ddp(model, d: Dist):
    """DDP whenever there is a process group (torchrun, one rank included: the same code path as eight),
    with the gradients as views into its all-reduce buckets (gradient_as_bucket_view): DDP holds one
    bucket copy of every gradient anyway, and without the views each gradient would be there twice."""
    if not dist.is_initialized():
        return model
    return DistributedDataParallel(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None,
                                   gradient_as_bucket_view=True)


def unwrap(model):
    return model.module if hasattr(model, "module") else model


def check_shared_storage(folder: Path, flag: str, d: Dist) -> None:
    """More than one process: every rank must see the files rank 0 writes in `folder`.

    Several nodes need a file system they all share (NFS, Lustre, ...) for --out-dir (rank 0 writes
    the logs, metrics and the checkpoint's models; every rank writes its own RNG file into the same
    checkpoint and reads it back on --resume) and, for the embedded model, --cache-dir (rank 0
    trains the SFT checkpoint there; every rank loads it). --model and --data must be readable at
    the same path on every node. Without a shared folder a run would fail at its first checkpoint
    or hang; this check stops it at the start, on every rank, with the reason."""
    if d.world == 1:
        return
    probe = folder / f".shared-check-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
    if d.master:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("written by rank 0")
    barrier(d)
    missing = all_reduce([0.0 if probe.exists() else 1.0], d)[0]
    barrier(d)
    if d.master:
        probe.unlink(missing_ok=True)
    if missing:
        raise SystemExit(f"{flag} {folder}: {int(missing)} rank(s) cannot see the files rank 0 writes there. "
                         f"A run on several nodes needs {flag} on a file system all nodes share (see "
                         "docs/node.md, Commands)")


def broadcast_from_master(value, d: Dist):
    """Rank 0's Python object on every rank (e.g. the path of a checkpoint rank 0 just built)."""
    if d.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
