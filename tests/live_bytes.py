"""Live tensor bytes on any device, counted as PyTorch dispatches each op: the CPU's stand-in for
torch.cuda.max_memory_allocated, for tests/test_memory.py and bench/bench_microbatch.py.

    with LiveBytes() as tracked:
        ...one update...
    tracked.peak   # the most bytes of storage alive at once that were allocated inside the block

Every tensor an op returns has its storage counted once, from the op that made it until the storage
is freed (a weakref finalizer on the storage: PyTorch keeps one Python object per storage, so it
fires when the last tensor or view using it dies). Storages made before the block (the weights, and
the optimizer's state from an earlier step) are not counted; a kernel's scratch memory that never
leaves the kernel is not seen.
"""

import gc
import warnings
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live, self.peak, self.seen = 0, 0, set()
        self.known = set()  # storages that were alive before the block: not ours to count

    def __enter__(self):
        with warnings.catch_warnings():  # isinstance on some module proxies warns of deprecations
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():  # every tensor alive now: its storage predates the block
                if isinstance(obj, torch.Tensor):
                    try:
                        self.known.add(id(obj.untyped_storage()))
                    except (RuntimeError, NotImplementedError):
                        pass
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self.seen or key in self.known:
            return
        nbytes = storage.nbytes()
        self.seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.free, key, nbytes)

    def free(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes
