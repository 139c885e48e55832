"""Steps 5-6 of train.py (process rewards, advantages, the policy and critic update) on one global batch,
split over the ranks of whoever runs it. tests/test_train.py runs `run` in its own process (a world of
one, the whole batch) and this file under `torchrun --nproc_per_node=2` (gloo, CPU), rank 0 holding one
prompt group and rank 1 the other three, each trimmed to its own widest response. Every rank saves
its advantages, the policy's (and PPO's critic's) parameter change under SGD with lr 1, per estimator.

    python -m torch.distributed.run --nproc_per_node=2 tests/world_size_worker.py BATCH.pt OUT_PREFIX
"""

import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import config  # noqa: E402
import ddp  # noqa: E402
import runlog  # noqa: E402
import train  # noqa: E402
import models  # noqa: E402
from models import Models  # noqa: E402

# estimator -> the train.py flags it runs with: every estimator that whitens or normalises over the batch
ESTIMATORS = {
    "rloo": dict(),  # process rewards normalised by the batch's largest return, advantages whitened
    "rloo-beta": dict(process_norm="beta"),  # whitening alone
    "grpo": dict(estimator="grpo"),  # the normaliser (the group statistics need nothing)
    "reinforce": dict(estimator="reinforce"),
    "prm-value": dict(estimator="prm-value"),
    "ppo": dict(estimator="ppo"),  # GAE over a critic's values, whitened; the critic updates too
    "pass": dict(estimator="pass", pass_preset="math"),  # the batch normaliser and the batch trace
    "pass-qa": dict(estimator="pass", pass_preset="qa"),  # its eta closes chunks where the trace moves
    "rloo-lora": dict(lora_rank=4),  # the policy as a LoRA adapter on a frozen base: the adapter's step
}
GROUPS = {0: [1], 1: [0, 2, 3]}  # prompt groups of each rank in the 2-rank run (group 1: the shortest)


def run(saved: dict, d: ddp.Dist) -> dict:
    """{estimator: {"rows", "adv", "policy_delta", "critic_delta"}} for this rank's share of the batch."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer
    K = 4
    groups = sum(GROUPS.values(), []) if d.world == 1 else GROUPS[d.rank]
    rows = torch.tensor([g * K + k for g in groups for k in range(K)])
    ro = saved["rollout"].select(rows).trimmed()  # this rank's own width: PASS's trace must line up ranks
    width = ro.response_ids.shape[1]
    signal = saved["signal"][rows, :width]
    # float64 throughout (train.py's mask and outcome are float32): the advantages then agree to float64 round-off
    batch = train.Batch(ro, saved["outcome"][rows].double(), ro.response_mask.double(), rows, [""] * len(rows),
                        [""] * len(rows), n_train=len(rows), n_prm=len(rows))
    formats = saved["formats"][rows].double()
    results = {}
    for name, flags in ESTIMATORS.items():
        # no reference regulariser (PASS's default --kl-coef 1e-2 needs a reference model; the split is what is tested)
        args = config.Args(**{"n_samples": K, "max_tokens_per_micro_batch": 0, "micro_batch_size": 3, "kl_coef": 0.0,
                              **flags})
        policy = AutoModelForCausalLM.from_pretrained(saved["model"], dtype=torch.float64)
        if args.lora_rank:  # the adapter, A and B random (B = 0 would leave A no gradient), the same on every rank
            policy = models.Adapter(models.with_adapters(policy, args), "policy")
            generator = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in policy.parameters():
                    p.copy_(0.1 * torch.randn(p.shape, generator=generator, dtype=torch.float64))
        start = [p.detach().clone() for p in policy.parameters()]
        run_models = Models(saved["model"], AutoTokenizer.from_pretrained(saved["model"]), ddp.wrap_ddp(policy, d), None)
        run_models.policy_opt = torch.optim.SGD(run_models.policy.parameters(), lr=1.0)
        critic_start = []
        if args.estimator == "ppo":
            torch.manual_seed(0)  # the critic's fresh head: the same on every rank and in every run
            critic = AutoModelForTokenClassification.from_pretrained(saved["model"], num_labels=1, dtype=torch.float64)
            critic_start = [p.detach().clone() for p in critic.parameters()]
            run_models.critic = ddp.wrap_ddp(critic, d)
            run_models.critic_opt = torch.optim.SGD(run_models.critic.parameters(), lr=1.0)
        batch = train.with_plans(batch, args, d)
        batch.health = {}  # this estimator's update only
        process = train.process_rewards(args, signal, None, batch.train_mask, batch.outcome, d)
        adv, *targets = train.advantages(args, run_models, batch, process, signal, None, formats, d)
        train.update_policy(args, run_models, batch, None, adv, None, d)
        if run_models.critic is not None:
            train.update_critic(args, run_models, batch, targets, d)
        returns = (batch.outcome[:, None] + process.sum(-1, keepdim=True)).expand_as(batch.train_mask)
        health = runlog.health_metrics(ro, batch.train_mask, adv, returns, batch.health,
                                       {"actor": run_models.policy_opt, "prm": None}, d)
        results[name] = dict(rows=rows, adv=adv.detach(), health=health,
                             policy_delta=[p.detach() - s for p, s in zip(policy.parameters(), start)],
                             critic_delta=[p.detach() - s for p, s in zip(ddp.unwrap(run_models.critic).parameters(),
                                                                          critic_start)] if critic_start else [])
        del run_models, policy
        gc.collect()  # no DDP model may outlive the process group (see microbatch_ddp_worker.py)
    return results


if __name__ == "__main__":
    d = ddp.setup_distributed()
    results = run(torch.load(sys.argv[1], weights_only=False), d)
    torch.save(results, f"{sys.argv[2]}{d.rank}.pt")
    gc.collect()
    ddp.close(d)
