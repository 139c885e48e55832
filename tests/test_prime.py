"""prime.py against values worked out independently: plain Python loops or numbers by hand."""

import math

import pytest
import torch

import prime

torch.set_default_dtype(torch.float32)


def ragged_batch(lengths, T=None, seed=0):
    """Random (B, T) rewards with right padding filled with garbage, and the matching mask."""
    g = torch.Generator().manual_seed(seed)
    T = T or max(lengths)
    mask = torch.zeros(len(lengths), T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    x = torch.randn(len(lengths), T, generator=g)
    x = torch.where(mask.bool(), x, torch.full_like(x, 1e6))  # padding must never leak
    return x, mask


# --------------------------------------------------------------------------- token_logprobs


def test_token_logprobs_matches_naive_log_softmax_values_and_grads():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, 50, (3, 7), generator=g)
    for temperature in (1.0, 0.7):
        ours = prime.token_logprobs(logits, labels, temperature, chunk_elements=200)  # 4 rows a chunk
        naive = torch.log_softmax(logits.float() / temperature, -1).gather(-1, labels[..., None])[..., 0]
        assert torch.allclose(ours, naive, atol=1e-5)
        weights = torch.randn(3, 7, generator=g)
        (g_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
        (g_naive,) = torch.autograd.grad((naive * weights).sum(), logits)
        assert torch.allclose(g_ours, g_naive, atol=1e-5)


def test_token_logprobs_by_hand():
    # logits [0, ln 3] -> probs [1/4, 3/4]
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    out = prime.token_logprobs(logits, torch.tensor([[1]]))
    assert out.item() == pytest.approx(math.log(0.75), abs=1e-6)
    # temperature 0.5 doubles the logits: [0, ln 9] -> probs [1/10, 9/10]
    out = prime.token_logprobs(logits, torch.tensor([[0]]), temperature=0.5)
    assert out.item() == pytest.approx(math.log(0.1), abs=1e-6)


def test_token_logprobs_bf16_logits_give_float32_and_bf16_grads():
    logits = torch.randn(2, 5, 11).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 11, (2, 5))
    out = prime.token_logprobs(logits, labels)
    assert out.dtype == torch.float32
    naive = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None])[..., 0]
    assert torch.allclose(out, naive, atol=1e-5)
    out.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_token_logprobs_shape_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="disagree"):
        prime.token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))


# --------------------------------------------------------------------------- implicit reward


def test_implicit_process_reward_by_hand_and_padding_is_exactly_zero():
    logp_prm = torch.tensor([[-1.0, -2.0, float("nan")]])
    logp_ref = torch.tensor([[-1.5, -1.0, -3.0]])
    mask = torch.tensor([[1, 1, 0]])
    r = prime.implicit_process_reward(logp_prm, logp_ref, mask, beta=0.05)
    # 0.05 * (-1 + 1.5) = 0.025; 0.05 * (-2 + 1) = -0.05; padding 0 even if the log-prob is nan
    assert r[0].tolist() == pytest.approx([0.025, -0.05, 0.0])
    assert r[0, 2].item() == 0.0


def test_process_rewards_and_ce_loss_at_initialisation():
    logp = torch.randn(8, 6)
    _, mask = ragged_batch([6, 5, 4, 3, 6, 1, 2, 6])
    r = prime.implicit_process_reward(logp, logp.clone(), mask, beta=0.05)
    assert torch.count_nonzero(r) == 0
    outcome = torch.tensor([1.0, 0, 0, 1, 0.3, 1, 0, 0])
    assert prime.prm_ce_loss(logp, logp.clone(), mask, outcome, 0.05).item() == pytest.approx(math.log(2))


def test_normalize_process_reward_by_hand():
    # rows: [1, -2, 0.5] -> return-to-go [-0.5, -1.5, 0.5]; [3, 1, pad] -> [4, 1]; max |rtg| = 4
    reward = torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = prime.normalize_process_reward(reward, mask)
    scale = 4.0 + 1e-6
    assert out[0].tolist() == pytest.approx([1 / scale, -2 / scale, 0.5 / scale], abs=1e-7)
    assert out[1].tolist() == pytest.approx([3 / scale, 1 / scale, 0.0], abs=1e-7)


# --------------------------------------------------------------------------- PRM losses


def test_prm_ce_loss_matches_loop_with_soft_labels():
    logp_prm, mask = ragged_batch([4, 2, 3], seed=1)
    logp_ref, _ = ragged_batch([4, 2, 3], seed=2)
    outcome = torch.tensor([1.0, 0.0, 0.25])
    beta = 0.5
    expected = 0.0
    for i in range(3):
        s = sum(beta * (logp_prm[i, t].item() - logp_ref[i, t].item()) for t in range(int(mask[i].sum())))
        p = 1 / (1 + math.exp(-s))
        y = outcome[i].item()
        expected += -(y * math.log(p) + (1 - y) * math.log(1 - p))
    got = prime.prm_ce_loss(logp_prm, logp_ref, mask, outcome, beta)
    assert got.item() == pytest.approx(expected / 3, rel=1e-5)


def test_prm_dpo_loss_by_hand():
    # one group of 3, one token each: Q = beta * ratio with beta = 1 -> Q = [2, -1, 0.5]
    logp_prm = torch.tensor([[2.0], [-1.0], [0.5]])
    logp_ref = torch.zeros(3, 1)
    mask = torch.ones(3, 1)
    outcome = torch.tensor([1.0, 0.0, 0.0])
    # i=0 correct: others wrong {-1, 0.5}, mean -0.25 -> -log sig(2.25)
    # i=1 wrong: others correct {2} -> -log sig(-(-1 - 2)) = -log sig(3)
    # i=2 wrong: -log sig(-(0.5 - 2)) = -log sig(1.5)
    ls = lambda x: -math.log(1 / (1 + math.exp(-x)))
    expected = (ls(2.25) + ls(3.0) + ls(1.5)) / 3
    got = prime.prm_dpo_loss(logp_prm, logp_ref, mask, outcome, beta=1.0, n_samples=3)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # a group with no opposite label compares with 0: all correct, Q = [1, 1] -> -log sig(1)
    got = prime.prm_dpo_loss(torch.tensor([[1.0], [1.0]]), torch.zeros(2, 1), torch.ones(2, 1),
                             torch.tensor([1.0, 1.0]), beta=1.0, n_samples=2)
    assert got.item() == pytest.approx(ls(1.0), rel=1e-6)


# --------------------------------------------------------------------------- RLOO (Eq. 5)


def rloo_loop(process, outcome, mask, K, gamma, form, outcome_gamma=1.0):
    """Eq. 5 and the official form, one token at a time (gamma: the process discount;
    outcome_gamma: the outcome's, back from the last token)."""
    B, T = mask.shape
    out = torch.zeros(B, T)
    lengths = [int(mask[i].sum()) for i in range(B)]
    means = [sum(process[i, t].item() for t in range(lengths[i])) / max(lengths[i], 1) if process is not None else 0
             for i in range(B)]
    for i in range(B):
        g0 = (i // K) * K
        others = [j for j in range(g0, g0 + K) if j != i]
        o_adv = outcome[i].item() - sum(outcome[j].item() for j in others) / (K - 1)
        L = lengths[i]
        for t in range(L):
            value = 0.0
            if process is not None:
                for s in range(t, L):
                    shaped = process[i, s].item() - sum(means[j] for j in others) / (K - 1)
                    if form == "official":
                        shaped += (process[i, s].item() - means[i]) / (K - 1)
                    value += gamma ** (s - t) * shaped
            value += outcome_gamma ** (L - 1 - t) * o_adv
            out[i, t] = value
    return out


@pytest.mark.parametrize("form", ["paper", "official"])
@pytest.mark.parametrize("gamma,outcome_gamma", [(1.0, 1.0), (0.9, 1.0), (1.0, 0.8), (0.5, 0.9)])
def test_rloo_matches_loop(form, gamma, outcome_gamma):
    lengths = [5, 3, 1, 4, 2, 5, 5, 3]
    process, mask = ragged_batch(lengths, seed=3)
    outcome = torch.tensor([1.0, 0, 0, 1, 0.5, 0, 1, 1])
    got = prime.rloo_advantage(process, outcome, mask, 4, gamma, form, outcome_gamma)
    assert torch.allclose(got, rloo_loop(process, outcome, mask, 4, gamma, form, outcome_gamma), atol=1e-5)
    assert torch.all(got[mask == 0] == 0)
    got = prime.rloo_advantage(None, outcome, mask, 4, gamma, form, outcome_gamma)
    assert torch.allclose(got, rloo_loop(None, outcome, mask, 4, gamma, form, outcome_gamma), atol=1e-5)


def test_two_discounts_by_hand():
    """K = 2, one row of 3 tokens per response; outcome [1, 0] -> outcome RLOO [+1, -1]; process
    rows [1, 0, 2] and [0, 0, 0] (m = [1, 0]; paper form: shaped row 0 = r - 0 = [1, 0, 2], row 1 =
    r - 1 = [-1, -1, -1]). Process gamma 0.5: row 0 [1 + 0.5 (0 + 0.5 * 2), 0 + 0.5 * 2, 2] =
    [1.5, 1, 2]; row 1 [-1.75, -1.5, -1]. Outcome gamma 0.1: [0.01, 0.1, 1] times +1 / -1."""
    process = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    mask, outcome = torch.ones(2, 3), torch.tensor([1.0, 0.0])
    got = prime.rloo_advantage(process, outcome, mask, 2, 0.5, "paper", 0.1)
    assert torch.allclose(got, torch.tensor([[1.51, 1.1, 3.0], [-1.76, -1.6, -2.0]]))
    only_process = prime.rloo_advantage(process, outcome, mask, 2, 0.5, "paper")  # Eq. 5: outcome undiscounted
    assert torch.allclose(only_process, torch.tensor([[2.5, 2.0, 3.0], [-2.75, -2.5, -2.0]]))
    # GRPO: outcome z = [+1, -1] / (std sqrt(2) + eps) on the same schedule; REINFORCE: r_o itself
    z = 1 / (math.sqrt(2) + 1e-6)
    grpo = prime.grpo_advantage(None, outcome, mask, 2, 0.5, outcome_gamma=0.1)
    assert torch.allclose(grpo, torch.tensor([[0.01 * z, 0.1 * z, z], [-0.01 * z, -0.1 * z, -z]]))
    reinforce = prime.reinforce_advantage(process, outcome, mask, 0.5, outcome_gamma=0.1)
    assert torch.allclose(reinforce, torch.tensor([[1.51, 1.1, 3.0], [0.0, 0.0, 0.0]]))


def test_rloo_by_hand():
    # K = 2, outcome [1, 0]: outcome advantage [+1, -1]. process rows [1, 3] and [2, pad]:
    # means m = [2, 2]; paper: row0 shaped [1-2, 3-2] = [-1, 1] -> rtg [0, 1]; row1 [2-2] -> [0]
    process = torch.tensor([[1.0, 3.0], [2.0, 7.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    got = prime.rloo_advantage(process, torch.tensor([1.0, 0.0]), mask, n_samples=2)
    assert got.tolist() == [[1.0, 2.0], [-1.0, 0.0]]
    # official adds (r - m_i)/(K-1) = [-1, 1] to row 0: shaped [-2, 2] -> rtg [0, 2]; row 1 unchanged
    got = prime.rloo_advantage(process, torch.tensor([1.0, 0.0]), mask, n_samples=2, form="official")
    assert got.tolist() == [[1.0, 3.0], [-1.0, 0.0]]


def test_rloo_equal_outcomes_give_zero_outcome_advantage():
    _, mask = ragged_batch([3, 2, 3, 1])
    for value in (0.0, 1.0):
        got = prime.rloo_advantage(None, torch.full((4,), value), mask, n_samples=4)
        assert torch.count_nonzero(got) == 0


def test_rloo_paper_and_official_differ_by_the_zero_sum_term():
    lengths = [6, 2, 4, 5, 3, 6]
    process, mask = ragged_batch(lengths, seed=4)
    outcome = torch.tensor([1.0, 0, 1, 0, 0, 1])
    K = 3
    paper = prime.rloo_advantage(process, outcome, mask, K, form="paper")
    official = prime.rloo_advantage(process, outcome, mask, K, form="official")
    # the per-token rewards of the two forms differ by z_{i,t} = (r_{i,t} - m_i)/(K-1) ...
    for i, L in enumerate(lengths):
        r = process[i, :L]
        z = (r - r.mean()) / (K - 1)
        assert abs(z.sum().item()) < 1e-5  # ... which sums to zero over each response,
        # so the returns at t=0 (the whole-response sums) agree and differ later by rtg(z)
        rtg_z = torch.flip(torch.cumsum(torch.flip(z, [0]), 0), [0])
        assert torch.allclose(official[i, :L] - paper[i, :L], rtg_z, atol=1e-5)
        assert official[i, 0].item() == pytest.approx(paper[i, 0].item(), abs=1e-5)
    assert not torch.allclose(official, paper)


def test_whiten_matches_loop():
    x, mask = ragged_batch([4, 1, 3], seed=5)
    values = [x[i, t].item() for i in range(3) for t in range(4) if mask[i, t]]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    got = prime.whiten(x, mask)
    for i in range(3):
        for t in range(4):
            want = (x[i, t].item() - mean) / math.sqrt(var + 1e-8) if mask[i, t] else 0.0
            assert got[i, t].item() == pytest.approx(want, abs=1e-5)


def test_rloo_rejects_bad_groups():
    mask = torch.ones(6, 2)
    with pytest.raises(ValueError, match="n_samples=4"):
        prime.rloo_advantage(None, torch.zeros(6), mask, n_samples=4)
    with pytest.raises(ValueError, match="at least"):
        prime.rloo_advantage(None, torch.zeros(6), mask, n_samples=1)
    with pytest.raises(ValueError, match="form"):
        prime.rloo_advantage(None, torch.zeros(6), mask, n_samples=2, form="verl")


# --------------------------------------------------------------------------- GRPO / REINFORCE / value


def test_grpo_matches_loop():
    lengths = [4, 2, 3, 4, 1, 2]
    process, mask = ragged_batch(lengths, seed=6)
    outcome = torch.tensor([1.0, 0, 0, 1, 1, 0])
    K, eps = 3, 1e-6
    got = prime.grpo_advantage(process, outcome, mask, K)
    got_outcome_only = prime.grpo_advantage(None, outcome, mask, K)
    for i, L in enumerate(lengths):
        g = range((i // K) * K, (i // K) * K + K)
        o = [outcome[j].item() for j in g]
        mo = sum(o) / K
        so = math.sqrt(sum((v - mo) ** 2 for v in o) / (K - 1))
        m = [sum(process[j, t].item() for t in range(lengths[j])) / lengths[j] for j in g]
        mm = sum(m) / K
        sm = math.sqrt(sum((v - mm) ** 2 for v in m) / (K - 1))
        for t in range(L):
            a_o = (outcome[i].item() - mo) / (so + eps)
            a_p = sum((process[i, s].item() - mm) / (sm + eps) for s in range(t, L))
            assert got[i, t].item() == pytest.approx(a_o + a_p, abs=1e-4)
            assert got_outcome_only[i, t].item() == pytest.approx(a_o, abs=1e-5)
    assert torch.all(got[mask == 0] == 0)


def test_grpo_equal_outcomes_give_zero():
    _, mask = ragged_batch([2, 3, 2, 1])
    assert torch.count_nonzero(prime.grpo_advantage(None, torch.ones(4), mask, 2)) == 0


def test_reinforce_by_hand():
    process = torch.tensor([[0.5, -1.0, 2.0], [1.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    got = prime.reinforce_advantage(process, torch.tensor([1.0, 0.0]), mask)
    # row 0: 1 + rtg [1.5, 1.0, 2.0]; row 1: 0 + [1.0]
    assert got.tolist() == [[2.5, 2.0, 3.0], [1.0, 0.0, 0.0]]
    got = prime.reinforce_advantage(process, torch.tensor([1.0, 0.0]), mask, gamma=0.5)
    # row 0 rtg with gamma .5: t2 = 2; t1 = -1 + 1 = 0; t0 = .5 + 0 = .5
    assert got.tolist() == [[1.5, 1.0, 3.0], [1.0, 0.0, 0.0]]


def test_prm_value_advantage_by_hand():
    process = torch.tensor([[0.2, -0.1, 0.4], [0.3, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    got = prime.prm_value_advantage(process, torch.tensor([1.0, 0.0]), mask, outcome_gamma=0.5)
    # row 0: V = [0, 0.2, 0.1]; outcome return = [0.25, 0.5, 1] -> [0.25, 0.3, 0.9]
    # row 1: V = [0]; outcome 0 -> [0]
    assert got[0].tolist() == pytest.approx([0.25, 0.3, 0.9])
    assert got[1].tolist() == [0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- PPO clip (Eq. 6)


def test_ppo_clip_loss_value_by_hand():
    logp_old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.1, 1.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    mask = torch.tensor([[1, 1, 1]])
    # token 0: min(1.1, 1.1) = 1.1; token 1: min(1.5, 1.2) = 1.2; token 2: min(-1.0, 0.8*-2=-1.6) = -1.6
    expected = -(1.1 + 1.2 - 1.6) / 3
    assert prime.ppo_clip_loss(logp, logp_old, adv, mask).item() == pytest.approx(expected, rel=1e-6)


def test_ppo_clip_gradient_zero_outside_clip_on_the_pushed_side():
    # ratio 1.5 with A > 0 and ratio 0.5 with A < 0: both already moved as far as allowed -> no grad.
    # ratio 0.5 with A > 0 and ratio 1.5 with A < 0: pushed back towards 1 -> gradient flows.
    logp_old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]])).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    prime.ppo_clip_loss(logp, logp_old, adv, torch.ones(1, 4)).backward()
    grad = logp.grad[0]
    assert grad[0].item() == 0.0 and grad[1].item() == 0.0
    # d/dlogp of -(ratio * A)/4 = -ratio * A / 4
    assert grad[2].item() == pytest.approx(-0.5 / 4)
    assert grad[3].item() == pytest.approx(1.5 / 4)


def test_ppo_clip_loss_ignores_padding():
    logp = torch.tensor([[0.1, 100.0]])
    loss = prime.ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, 1e9]]), torch.tensor([[1, 0]]))
    assert loss.item() == pytest.approx(-math.exp(0.1), rel=1e-6)


# --------------------------------------------------------------------------- filter, accuracy


def test_keep_groups_n4_drops_exactly_all_right_and_all_wrong():
    outcome = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.float32)
    assert prime.keep_groups(outcome, 4).tolist() == [False, True, True, True, False]


def test_keep_groups_inclusive_bounds_and_soft_outcomes():
    # K = 5: means 0.2 and 0.8 are kept (inclusive); 0.0 is not
    outcome = torch.tensor([1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], dtype=torch.float32)
    assert prime.keep_groups(outcome, 5).tolist() == [True, True, False]
    # soft (code) outcomes: mean 0.15 dropped, 0.45 kept
    assert prime.keep_groups(torch.tensor([0.1, 0.2, 0.4, 0.5]), 2).tolist() == [False, True]


def test_prm_pairwise_accuracy_by_hand():
    # group 1: scores [3, 1, 2], acc [1, 0, 1]: pairs (0,1) a=+1 d=+2 right; (0,2) a=0 weight 0;
    # (1,2) a=-1 d=-1 right -> 1.0
    # group 2: scores [0, 5, 1], acc [1, 0, 0.5]: (0,1) a=1 d=-5 wrong w1; (0,2) a=.5 d=-1 wrong w.5;
    # (1,2) a=-.5 d=4 wrong w.5 -> 0
    # group 3: all acc equal -> 0.5
    score = torch.tensor([3.0, 1, 2, 0, 5, 1, 1, 2, 3])
    acc = torch.tensor([1.0, 0, 1, 1, 0, 0.5, 1, 1, 1])
    assert prime.prm_pairwise_accuracy(score, acc, 3).item() == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    # group: scores [1, 2], acc [1, 0] weighted: a=1 d=-1 wrong -> 0; then tie rule: equal scores,
    # acc [0, 1] (a = -1 < 0) counts right, acc [1, 0] counts wrong
    assert prime.prm_pairwise_accuracy(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0]), 2).item() == 0.0
    assert prime.prm_pairwise_accuracy(torch.zeros(2), torch.tensor([0.0, 1.0]), 2).item() == 1.0
    assert prime.prm_pairwise_accuracy(torch.zeros(2), torch.tensor([1.0, 0.0]), 2).item() == 0.0


def test_prm_pairwise_accuracy_matches_loop_on_random_groups():
    g = torch.Generator().manual_seed(7)
    score = torch.randn(40, generator=g)
    acc = torch.randint(0, 2, (40,), generator=g).float()
    K = 4
    per_group = []
    for start in range(0, 40, K):
        num = den = 0.0
        for i in range(start, start + K):
            for j in range(i + 1, start + K):
                a = acc[i].item() - acc[j].item()
                d = score[i].item() - score[j].item()
                num += abs(a) * ((d > 0) == (a > 0))
                den += abs(a)
        per_group.append(num / den if den > 0 else 0.5)
    got = prime.prm_pairwise_accuracy(score, acc, K).item()
    assert got == pytest.approx(sum(per_group) / len(per_group), abs=1e-6)


def test_keep_groups_upper_bound_slack_with_soft_outcomes():
    # [0.6, 0.8, 0.9, 0.9] has mean 0.8, but float32 rounds it to 0.80000007 > float32(0.8) = 0.80000001:
    # the inclusive upper bound needs the same 1e-6 slack as the lower one, or this group is dropped
    outcome = torch.tensor([0.6, 0.8, 0.9, 0.9, 0.7, 0.7, 0.9, 0.9, 0.9, 0.9, 0.9, 0.85])
    assert outcome[:4].mean().item() > torch.tensor(0.8).item()
    assert prime.keep_groups(outcome, 4).tolist() == [True, True, False]  # means 0.8, 0.8, 0.8875
    # the lower bound the same way: [0.1, 0.1, 0.3, 0.3] has mean 0.2 (float32 0.19999999)
    assert prime.keep_groups(torch.tensor([0.1, 0.1, 0.3, 0.3]), 4).tolist() == [True]
    # a bound just outside by more than the slack is not kept
    assert prime.keep_groups(torch.tensor([0.8, 0.8, 0.8, 0.8]), 4, high=0.79).tolist() == [False]


def test_prm_pairwise_accuracy_soft_labels_with_small_total_weight():
    # one group, acc [0.5, 0.25] (code pass fractions): a = 0.25, the only weight; d = 1 - 2 < 0 while
    # a > 0 -> wrong: 0 / 0.25 = 0. acc [0.25, 0.5], same scores: a = -0.25, d < 0 -> right: 0.25 / 0.25 = 1
    score = torch.tensor([1.0, 2.0])
    assert prime.prm_pairwise_accuracy(score, torch.tensor([0.5, 0.25]), 2).item() == 0.0
    assert prime.prm_pairwise_accuracy(score, torch.tensor([0.25, 0.5]), 2).item() == 1.0
    # three responses, weights 0.25 + 0.5 + 0.25 = 1.0 would hide a clamp; use [0.5, 0.4, 0.3]: weights
    # .1 (0,1) .2 (0,2) .1 (1,2), total 0.4; scores [3, 1, 2]: (0,1) right, (0,2) right, (1,2) wrong
    got = prime.prm_pairwise_accuracy(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0.5, 0.4, 0.3]), 3).item()
    assert got == pytest.approx(0.3 / 0.4, abs=1e-6)


def test_group_size_one_is_allowed_where_no_baseline_is_needed():
    # K = 1: the filter, the pairwise accuracy and the DPO loss need no second response
    assert prime.keep_groups(torch.tensor([0.0, 1.0, 0.5]), 1).tolist() == [False, False, True]
    assert prime.prm_pairwise_accuracy(torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0]), 1).item() == 0.5
    loss = prime.prm_dpo_loss(torch.tensor([[2.0]]), torch.zeros(1, 1), torch.ones(1, 1), torch.tensor([1.0]), 1.0, 1)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-2.0)), rel=1e-6)  # no opposite: vs 0


def test_whiten_two_tokens_uses_the_unbiased_variance():
    # values 1 and 3: mean 2, unbiased var (1 + 1) / 1 = 2 -> -1/sqrt(2), +1/sqrt(2)
    out = prime.whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1, 1, 0]]))
    assert out[0].tolist() == pytest.approx([-1 / math.sqrt(2 + 1e-8), 1 / math.sqrt(2 + 1e-8), 0.0], abs=1e-6)


def test_prm_value_advantage_default_gamma_is_one():
    process = torch.tensor([[0.2, -0.1, 0.4]])
    got = prime.prm_value_advantage(process, torch.tensor([1.0]), torch.ones(1, 3))
    # V = [0, 0.2, 0.1]; outcome return with gamma 1 = [1, 1, 1]
    assert got[0].tolist() == pytest.approx([1.0, 0.8, 0.9])


def test_token_logprobs_with_more_rows_than_vocabulary():
    # N = B*T = 120 rows > V = 11: every row is computed, in chunks of 2 rows (forward and backward)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 30, 11, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (4, 30), generator=g)
    ours = prime.token_logprobs(logits, labels, 0.8, chunk_elements=22)
    naive = torch.log_softmax(logits / 0.8, -1).gather(-1, labels[..., None])[..., 0]
    assert torch.allclose(ours.double(), naive, atol=1e-6)
    w = torch.randn(4, 30, generator=g, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours.double() * w).sum(), logits)
    (g_naive,) = torch.autograd.grad((naive * w).sum(), logits)
    assert torch.allclose(g_ours, g_naive, atol=1e-6)


def test_discounted_returns_of_one_token_responses():
    # T = 1 with gamma < 1 (the scan path): the return is the reward itself
    process = torch.tensor([[0.5], [-1.0]])
    got = prime.rloo_advantage(process, torch.tensor([1.0, 0.0]), torch.ones(2, 1), 2, gamma=0.9)
    # outcome RLOO [+1, -1]; process: m = [0.5, -1], shaped = r - other mean = [1.5, -1.5]
    # official form adds (r - m_i)/(K-1) = 0 -> [[2.5], [-2.5]]
    assert got.tolist() == [[2.5], [-2.5]]


def test_grpo_process_group_with_zero_std_divides_by_plus_eps():
    # group of 2 with response means both 0.5 (std 0): z = (r - 0.5) / (0 + eps), sign kept
    process = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    got = prime.grpo_advantage(process, torch.tensor([1.0, 1.0]), torch.ones(2, 2), 2, eps=1e-6)
    # outcome equal -> 0; row 0: z = [0.5, -0.5] / 1e-6 -> rtg [0, -5e5]; row 1: z = 0
    assert got[0].tolist() == pytest.approx([0.0, -0.5 / 1e-6])
    assert got[1].tolist() == [0.0, 0.0]


# --------------------------------------------------------------------------- rollout correction


def correction_batch():
    """Two ragged rows: trainer and sampler log-probs, garbage on padding.
    delta = old - rollout: row 0 [0.5, -1.0, 0.0], row 1 [1.1, 0.0] (+ padding)."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 7.0]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -3.0, -50.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    return old, rollout, mask


@pytest.mark.parametrize("level, mode, expected", [
    ("token", "truncate", [[math.exp(0.5), math.exp(-1.0), 1.0], [2.0, 1.0, 0.0]]),
    ("token", "mask", [[math.exp(0.5), math.exp(-1.0), 1.0], [0.0, 1.0, 0.0]]),  # e^1.1 = 3.0 > 2: masked
    ("sequence", "truncate", [[math.exp(-0.5)] * 3, [2.0, 2.0, 0.0]]),  # row sums -0.5 and 1.1
    ("sequence", "mask", [[math.exp(-0.5)] * 3, [0.0, 0.0, 0.0]]),
    # IcePop / veRL's mask: outside [1/2, 2] -> 0 on both sides: e^-1.0 = 0.37 < 0.5 and e^1.1 = 3.0 > 2
    ("token", "band", [[math.exp(0.5), 0.0, 1.0], [0.0, 1.0, 0.0]]),
    ("sequence", "band", [[math.exp(-0.5)] * 3, [0.0, 0.0, 0.0]]),  # e^-0.5 = 0.61 is inside the band
])
def test_rollout_is_weights_by_hand_on_ragged_rows(level, mode, expected):
    old, rollout, mask = correction_batch()
    w = prime.rollout_is_weights(old, rollout, mask, level, mode, cap=2.0)
    assert w.dtype == torch.float32 and not w.requires_grad
    torch.testing.assert_close(w, torch.tensor(expected), rtol=1e-6, atol=0)


def test_rollout_is_weights_clamps_the_log_ratio_and_takes_no_gradient():
    old = torch.tensor([[30.0, -30.0]], dtype=torch.float64, requires_grad=True)
    rollout = torch.zeros(1, 2, dtype=torch.float64)
    w = prime.rollout_is_weights(old, rollout, torch.ones(1, 2), "token", "truncate", cap=1e12)
    torch.testing.assert_close(w, torch.tensor([[math.exp(20.0), math.exp(-20.0)]]), rtol=1e-6, atol=0)
    assert not w.requires_grad  # a weight, never a path for the gradient
    # equal log-probs (the HF sampler is the trainer): every weight exactly 1, in every mode
    same = torch.randn(3, 4)
    for level in prime.IS_LEVELS:
        for mode in prime.IS_MODES:
            assert torch.equal(prime.rollout_is_weights(same, same.clone(), torch.ones(3, 4), level, mode, 1.0),
                               torch.ones(3, 4))
    with pytest.raises(ValueError, match="level"):
        prime.rollout_is_weights(same, same, torch.ones(3, 4), level="tok")
    with pytest.raises(ValueError, match="mode"):
        prime.rollout_is_weights(same, same, torch.ones(3, 4), mode="clip")


def test_rollout_mismatch_by_hand():
    old, rollout, mask = correction_batch()
    token = prime.rollout_mismatch(old, rollout, mask, "token", cap=2.0)
    assert token["abs_logp_diff"] == pytest.approx(0.5 + 1.0 + 0.0 + 1.1 + 0.0, rel=1e-6)
    assert token["mismatch_tokens"] == 5 and token["units"] == 5 and token["over_cap"] == 1
    assert token["rho_max"] == pytest.approx(math.exp(1.1), rel=1e-6)
    sequence = prime.rollout_mismatch(old, rollout, mask, "sequence", cap=2.0)
    assert sequence["units"] == 2 and sequence["over_cap"] == 1
    assert sequence["rho_max"] == pytest.approx(math.exp(1.1), rel=1e-6)
    assert sequence["abs_logp_diff"] == token["abs_logp_diff"]  # always per token
    # the band mode counts what falls below 1/cap too: token rho e^-1.0 = 0.37 < 0.5 (and e^1.1 above 2)
    assert prime.rollout_mismatch(old, rollout, mask, "token", cap=2.0, mode="band")["over_cap"] == 2
    assert prime.rollout_mismatch(old, rollout, mask, "sequence", cap=2.0, mode="band")["over_cap"] == 1


def test_band_mask_takes_the_masked_tokens_out_of_the_token_mean():
    """veRL's mask mode (IcePop) drops a token from the loss's denominator as well as its numerator;
    TRL's keeps it there with weight 0. One row, weights [e^0.5, 0 (masked), 1]: the band's mask keeps
    2 tokens, so with advantages [1, 5, 3] at ratio 1 the loss is -(e^0.5 * 1 + 1 * 3) / 2, against TRL's
    -(e^0.5 + 3) / 3."""
    old, rollout, mask = correction_batch()
    w = prime.rollout_is_weights(old, rollout, mask, "token", "band", cap=2.0)
    band = prime.band_mask(w, mask)
    torch.testing.assert_close(band, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    logp, adv = torch.zeros(1, 3), torch.tensor([[1.0, 5.0, 3.0]])
    loss = prime.ppo_clip_loss(logp, logp, adv, band[:1], 0.2, None, w[:1])
    assert loss.item() == pytest.approx(-(math.exp(0.5) + 3.0) / 2, rel=1e-6)
    trl = prime.ppo_clip_loss(logp, logp, adv, mask[:1], 0.2, None, w[:1])
    assert trl.item() == pytest.approx(-(math.exp(0.5) + 3.0) / 3, rel=1e-6)


def test_ppo_clip_loss_token_weights_scale_each_tokens_loss_by_hand():
    # ratio 1 everywhere: loss_t = -A_t; weights [2, 0.5 | 1, (padding)] -> (-2*1 - 0.5*(-2) - 1*4) / 3
    logp = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, -2.0], [4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    weights = torch.tensor([[2.0, 0.5], [1.0, 0.0]])
    loss = prime.ppo_clip_loss(logp, logp, adv, mask, 0.2, token_weights=weights)
    assert loss.item() == pytest.approx((-2.0 + 1.0 - 4.0) / 3)
    assert prime.ppo_clip_loss(logp, logp, adv, mask, 0.2, token_weights=torch.ones(2, 2)).item() == \
        prime.ppo_clip_loss(logp, logp, adv, mask, 0.2).item()
