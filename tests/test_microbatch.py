"""Micro-batches: fixed row counts or a token budget (--max-tokens-per-micro-batch), trimmed of
padding, and a loss that does not depend on the split (--loss-mean global) in one process and under
DDP. Gradients are read off a real optimizer step: SGD with lr 1 moves each parameter by minus its
gradient, checked in float64 (and float32, the CPU training dtype) against autograd of the whole batch in one forward."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

import config
import ddp
import microbatch
import memory
import prime
import toy_task
import train
from rollout import HFRollout, Rollout

from conftest import SFT_STEPS, free_port

REPO = Path(__file__).resolve().parents[1]


def synthetic_rollout(prompt_lens, response_lens) -> Rollout:
    """Rows with the given lengths in the rollout layout (prompts left-padded, responses right-padded)."""
    P, R = max(prompt_lens), max(response_lens)
    positions_p, positions_r = torch.arange(P)[None], torch.arange(R)[None]
    prompt_mask = (positions_p >= P - torch.tensor(prompt_lens)[:, None]).long()
    response_mask = (positions_r < torch.tensor(response_lens)[:, None]).long()
    ids = lambda m: torch.where(m.bool(), 5, 0)
    return Rollout(ids(prompt_mask), prompt_mask, ids(response_mask), response_mask,
                   torch.zeros(len(prompt_lens), dtype=torch.bool))


# ---------------------------------------------------------------------------------------------------
# the plans
# ---------------------------------------------------------------------------------------------------


def test_trimmed_drops_only_the_padding_no_row_uses():
    ro = synthetic_rollout([3, 5, 2], [4, 1, 7]).select(torch.tensor([0, 2]))  # row 1 (the widest prompt) left out
    t = ro.trimmed()
    assert t.prompt_ids.shape == (2, 3) and t.response_ids.shape == (2, 7)
    assert t.prompt_mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    assert t.response_mask.sum(1).tolist() == [4, 7]
    short = synthetic_rollout([3, 5, 2], [4, 1, 7]).select(torch.tensor([0, 1])).trimmed()
    assert short.prompt_ids.shape == (2, 5) and short.response_ids.shape == (2, 4)


def test_fixed_plan_is_consecutive_rows_and_pads_short_ranks_with_zero_weight():
    ro = synthetic_rollout([2] * 6, [3, 1, 4, 1, 5, 9])
    args = config.Args(max_tokens_per_micro_batch=0, micro_batch_size=2)
    plan = microbatch.plan_update(ro, 5, args, ddp.Dist())
    assert [(mb.rows.tolist(), mb.width, mb.weight) for mb in plan[0]] == \
        [([0, 1], 3, 1.0), ([2, 3], 4, 1.0), ([4], 5, 1.0)]
    # two optimizer steps: rows split 3 / 2 (contiguous), each packed on its own
    plan = microbatch.plan_update(ro, 5, config.Args(max_tokens_per_micro_batch=0, micro_batch_size=2, mini_batches=2), ddp.Dist())
    assert [[mb.rows.tolist() for mb in step] for step in plan] == [[[0, 1], [2]], [[3, 4]]]
    # nothing kept: no real micro-batch (a rank under DDP would get zero-weight repeats, see the torchrun test)
    assert microbatch.plan_update(ro, 0, args, ddp.Dist()) == [[]]


def test_token_budget_packs_by_length_and_covers_every_row_once(capsys):
    prompt_lens = [10, 12, 11, 10, 30, 10, 11, 12]
    response_lens = [5, 60, 7, 6, 200, 8, 55, 6]
    ro = synthetic_rollout(prompt_lens, response_lens)
    args = config.Args(max_tokens_per_micro_batch=150)
    microbatch._told_long_rows = False
    mbs = microbatch.pack_rows(ro, 0, 8, args)
    assert sorted(r for mb in mbs for r in mb.rows.tolist()) == list(range(8))
    # a micro-batch computes rows x its longest prompt + response: the 230-token row alone (over the
    # budget); 72 and 66 together, 2 x 72 = 144 <= 150 (a third row would make 216); then the five
    # short ones, 5 x 18 = 90
    assert [sorted(mb.rows.tolist()) for mb in mbs] == [[4], [1, 6], [0, 2, 3, 5, 7]]
    for mb in mbs:
        size = len(mb.rows) * max(prompt_lens[r] + response_lens[r] for r in mb.rows)
        assert size <= 150 or len(mb.rows) == 1
        assert mb.width == max(response_lens[r] for r in mb.rows.tolist())
    assert "a row of 230 tokens" in capsys.readouterr().out
    microbatch.pack_rows(ro, 0, 8, args)
    assert "a row of" not in capsys.readouterr().out  # said once
    # groups kept whole (the DPO loss): units of 2 rows
    mbs = microbatch.pack_rows(ro, 0, 8, args, unit=2)
    assert all(set(mb.rows.tolist()) == {r ^ 1 for r in mb.rows.tolist()} for mb in mbs)  # 2k with 2k + 1
    assert sorted(r for mb in mbs for r in mb.rows.tolist()) == list(range(8))


def test_token_budget_cut_is_the_best_of_every_cut_by_brute_force():
    """Fewest micro-batches, then fewest computed tokens: against every way of cutting the sorted rows
    into runs (2^(n-1) of them), on random lengths, with and without groups kept whole."""
    import itertools
    import random
    rng = random.Random(0)
    for trial in range(30):
        n, unit = rng.choice([(7, 1), (9, 1), (8, 2)])
        prompt_lens = [rng.randint(3, 30) for _ in range(n)]
        response_lens = [int(rng.lognormvariate(3, 0.8)) + 1 for _ in range(n)]
        budget = rng.choice([60, 120, 250])
        ro = synthetic_rollout(prompt_lens, response_lens)
        got = microbatch.pack_rows(ro, 0, n, config.Args(max_tokens_per_micro_batch=budget), unit=unit)
        total = [p + r for p, r in zip(prompt_lens, response_lens)]
        units = sorted([list(range(s, s + unit)) for s in range(0, n, unit)], key=lambda u: -max(total[r] for r in u))
        cost = lambda runs: (len(runs), sum(len(run) * max(total[r] for r in run) for run in runs))
        best = None
        for cuts in itertools.product([0, 1], repeat=len(units) - 1):
            runs, run = [], list(units[0])
            for cut, u in zip(cuts, units[1:]):
                if cut:
                    runs.append(run)
                    run = []
                run = run + u
            runs.append(run)
            if all(len(run) * max(total[r] for r in run) <= budget or len(run) == unit for run in runs):
                best = cost(runs) if best is None else min(best, cost(runs))
        assert cost([mb.rows.tolist() for mb in got]) == best, (trial, prompt_lens, response_lens, budget)
        assert sorted(r for mb in got for r in mb.rows.tolist()) == list(range(n))


def test_padding_share_falls_with_the_budget():
    """One long response among short ones: fixed micro-batches pad every row to it; the budget does not."""
    torch.manual_seed(0)
    response_lens = torch.randint(10, 60, (32,)).tolist()
    response_lens[7] = 400
    ro = synthetic_rollout([20] * 32, response_lens)
    real = sum(response_lens) + 20 * 32

    def padded(args):  # every prompt has 20 tokens: a micro-batch's longest sequence is 20 + its widest response
        return sum(len(mb.rows) * (20 + mb.width) for mb in microbatch.pack_rows(ro, 0, 32, args))

    assert padded(config.Args(max_tokens_per_micro_batch=0, micro_batch_size=8)) / real > 1.5
    assert padded(config.Args(max_tokens_per_micro_batch=600)) / real < 1.1


# ---------------------------------------------------------------------------------------------------
# gradients: the split changes nothing under --loss-mean global
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_batch(cache_dir):
    """12 real responses of unequal length (and prompts of unequal length) from the toy SFT model,
    with old log-probs a little off the policy (ratios != 1, some clipped) and random advantages."""
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(3)
    prompts = [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(6, seed=11, min_ops=2, max_ops=8)]
    ro = HFRollout(model, tokenizer, max_new_tokens=64).generate(prompts, n=2)
    assert len(set(ro.response_mask.sum(1).tolist())) > 4 and len(set(ro.prompt_mask.sum(1).tolist())) > 2
    gen = torch.Generator().manual_seed(5)
    mask = ro.response_mask.double()
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    with torch.no_grad():
        logp = microbatch.response_logprobs(policy, ro, 0.7)
    logp_old = (logp + 0.3 * torch.randn(logp.shape, generator=gen, dtype=torch.float64)) * mask
    adv = torch.randn(logp.shape, generator=gen, dtype=torch.float64) * mask
    outcome = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0])
    return dict(path=path, ro=ro, mask=mask, logp=logp, logp_old=logp_old, adv=adv, outcome=outcome, temperature=0.7)


def policy_step(b, dtype=torch.float64, **flags):
    """One microbatch.run_update of the policy (in `dtype`) with these flags: (parameter change, logged losses)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(b["path"], dtype=dtype)
    start = [p.detach().clone() for p in model.parameters()]
    args = config.Args(**{"max_tokens_per_micro_batch": 0, **flags})
    ro, mask = b["ro"], b["mask"].to(dtype)
    logp_old, adv = b["logp_old"].to(dtype), b["adv"].to(dtype)

    def loss_fn(mb):
        logp = microbatch.response_logprobs(model, mb.rollout(ro), b["temperature"])
        return prime.ppo_clip_loss(logp, mb.rows_of(logp_old), mb.rows_of(adv), mb.rows_of(mask), 0.2)

    losses = microbatch.run_update(model, torch.optim.SGD(model.parameters(), lr=1.0), loss_fn,
                              lambda mb: float(mb.rows_of(mask).sum()), microbatch.plan_update(ro, len(ro), args, ddp.Dist()),
                              args, ddp.Dist(), 1e9)
    return [p.detach() - s for p, s in zip(model.parameters(), start)], losses


def whole_batch_gradient(b, rows=None):
    """Autograd of Eq. 6's token mean over the given rows in one forward, untrimmed: minus the gradient."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(b["path"], dtype=torch.float64)
    rows = torch.arange(len(b["ro"])) if rows is None else rows
    logp = microbatch.response_logprobs(model, b["ro"].select(rows), b["temperature"])
    loss = prime.ppo_clip_loss(logp, b["logp_old"][rows], b["adv"][rows], b["mask"][rows], 0.2)
    loss.backward()
    return [-p.grad for p in model.parameters()], loss.item()


def assert_same(a, b, tol=1e-5):
    worst = max(((x - y).abs().max() / y.abs().max().clamp(min=1e-12)).item() for x, y in zip(a, b))
    assert worst < tol, worst


@pytest.mark.parametrize("flags", [dict(micro_batch_size=64), dict(micro_batch_size=3), dict(micro_batch_size=5),
                                   dict(max_tokens_per_micro_batch=200), dict(max_tokens_per_micro_batch=1)])
def test_policy_gradient_and_loss_do_not_depend_on_the_split(toy_batch, flags):
    expected, expected_loss = whole_batch_gradient(toy_batch)
    delta, losses = policy_step(toy_batch, **flags)
    assert_same(delta, expected)
    assert losses == pytest.approx([expected_loss], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("flags", [dict(micro_batch_size=3), dict(max_tokens_per_micro_batch=200)])
def test_float32_policy_gradient_of_a_split_batch_matches_the_float64_whole_batch(toy_batch, flags):
    """The dtype training runs in on CPU (float32; the in-place logits bug was float32-only): split
    into micro-batches at T = 0.7, its gradient is the float64 whole-batch gradient up to float32 round-off."""
    expected, expected_loss = whole_batch_gradient(toy_batch)
    delta, losses = policy_step(toy_batch, dtype=torch.float32, **flags)
    assert all(d.dtype == torch.float32 for d in delta)
    # The tolerance is float32's round-off bound for this model, not what one CPU printed: a log-prob
    # accumulates at most L * (H + I) rounded products (3 layers of 128-wide attention and 512-wide
    # MLP reductions), each off by eps at most, so it is relatively off by at most
    # L * (H + I) * eps = 2.3e-4, and so is each loss term ratio * A. The loss is a mean of such
    # terms with random advantages that mostly cancel (|loss| is ~20x below their mean size), so its
    # error is bounded against the terms' mean size, not against the loss. A real bug (temperature
    # applied twice, a stale micro-batch) is off by percents.
    shape = AutoConfig.from_pretrained(toy_batch["path"])
    bound = shape.num_hidden_layers * (shape.hidden_size + shape.intermediate_size) * torch.finfo(torch.float32).eps
    b = toy_batch
    term_size = ((b["logp"] - b["logp_old"]).exp() * b["adv"]).abs().sum() / b["mask"].sum()
    assert_same([d.double() for d in delta], expected, tol=bound)
    assert abs(losses[0] - expected_loss) <= bound * float(term_size), (losses[0], expected_loss)


def test_two_optimizer_steps_split_the_rows_the_same_way_whatever_the_micro_batches(toy_batch):
    fixed, fixed_losses = policy_step(toy_batch, micro_batch_size=2, mini_batches=2)
    budget, budget_losses = policy_step(toy_batch, max_tokens_per_micro_batch=250, mini_batches=2)
    assert_same(budget, fixed)
    assert budget_losses == pytest.approx(fixed_losses, rel=1e-9)
    first = whole_batch_gradient(toy_batch, torch.arange(6))[1]
    assert len(fixed_losses) == 2 and fixed_losses[0] == pytest.approx(first, rel=1e-9)


def test_micro_mean_is_the_mean_of_micro_batch_means_and_depends_on_the_split(toy_batch):
    delta, losses = policy_step(toy_batch, micro_batch_size=5, loss_mean="micro")
    # rows 0-4, 5-9, 10-11: the plain mean of the three micro-batches' token means
    means = [whole_batch_gradient(toy_batch, torch.arange(a, b)) for a, b in ((0, 5), (5, 10), (10, 12))]
    expected = [sum(g[i] for g, _ in means) / 3 for i in range(len(delta))]
    assert_same(delta, expected)
    assert losses == pytest.approx([sum(loss for _, loss in means) / 3], rel=1e-9)
    global_delta, _ = policy_step(toy_batch, micro_batch_size=5)
    assert max((a - b).abs().max().item() for a, b in zip(delta, global_delta)) > 1e-4


@pytest.mark.parametrize("prm_loss", ["ce", "dpo"])
def test_prm_update_and_rewards_do_not_depend_on_the_split(toy_batch, prm_loss):
    """implicit_prm_step: the PRM's CE (or DPO) update is a response mean over the whole batch, and
    the rewards (from the same forward) are the same, whatever the split."""
    from transformers import AutoModelForCausalLM
    b = toy_batch
    ref = AutoModelForCausalLM.from_pretrained(b["path"], dtype=torch.float64)
    logp_ref = microbatch.logprobs_no_grad(ref, b["ro"], config.Args())
    results = []
    for flags in (dict(micro_batch_size=64), dict(micro_batch_size=4), dict(max_tokens_per_micro_batch=120)):
        prm = AutoModelForCausalLM.from_pretrained(b["path"], dtype=torch.float64)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # off the reference, so that the rewards are not all 0
            for p in prm.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
        start = [p.detach().clone() for p in prm.parameters()]
        args = config.Args(**{"n_samples": 2, "prm_loss": prm_loss, "beta": 0.5, "max_tokens_per_micro_batch": 0, **flags})
        batch = train.with_plans(train.Batch(b["ro"], b["outcome"].double(), b["mask"], None, [], [], len(b["ro"]),
                                             len(b["ro"])), args, ddp.Dist())
        rewards, losses = train.implicit_prm_step(prm, torch.optim.SGD(prm.parameters(), lr=1.0), batch, logp_ref,
                                                  args, ddp.Dist())
        results.append(([p.detach() - s for p, s in zip(prm.parameters(), start)], rewards, losses))
    for delta, rewards, losses in results[1:]:
        assert_same(delta, results[0][0])
        assert torch.allclose(rewards, results[0][1], atol=1e-10)
        assert losses == pytest.approx(results[0][2], rel=1e-6)  # (token_logprobs returns float32)
    assert results[0][1].abs().sum() > 0 and any(d.abs().max() > 0 for d in results[0][0])


def test_a_step_with_nothing_kept_on_any_rank_leaves_the_weights_alone(toy_batch):
    """Only zero-weight repeats (every rank's filter kept nothing): no optimizer step. AdamW stepping
    on the zero gradients would still move every weight by its momentum and its weight decay."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(toy_batch["path"], dtype=torch.float64)
    ro, mask = toy_batch["ro"], toy_batch["mask"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def loss_fn(mb):
        logp = microbatch.response_logprobs(model, mb.rollout(ro))
        return prime.ppo_clip_loss(logp, mb.rows_of(toy_batch["logp_old"]), mb.rows_of(toy_batch["adv"]), mb.rows_of(mask), 0.2)

    count, args = lambda mb: float(mb.rows_of(mask).sum()), config.Args()
    microbatch.run_update(model, optimizer, loss_fn, count, microbatch.plan_update(ro, len(ro), args, ddp.Dist()), args,
                     ddp.Dist(), 1.0)  # a real step first: AdamW now has momentum
    before = [p.detach().clone() for p in model.parameters()]
    repeats = [[microbatch.MicroBatch(torch.tensor([0]), 5, weight=0.0)] * 2]
    assert microbatch.run_update(model, optimizer, loss_fn, count, repeats, args, ddp.Dist(), 1.0) == []
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_response_logprobs_and_values_equal_each_row_run_alone_without_padding(toy_batch, cache_dir):
    """forward_sequences packs each row's prompt + response into one left-padded sequence and
    to_response_columns puts response token t back in column t: the log-probs (at T = 0.7) and the
    critic's values equal those of each row fed alone, with no padding at all, by a plain loop."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification
    model = AutoModelForCausalLM.from_pretrained(toy_batch["path"], dtype=torch.float64)
    critic = AutoModelForTokenClassification.from_pretrained(toy_batch["path"], num_labels=1, dtype=torch.float64)
    ro = toy_batch["ro"]
    with torch.no_grad():
        logp, values = microbatch.response_logprobs(model, ro, 0.7), microbatch.critic_values(critic, ro)
        for i in range(len(ro)):
            prompt = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
            response = ro.response_ids[i][ro.response_mask[i].bool()]
            ids = torch.cat([prompt, response])[None]
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1] / 0.7  # the prediction of each response token
            alone = torch.log_softmax(logits, -1).gather(-1, response[:, None]).squeeze(-1)
            v = critic(input_ids=ids).logits[0, len(prompt) - 1:-1, 0]  # the state before each response token
            L = len(response)
            assert torch.allclose(logp[i, :L].double(), alone, atol=1e-5) and (logp[i, L:] == 0).all()
            assert torch.allclose(values[i, :L].double(), v, atol=1e-5) and (values[i, L:] == 0).all()
    assert len(set(ro.response_mask.sum(1).tolist())) > 1 and len(set(ro.prompt_mask.sum(1).tolist())) > 1


def test_no_grad_passes_equal_the_whole_batch_forward(toy_batch):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(toy_batch["path"], dtype=torch.float64)
    ro = toy_batch["ro"]
    with torch.no_grad():
        whole = microbatch.response_logprobs(model, ro, 0.7)
    for args in (config.Args(max_tokens_per_micro_batch=0, micro_batch_size=5), config.Args(max_tokens_per_micro_batch=100)):
        got = microbatch.logprobs_no_grad(model, ro, args, 0.7)
        assert got.shape == whole.shape and torch.allclose(got, whole.float(), atol=1e-6)


def test_two_ranks_with_unequal_rows_give_the_whole_batch_gradient(toy_batch, tmp_path):
    """torchrun, 2 ranks: rank 0 holds 3 short-and-long rows, rank 1 nine; then rank 0 keeps nothing.
    DDP's average over ranks is undone: each step is the token mean over every row of both ranks."""
    batch = tmp_path / "batch.pt"
    torch.save(dict(rollout=toy_batch["ro"], logp_old=toy_batch["logp_old"], adv=toy_batch["adv"],
                    temperature=toy_batch["temperature"], model=toy_batch["path"]), batch)
    out = tmp_path / "out.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
                           str(free_port()), str(REPO / "tests" / "microbatch_ddp_worker.py"), str(batch), str(out)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = torch.load(out, weights_only=False)
    expected, expected_loss = whole_batch_gradient(toy_batch)
    for case in ("uneven-fixed", "uneven-budget"):
        assert_same(results[case]["delta"], expected)
        assert results[case]["losses"] == pytest.approx([expected_loss], rel=1e-9)
    assert results["uneven-fixed"]["micro_batches"] == 5  # rank 1's nine rows in 2s; rank 0 repeats 3 times
    expected, expected_loss = whole_batch_gradient(toy_batch, torch.arange(2, 12))
    assert_same(results["rank0-kept-nothing"]["delta"], expected)
    assert results["rank0-kept-nothing"]["losses"] == pytest.approx([expected_loss], rel=1e-9)


def test_train_runs_with_a_token_budget_log_the_same_first_step_losses(cache_dir, tmp_path):
    """The real entry point: the same seed with fixed micro-batches of 3 rows and with a token budget
    logs the same PRM and policy losses at the first iteration. Two optimizer steps an iteration, so
    that the logged losses are not the trivial ones of the first step (ln 2 for the PRM, ~0 for the
    policy at ratio 1)."""
    from test_train import metrics_of, train_here
    for name, flags in (("fixed", ["--micro-batch-size", "3"]), ("budget", ["--max-tokens-per-micro-batch", "160"])):
        train_here(["--steps", "1", "--run-name", name, "--eval-problems", "4", "--mini-batches", "2", *flags],
                   cache_dir, tmp_path)  # one after the other, in this process: the same thread count
    fixed, budget = metrics_of(tmp_path / "fixed")[0], metrics_of(tmp_path / "budget")[0]
    assert fixed["kept_groups"] == budget["kept_groups"] > 0
    assert abs(fixed["prm_loss"] - 0.6931) > 1e-3 and abs(fixed["policy_loss"]) > 1e-5
    assert budget["prm_loss"] == pytest.approx(fixed["prm_loss"], rel=1e-5)
    # float32 round-off of the first step's gradients, through Adam's first update (about sign(g) x lr,
    # so entries whose gradient is near 0 move by round-off), shows in the second step's ratio: 2e-4 here
    assert budget["policy_loss"] == pytest.approx(fixed["policy_loss"], rel=2e-3)


# ---------------------------------------------------------------------------------------------------
# the memory estimate
# ---------------------------------------------------------------------------------------------------


def test_memory_estimate_arithmetic_by_hand():
    """memory.memory_estimate_gb's terms worked out by hand (tests/test_memory.py checks them against
    the bytes real updates hold)."""
    from transformers import Qwen2Config
    shape = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2)
    n = 2_000_000
    args = config.Args(max_tokens_per_micro_batch=0, micro_batch_size=4, max_prompt_len=100, max_response_len=300,
                       precision="fp32", rollout="hf", prompts_per_step=8, eval_problems=8, eval_samples=4)
    est = memory.memory_estimate_gb(n, args, shape)
    # state: policy and PRM 16 bytes a parameter, the fp32 reference 4
    assert est["policy (weights, grads, AdamW)"] == est["prm (weights, grads, AdamW)"] == pytest.approx(0.032)
    assert est["reference (fp32, frozen)"] == pytest.approx(0.008)
    # 4 rows x 400 tokens = 1600 tokens, 4 x 301 = 1204 positions; a layer keeps per token
    # 4 x 256 x 4 + 40 x 64 + 4 x 4 heads = 6672 bytes, and the fp32 mask 1600 x 400 x 4
    layer = 1600 * 6672 + 1600 * 400 * 4
    once = 1600 * 64 * 4 * 2 + 1204 * 64 * 4 + 1600 * 400 + 64 * 1600
    assert est["  update: activations (every layer)"] == pytest.approx((3 * layer + once) / 1e9)
    # logits and their gradient, fp32, and two chunks of one row's 301 positions
    logits = 2 * 1204 * 1000 * 4 + 2 * 301 * 1000 * 4
    assert est["  update: logits and their gradient"] == pytest.approx(logits / 1e9)
    assert est["  update: autocast's bf16 weight copies"] == 0.0
    head = 1000 * 64 * 4  # the output layer's fp32 weight gradient before it reaches .grad
    assert est["  update: the output layer's gradient before its bucket"] == pytest.approx(head / 1e9)
    # sampling: HF generate's KV cache, 32 sequences x 400 tokens x 3 layers x (k, v) x 2 heads x 16, fp32
    assert est["phase: sampling (HF generate's KV cache)"] == pytest.approx(32 * 400 * 3 * 2 * 32 * 4 / 1e9)
    update = (3 * layer + once + logits + head) / 1e9
    assert est["phase: update"] == pytest.approx(update)
    # on a GPU (cuda=True, the default) one rank without NCCL or vLLM holds its CUDA context beside the tensors
    assert est["beyond tensors: CUDA context and library workspaces"] == memory.CUDA_CONTEXT_GB
    assert est["total"] == pytest.approx(1.1 * (0.072 + update) + memory.CUDA_CONTEXT_GB)
    assert memory.memory_estimate_gb(n, args, shape, cuda=False)["total"] == pytest.approx(
        1.1 * (0.072 + max(update, 2 * 0.008)))  # CPU: foreach AdamW's temporaries, nothing beyond tensors
    # a token budget of 1000 with checkpointing in bf16, the reference the old policy: each layer keeps
    # its input (64 fp32), the peak is the larger of the logits and one recomputed layer; bf16 weight
    # copies of every decoder weight (the tied embedding is the head, kept fp32)
    args = config.Args(max_tokens_per_micro_batch=1000, gradient_checkpointing=True, reference="policy",
                       precision="bf16", max_prompt_len=100, max_response_len=300, rollout="vllm",
                       vllm_gpu_memory_utilization=0.5)
    est = memory.memory_estimate_gb(n, args, shape, gpu_gb=0.2)
    assert "reference (fp32, frozen)" not in est
    once = 1000 * 64 * 4 * 2 + 1000 * 64 * 4 + 1000 * 400 + 64 * 1000
    assert est["  update: activations (each layer's input)"] == pytest.approx((3 * 1000 * 64 * 4 + once) / 1e9)
    logits = 2 * 1000 * 1000 * 4 + 2 * 301 * 1000 * 4
    layer = 1000 * (4 * 256 * 2 + 36 * 64 + 16) + 1000 * 400 * 2 + 1000 * (2 * 256 + 2 * 64) * 2
    assert est["  update: logits or one recomputed layer"] == pytest.approx(max(logits, layer) / 1e9)
    assert est["  update: autocast's bf16 weight copies"] == pytest.approx(2 * (n - 1000 * 64) / 1e9)
    # vLLM's share (0.5 of 0.2 GB) beside the update, which it does not sleep through
    assert est["phase: update beside vLLM's share"] == pytest.approx(
        (3 * 1000 * 64 * 4 + once + max(logits, layer) + 2 * (n - 64000) + head) / 1e9 + 0.1)
    # awake, vLLM's CUDA-graph pool is inside its share (vLLM 0.32 sizes its KV cache after it); asleep, the
    # share leaves the update and the pool stays beside it
    assert not any("graph" in k for k in est)
    asleep = memory.memory_estimate_gb(n, dataclasses.replace(args, vllm_sleep=True), shape, gpu_gb=0.2)
    assert asleep["  update: vLLM's CUDA-graph pool (kept through sleep)"] == pytest.approx(memory.VLLM_GRAPHS_GB)
    assert asleep["phase: update"] == pytest.approx(est["phase: update beside vLLM's share"] - 0.1 + memory.VLLM_GRAPHS_GB)
    # 8 ranks: NCCL's buffers for DDP's group and vLLM's; --offload-optimizer: 8 bytes a parameter leave the
    # state, and the updating model's moments join its update
    off = memory.memory_estimate_gb(n, dataclasses.replace(args, offload_optimizer=True), shape, gpu_gb=0.2, world=8)
    assert off["beyond tensors: NCCL buffers (2 groups of 8 ranks)"] == 2 * memory.NCCL_GB_PER_GROUP
    assert off["policy (weights, grads; AdamW on the CPU)"] == off["prm (weights, grads; AdamW on the CPU)"] == \
        pytest.approx(0.016)
    assert off["  update: its AdamW moments, back on the GPU"] == pytest.approx(0.016)


def test_the_first_steps_memory_line_puts_the_estimate_beside_the_measured_peak(cache_dir):
    """(train.py prints it on a GPU with memory.measured_memory's figures; the arithmetic is the same here.)"""
    from transformers import AutoModelForCausalLM
    policy = AutoModelForCausalLM.from_pretrained(toy_task.sft_checkpoint(cache_dir, SFT_STEPS))
    args = config.Args(rollout="hf")
    est = memory.memory_estimate_gb(sum(p.numel() for p in policy.parameters()), args, policy.config, 80.0)["total"]
    measured = {"allocated": 1.234, "reserved": 1.5, "device": 2.75, "device_total": 80.0}
    assert memory.memory_line(policy, args, measured) == (
        f"memory per GPU after the first step: estimated {est:.2f} GB (1.00 of it beyond tensors, the allocator's "
        "margin included); the allocator's peaks 1.23 GB allocated, 1.50 GB reserved; the device in use now 2.75 "
        "of 80.00 GB (torch.cuda.mem_get_info)")

