"""Live tensor bytes on any device, counted as PyTorch dispatches each op: the CPU's stand-in for
torch.cuda.max_memory_allocated, for tests/test_memory.py and bench/bench_microbatch.py.

    with LiveBytes() as tracked:
        ...one update...
    tracked.peak   # the most bytes alive at once above what was alive when the block began

Every tensor an op returns has its storage counted once, from the op that made it until the storage
is freed (a weakref finalizer on the storage: PyTorch keeps one Python object per storage, so it
fires when the last tensor or view using it dies). Storages made before the block (the weights, the
optimizer's state) are the baseline: one freed inside the block lowers the count by its size. A
kernel's scratch memory that never leaves the kernel is not seen.
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
        self.live, self.peak, self.seen, self.active = 0, 0, set(), False
        self.known = set()  # storages that were alive before the block: not ours to count

    def __enter__(self):
        with warnings.catch_warnings():  # isinstance on some module proxies warns of deprecations
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():  # every tensor alive now: its storage predates the block
                if isinstance(obj, torch.Tensor):
                    try:
                        storage = obj.untyped_storage()
                    except (RuntimeError, NotImplementedError):
                        continue
                    if id(storage) not in self.known:  # a freed one's id can be reused by a new storage
                        self.known.add(id(storage))
                        weakref.finalize(storage, self.free_known, id(storage), storage.nbytes())
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def free_known(self, key: int, nbytes: int) -> None:
        """A storage from before the block freed inside it (old gradients, DDP's first buckets): the
        memory it gives back counts, as the allocator would reuse it."""
        self.known.discard(key)
        if self.active:
            self.live -= nbytes

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
