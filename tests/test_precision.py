"""--precision bf16 (autocast forward passes over fp32 weights, the output layer in fp32) against fp32, and
the pairs of passes that must agree exactly: the reference with the PRM, pi_old with the policy."""

import math

import pytest
import torch

import config
import ddp
import microbatch
import models as models_module
import prime
import toy_task
import train
from conftest import SFT_STEPS
from rollout import HFRollout

K = 4


def batch_of(models, seed=0):
    """A step's batch of 16 toy responses (4 prompts x 4), every group mixed: what the filter keeps."""
    tokenizer = models.tokenizer
    torch.manual_seed(seed)
    problems = toy_task.make_problems(4, seed=31, min_ops=2, max_ops=8)
    ro = HFRollout(ddp.unwrap(models.policy), tokenizer, 64).generate(
        [tokenizer(p.prompt)["input_ids"] for p in problems], n=K)
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0] * 4)
    return train.Batch(ro, outcome, ro.response_mask.float(), torch.arange(len(ro)), [""] * len(ro),
                       [""] * len(ro), n_train=len(ro), n_prm=len(ro))


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # on a GPU (bench/run_gpu_checks.sh) both


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", [["--max-tokens-per-micro-batch", "160"], ["--micro-batch-size", "3"]],
                         ids=["token-budget", "rows"])
def test_first_mini_batch_reward_is_exactly_zero_and_ratio_exactly_one(precision, layout, device, cache_dir,
                                                                        monkeypatch):
    """At the start the PRM, the reference and pi_old are the same weights: on the first mini-batch of
    the first step the implicit reward must be exactly 0 and the PPO ratio exactly 1, in both precisions,
    whatever the micro-batching (each no-grad pass runs in the micro-batches of the update it pairs
    with). The second mini-batch follows models updated on the first, as in the official code, so its
    rewards and ratios move away from 0 and 1: the check is not vacuous."""
    args = config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--precision", precision,
                              "--mini-batches", "2", "--rollout", "hf", *layout])
    d = ddp.Dist(device=torch.device(device))
    models = models_module.build_models(args, d)
    b = batch_of(models)
    b.outcome, b.mask = b.outcome.to(d.device), b.mask.to(d.device)
    b = train.with_plans(b, args, d)
    prm_plan = b.prm_plan
    first = torch.cat([mb.rows for mb in prm_plan[0]])
    logp_ref = microbatch.logprobs_no_grad(models.reference, b.rollout, args, plan=prm_plan)
    reward, _ = train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d)
    assert reward[first].abs().max().item() == 0.0
    later = torch.cat([mb.rows for mb in prm_plan[1]])
    assert reward[later].abs().max().item() > 0  # the PRM has taken a step by then

    ratios = []  # (max |log rho| of each micro-batch's loss), in the order the update computes them
    ppo_clip_loss = prime.ppo_clip_loss
    monkeypatch.setattr(prime, "ppo_clip_loss", lambda logp, old, *a, **k: (
        ratios.append((logp.detach() - old).abs().max().item()), ppo_clip_loss(logp, old, *a, **k))[1])
    plan = b.plan
    logp_old = microbatch.logprobs_no_grad(ddp.unwrap(models.policy), b.rollout, args, args.temperature, plan)
    adv = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(1)).to(d.device) * b.mask
    train.update_policy(args, models, b, logp_old, adv, None, d)
    n_first = len(plan[0])
    assert ratios[:n_first] == [0.0] * n_first, ratios
    assert max(ratios[n_first:]) > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_reward_zero_and_ratio_one_through_ddp_with_gradient_checkpointing(precision, device, cache_dir,
                                                                          monkeypatch):
    """The same exact pairing as the node runs it: every model wrapped in DistributedDataParallel (a
    process group of one: gloo on CPU, NCCL on a GPU) with gradient checkpointing, so the update's
    forward goes through DDP and recomputes its activations in the backward."""
    import socket
    import torch.distributed as dist
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.TCPStore("127.0.0.1", port, 1, True),
                            rank=0, world_size=1)
    try:
        args = config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--precision",
                                  precision, "--mini-batches", "2", "--rollout", "hf", "--gradient-checkpointing",
                                  "--max-tokens-per-micro-batch", "160"])
        d = ddp.Dist(device=torch.device(device))
        models = models_module.build_models(args, d)
        assert isinstance(models.policy, torch.nn.parallel.DistributedDataParallel)
        assert isinstance(models.prm, torch.nn.parallel.DistributedDataParallel)
        b = batch_of(models)
        b.outcome, b.mask = b.outcome.to(d.device), b.mask.to(d.device)
        b = train.with_plans(b, args, d)
        logp_ref = microbatch.logprobs_no_grad(models.reference, b.rollout, args, plan=b.prm_plan)
        reward, _ = train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d)
        first = torch.cat([mb.rows for mb in b.prm_plan[0]])
        assert reward[first].abs().max().item() == 0.0
        ratios = []
        ppo_clip_loss = prime.ppo_clip_loss
        monkeypatch.setattr(prime, "ppo_clip_loss", lambda logp, old, *a, **k: (
            ratios.append((logp.detach() - old).abs().max().item()), ppo_clip_loss(logp, old, *a, **k))[1])
        logp_old = microbatch.logprobs_no_grad(ddp.unwrap(models.policy), b.rollout, args, args.temperature, b.plan)
        adv = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(1)).to(d.device) * b.mask
        train.update_policy(args, models, b, logp_old, adv, None, d)
        assert ratios[:len(b.plan[0])] == [0.0] * len(b.plan[0]), ratios
        assert max(ratios[len(b.plan[0]):]) > 0
    finally:
        import gc
        del models
        gc.collect()  # no DDP model may outlive the group (pytorch#56297)
        dist.destroy_process_group()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_with_the_policy_as_reference_the_first_reward_is_exactly_zero_at_any_temperature(precision, device,
                                                                                          cache_dir):
    """--reference policy samples at T = 0.7: Eq. 3 compares the PRM and the reference at one temperature,
    1, so the reward of the first mini-batch is exactly 0 (pi_old's log-probs at 0.7, which the PPO ratio
    uses, would give log pi(y) - log pi_0.7(y), not 0), while the ratio's own pi_old stays at 0.7."""
    args = config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--precision", precision,
                              "--mini-batches", "2", "--rollout", "hf", "--reference", "policy", "--temperature", "0.7",
                              "--max-tokens-per-micro-batch", "160"])
    d = ddp.Dist(device=torch.device(device))
    models = models_module.build_models(args, d)
    assert models.reference is None
    b = batch_of(models)
    b.outcome, b.mask = b.outcome.to(d.device), b.mask.to(d.device)
    b = train.with_plans(b, args, d)
    logp_old = microbatch.logprobs_no_grad(ddp.unwrap(models.policy), b.rollout, args, args.temperature, b.plan)
    logp_ref = train.reference_logprobs(args, models, b, logp_old)
    first = torch.cat([mb.rows for mb in b.prm_plan[0]])
    assert (logp_ref - logp_old)[first].abs().max().item() > 1e-3  # two temperatures: not the same numbers
    reward, _ = train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d)
    assert reward[first].abs().max().item() == 0.0


def test_bf16_log_probs_and_gradient_agree_with_fp32_within_the_bound(cache_dir):
    """The same policy, batch and PPO loss in fp32 and under bf16 autocast (the head in fp32). bf16
    keeps 8 bits of mantissa: each matmul rounds its inputs to a relative u = 2^-8. A value passes
    through about 6 matmuls per layer (q/k/v, QK^T, AV, o; gate/up, down) on its way forward, and as
    many back: relative errors add up to at most 12 L u in the gradient (L = 3 layers here: 0.14), and
    to 6 L u of each logit in the log-probs, whose size is the logits' spread (|log p| <= 2 max|logit|)."""
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    u, L = 2.0 ** -8, 3
    results = {}
    for precision in ("fp32", "bf16"):
        args = config.Args(precision=precision, max_tokens_per_micro_batch=0, micro_batch_size=64)
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if precision == "bf16":
            models_module.keep_head_fp32(policy)
        torch.manual_seed(0)
        ro = HFRollout(policy, tokenizer, 48).generate(
            [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(4, seed=9)], n=2)
        with microbatch.autocast(args):
            logp = microbatch.response_logprobs(policy, ro, 0.7)
            logits = policy(input_ids=ro.prompt_ids[:1], attention_mask=ro.prompt_mask[:1]).logits
        assert logits.dtype == torch.float32  # the head computes in fp32 under autocast too
        mask = ro.response_mask.float()
        adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2)) * mask
        loss = prime.ppo_clip_loss(logp, logp.detach() + 0.1 * mask, adv, mask, 0.2)
        grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(policy.parameters()))])
        results[precision] = (logp.detach(), grad, logits.detach().abs().max().item())
    (logp32, g32, max_logit), (logp16, g16, _) = results["fp32"], results["bf16"]
    mask = ro.response_mask.bool()
    logp_error = (logp16 - logp32)[mask].abs().max().item()
    grad_error = ((g16 - g32).norm() / g32.norm()).item()
    print(f"bf16 vs fp32: max |delta log p| {logp_error:.2e} (bound {6 * L * u * 2 * max_logit:.2e}), "
          f"gradient relative error {grad_error:.2e} (bound {12 * L * u:.2e})")
    assert 0 < logp_error <= 6 * L * u * 2 * max_logit
    assert 0 < grad_error <= 12 * L * u
    assert math.isfinite(grad_error)


def test_paired_layout_is_the_updates_micro_batches_then_the_rest(cache_dir):
    """The no-grad pass of a pair runs each row in the micro-batch the update puts it in. (On this CPU a
    row's log-probs do not depend on its neighbours, so the exact-0 test above would pass with any
    layout; GPU kernels choose their algorithms by batch shape, where the layout matters.)"""
    args = config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--mini-batches", "2",
                              "--max-tokens-per-micro-batch", "160", "--rollout", "hf"])
    d = ddp.Dist()
    models = models_module.build_models(args, d)
    b = batch_of(models)
    b.n_prm = 12  # the PRM learns from the first 12 rows (e.g. --prm-groups mixed)
    plan = train.with_plans(b, args, d).prm_plan
    layout = microbatch.paired_layout(b.rollout, args, plan)
    rows = [mb.rows.tolist() for mb in layout]
    assert rows[:sum(len(s) for s in plan)] == [mb.rows.tolist() for s in plan for mb in s]
    assert rows[sum(len(s) for s in plan):] == [mb.rows.tolist() for mb in microbatch.pack_rows(b.rollout, 12, 16, args)]
    assert sorted(sum(rows, [])) == list(range(16))  # every row once
    assert rows != [mb.rows.tolist() for mb in microbatch.pack_rows(b.rollout, 0, 16, args)]  # not one pass's layout
