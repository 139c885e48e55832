"""A torchrun target for tests/test_train.py: train.py's main, with dist.destroy_process_group wrapped
to print how many DistributedDataParallel models are alive when the process group is destroyed.

DDP's reducers hold the process group. If one outlives destroy_process_group, freeing it frees gloo's
group while holding the GIL, and the process can hang at exit (pytorch#56297): train.py frees its DDP
models first, so the count must be 0. (The hang itself is a race: 5 exits in 50 of a small two-rank
script in one batch, 0 in 32 in another; the count is not.)"""
import gc
import sys
from pathlib import Path

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train  # noqa: E402

destroy = dist.destroy_process_group


def counted_destroy(*args, **kwargs):
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    print(f"DDP models alive at destroy_process_group: {alive}", flush=True)
    return destroy(*args, **kwargs)


dist.destroy_process_group = counted_destroy
train.main(sys.argv[1:])
