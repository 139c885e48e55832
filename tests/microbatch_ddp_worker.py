"""Run by tests/test_microbatch.py under `torchrun --nproc_per_node=2` (gloo, CPU): one optimizer step
of microbatch.run_update on a DDP-wrapped float64 policy, the two ranks holding unequal numbers of rows of
unequal lengths, and in one case a rank whose filter kept nothing. Rank 0 saves, for each case, the
change of every parameter under SGD with lr 1 (= minus the gradient) and the logged loss.

    python -m torch.distributed.run --nproc_per_node=2 tests/microbatch_ddp_worker.py BATCH.pt OUT.pt
"""

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import config  # noqa: E402
import ddp  # noqa: E402
import microbatch  # noqa: E402
import prime  # noqa: E402

# case: (rows of rank 0, rows of rank 1, train.py flags); rows index the saved batch
CASES = {
    "uneven-fixed": (range(0, 3), range(3, 12), dict(micro_batch_size=2)),
    "uneven-budget": (range(0, 3), range(3, 12), dict(max_tokens_per_micro_batch=150)),
    "rank0-kept-nothing": (range(0, 0), range(2, 12), dict(max_tokens_per_micro_batch=150)),
}


def run_case(saved: dict, rows0, rows1, flags: dict, d) -> dict:
    """One case's optimizer step; its DDP model dies with this call (see main)."""
    from transformers import AutoModelForCausalLM
    ro, logp_old, adv, temperature = saved["rollout"], saved["logp_old"], saved["adv"], saved["temperature"]
    model = AutoModelForCausalLM.from_pretrained(saved["model"], dtype=torch.float64)
    start = [p.detach().clone() for p in model.parameters()]
    wrapped = ddp.wrap_ddp(model, d)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=1.0)
    rows = torch.tensor(list(rows0 if d.rank == 0 else rows1), dtype=torch.long)
    n_rows = len(rows)
    if n_rows == 0:  # as train.filter_groups does: a placeholder row that carries no gradient
        rows = torch.tensor([0])
    mine, mask = ro.select(rows), ro.response_mask[rows].double()
    args = config.Args(**{"max_tokens_per_micro_batch": 0, **flags})

    def loss_fn(mb):
        logp = microbatch.response_logprobs(wrapped, mb.rollout(mine), temperature)
        return prime.ppo_clip_loss(logp, mb.rows_of(logp_old[rows]), mb.rows_of(adv[rows]), mb.rows_of(mask), 0.2)

    plan = microbatch.plan_update(mine, n_rows, args, d)
    losses = microbatch.run_update(wrapped, optimizer, loss_fn, lambda mb: float(mb.rows_of(mask).sum()), plan, args, d, 1e9)
    return dict(delta=[p.detach() - s for p, s in zip(model.parameters(), start)], losses=losses,
                micro_batches=len(plan[0]))


def main(batch_path: str, out_path: str) -> None:
    d = ddp.setup_distributed()
    saved = torch.load(batch_path, weights_only=False)
    results = {name: run_case(saved, rows0, rows1, flags, d) for name, (rows0, rows1, flags) in CASES.items()}
    if d.rank == 0:
        torch.save(results, out_path)
    # As at the end of train.py: no DDP model may outlive the process group, or freeing it frees gloo's
    # group holding the GIL and the exit can hang (pytorch#56297). run_case's models are gone; collect cycles.
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
