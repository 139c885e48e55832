"""Gradients of every differentiable function in prime.py and pass_advantage.py, against autograd of a
plain, obviously-correct implementation (Python loops over rows and tokens on 0-d tensors), on ragged
multi-row batches, in float32 and float64 (and bfloat16 where the code runs in it: token_logprobs).

Values alone missed a real bug: token_logprobs divided the caller's float32 logits in place
(`.float()` of a float32 tensor is the tensor itself), so at temperature != 1 the gradient was wrong
by 1e2-1e3 and the logits were overwritten. Every check below also asserts that no input changed,
after the forward and after the backward.
"""

import math

import pytest
import torch

import pass_advantage as P
import prime

DTYPES = (torch.float32, torch.float64)
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}


def ragged(lengths, T=None, seed=0, dtype=torch.float64, pad=float("nan")):
    """(B, T) random values with `pad` on the padding, and the (B, T) 0/1 mask."""
    g = torch.Generator().manual_seed(seed)
    T = T or max(lengths)
    mask = torch.zeros(len(lengths), T, dtype=dtype)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    x = torch.randn(len(lengths), T, generator=g, dtype=torch.float64).to(dtype)
    return torch.where(mask.bool(), x, torch.full_like(x, pad)), mask


def check_grads(ours, plain, inputs: list[torch.Tensor], dtype, seed=0, check_nan_pad=True):
    """d(sum(w * out))/d(each input) of `ours` equals that of `plain`; no input is modified.

    `inputs` are leaf tensors; each function gets fresh clones that require grad. Padding may hold
    NaN: a gradient must be exactly 0 there (finite) whatever the padded values are."""
    out_grads = []
    for fn in (ours, plain):
        leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        before = [x.detach().clone() for x in leaves]
        out = fn(*leaves)
        for x, b in zip(leaves, before):  # the forward never writes into an input
            assert torch.equal(x.detach(), b) or torch.allclose(x.detach(), b, equal_nan=True)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
        w = w.to(out.dtype)
        diff = [x for x in leaves if x.requires_grad]
        grads = torch.autograd.grad((out * w).sum(), diff, allow_unused=True)
        for x, b in zip(leaves, before):  # nor does the backward
            assert torch.allclose(x.detach(), b, equal_nan=True)
        out_grads.append(([torch.zeros_like(x) if g is None else g for x, g in zip(diff, grads)], out.detach()))
    (g_ours, v_ours), (g_plain, v_plain) = out_grads
    torch.testing.assert_close(v_ours.to(torch.float64), v_plain.to(torch.float64), **TOL[dtype], equal_nan=True)
    for a, b in zip(g_ours, g_plain):
        assert torch.isfinite(a).all(), "a NaN on padding leaked into the gradient"
        torch.testing.assert_close(a.to(torch.float64), b.to(torch.float64), **TOL[dtype])
    return g_ours


def stack(rows, dtype):
    """A list of lists of 0-d tensors (or floats) -> a (B, T) tensor that keeps the graph."""
    return torch.stack([torch.stack([torch.as_tensor(v, dtype=dtype) for v in row]) for row in rows])


def lengths_of(mask):
    return [int(mask[i].sum()) for i in range(mask.shape[0])]


# ---------------------------------------------------------------------------------------------------
# token_logprobs: dtype x temperature x chunking; value, gradient, inputs untouched
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [2**24, 97 * 2])  # one chunk; two rows a chunk (9 chunks)
def test_token_logprobs_value_gradient_and_inputs_unchanged(dtype, temperature, chunk_elements):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 6, 97, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    labels = torch.randint(0, 97, (3, 6), generator=g)
    original = logits.detach().clone()
    ours = prime.token_logprobs(logits, labels, temperature, chunk_elements=chunk_elements)
    assert ours.dtype == torch.float32
    assert torch.equal(logits.detach(), original), "the forward wrote into the logits"
    # plain: float64 log_softmax of the same (rounded) logits
    ref_logits = original.to(torch.float64).requires_grad_()
    plain = torch.log_softmax(ref_logits / temperature, -1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(ours.double(), plain, rtol=0, atol=1e-5)
    w = torch.randn(3, 6, generator=g, dtype=torch.float64)
    (g_ours,) = torch.autograd.grad((ours * w.float()).sum(), logits)
    (g_plain,) = torch.autograd.grad((plain * w).sum(), ref_logits)
    assert torch.equal(logits.detach(), original), "the backward wrote into the logits"
    assert g_ours.dtype == dtype
    # bf16 gradients are rounded to 8 bits of mantissa: |g| <= 1/T, so 1/T * 2^-8 is the bf16 step
    atol = {torch.float32: 1e-6, torch.float64: 1e-6, torch.bfloat16: 2 ** -8 / temperature}[dtype]
    torch.testing.assert_close(g_ours.double(), g_plain, rtol=0, atol=atol)


def test_token_logprobs_float32_gradient_at_temperature_is_the_closed_form():
    # d log p(y) / d logit_v = (1[v = y] - softmax(logits / T)_v) / T, by hand for one 3-way row
    logits = torch.tensor([[[1.0, 2.0, 0.5]]], requires_grad=True)
    out = prime.token_logprobs(logits, torch.tensor([[1]]), temperature=0.5)
    out.sum().backward()
    z = [2.0, 4.0, 1.0]  # logits / T
    p = [math.exp(v) / sum(math.exp(u) for u in z) for u in z for v in [u]]
    expected = [(float(v == 1) - p[v]) / 0.5 for v in range(3)]
    assert logits.grad[0, 0].tolist() == pytest.approx(expected, abs=1e-6)
    assert logits.detach()[0, 0].tolist() == [1.0, 2.0, 0.5]


# ---------------------------------------------------------------------------------------------------
# Implicit reward, PRM losses
# ---------------------------------------------------------------------------------------------------


def plain_implicit_reward(logp_prm, logp_ref, mask, beta):
    return stack([[beta * (logp_prm[i, t] - logp_ref[i, t]) if t < L else 0.0 for t in range(mask.shape[1])]
                  for i, L in enumerate(lengths_of(mask))], logp_prm.dtype)


def plain_sequence_reward(logp_prm, logp_ref, mask, beta):
    return torch.stack([sum((beta * (logp_prm[i, t] - logp_ref[i, t]) for t in range(L)),
                            torch.zeros((), dtype=logp_prm.dtype)) for i, L in enumerate(lengths_of(mask))])


@pytest.mark.parametrize("dtype", DTYPES)
def test_implicit_reward_and_sequence_reward_gradients(dtype):
    logp_prm, mask = ragged([5, 2, 4, 1, 3], seed=1, dtype=dtype)
    logp_ref, _ = ragged([5, 2, 4, 1, 3], seed=2, dtype=dtype)
    m = mask
    check_grads(lambda a, b: prime.implicit_process_reward(a, b, m, 0.3),
                lambda a, b: plain_implicit_reward(a, b, m, 0.3), [logp_prm, logp_ref], dtype)
    check_grads(lambda a, b: prime.sequence_reward(a, b, m, 0.3),
                lambda a, b: plain_sequence_reward(a, b, m, 0.3), [logp_prm, logp_ref], dtype)


def plain_ce(logp_prm, logp_ref, mask, outcome, beta):
    total = 0.0
    for i, s in enumerate(plain_sequence_reward(logp_prm, logp_ref, mask, beta)):
        y = outcome[i].item()
        # log sigmoid(s) = -log(1 + e^-s); log(1 - sigmoid(s)) = -log(1 + e^s)
        total = total - (y * -torch.log1p(torch.exp(-s)) + (1 - y) * -torch.log1p(torch.exp(s)))
    return total / len(outcome)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prm_ce_loss_gradient_with_soft_labels(dtype):
    lengths = [5, 2, 4, 1, 3, 6]
    logp_prm, mask = ragged(lengths, seed=3, dtype=dtype)
    logp_ref, _ = ragged(lengths, seed=4, dtype=dtype)
    outcome = torch.tensor([1.0, 0.0, 0.25, 1.0, 0.0, 0.6], dtype=dtype)
    check_grads(lambda a, b: prime.prm_ce_loss(a, b, mask, outcome, 0.5),
                lambda a, b: plain_ce(a, b, mask, outcome, 0.5), [logp_prm, logp_ref], dtype)


def plain_dpo(logp_prm, logp_ref, mask, outcome, beta, K):
    """veRL's `compute_detach_dpo_loss_rm`, one response at a time: the others' mean is detached."""
    q = plain_sequence_reward(logp_prm, logp_ref, mask, beta)
    acc = outcome.tolist()
    total = 0.0
    for i in range(len(acc)):
        group = range((i // K) * K, (i // K) * K + K)
        if acc[i] > 0:  # correct (a code pass fraction > 0 counts): compare with the worse ones
            others = [q[j].detach() for j in group if acc[j] < acc[i]]
        else:
            others = [q[j].detach() for j in group if acc[j] > acc[i]]
        other = sum(others) / len(others) if others else 0.0
        sign = 1.0 if acc[i] > 0 else -1.0
        total = total + torch.log1p(torch.exp(-sign * (q[i] - other)))  # -log sigmoid
    return total / len(acc)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prm_dpo_loss_gradient_and_soft_label_groups(dtype):
    lengths = [5, 2, 4, 1, 3, 6, 2, 2, 4]
    logp_prm, mask = ragged(lengths, seed=5, dtype=dtype)
    logp_ref, _ = ragged(lengths, seed=6, dtype=dtype)
    # group 0 binary; group 1 soft (code pass fractions: 0.5 is "correct" against 0.25's and 0);
    # group 2 all equal (no opposite: compare with 0)
    outcome = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.25, 0.0, 0.5, 0.5, 0.5], dtype=dtype)
    check_grads(lambda a, b: prime.prm_dpo_loss(a, b, mask, outcome, 0.7, 3),
                lambda a, b: plain_dpo(a, b, mask, outcome, 0.7, 3), [logp_prm, logp_ref], dtype)


def test_prm_dpo_soft_label_by_hand():
    # one group, one token each, beta 1: Q = [1, 2, 3], acc = [0.5, 0.25, 0]
    # i=0 (0.5 > 0: correct) vs {j: acc_j < 0.5} = {2, 3}: mean 2.5 -> -log sig(1 - 2.5)
    # i=1 (0.25: correct) vs {acc < 0.25} = {3} -> -log sig(2 - 3); i=2 (wrong) vs {1, 2} mean 1.5
    #   -> -log sig(-(3 - 1.5))
    ls = lambda x: math.log1p(math.exp(-x))  # noqa: E731
    got = prime.prm_dpo_loss(torch.tensor([[1.0], [2.0], [3.0]]), torch.zeros(3, 1), torch.ones(3, 1),
                             torch.tensor([0.5, 0.25, 0.0]), beta=1.0, n_samples=3)
    assert got.item() == pytest.approx((ls(-1.5) + ls(-1.0) + ls(-1.5)) / 3, rel=1e-6)


# ---------------------------------------------------------------------------------------------------
# PPO clip (Eq. 6), with and without the dual clip
# ---------------------------------------------------------------------------------------------------


def plain_ppo(logp, logp_old, adv, mask, eps, dual_clip=None):
    """Token mean over every valid token of the batch; each token's loss picks its branch."""
    total, count = 0.0, 0
    for i, L in enumerate(lengths_of(mask)):
        for t in range(L):
            ratio = torch.exp(logp[i, t] - logp_old[i, t])
            a = adv[i, t]
            unclipped = -ratio * a
            clipped = -torch.clamp(ratio, 1 - eps, 1 + eps) * a
            loss = unclipped if unclipped.item() >= clipped.item() else clipped
            if dual_clip is not None and a.item() < 0 and loss.item() > (-dual_clip * a).item():
                loss = -dual_clip * a
            total, count = total + loss, count + 1
    return total / count


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dual_clip", [None, 1.5])
def test_ppo_clip_loss_gradient_on_a_ragged_batch(dtype, dual_clip):
    lengths = [6, 2, 4, 1, 5]  # unequal lengths: a per-sequence mean would weigh tokens differently
    logp, mask = ragged(lengths, seed=7, dtype=dtype, pad=0.0)  # train.py's log-probs are 0 on padding
    logp_old = torch.where(mask.bool(), logp + 0.6 * ragged(lengths, seed=8, dtype=dtype)[0], logp)
    logp_old[0, :3] = logp[0, :3]  # ratio exactly 1: inside the clip range, both branches tie
    logp_old[2, 0] = logp[2, 0] - 1.0  # ratio e: past the dual clip for a negative advantage
    adv, _ = ragged(lengths, seed=9, dtype=dtype)
    adv[2, 0] = -1.0
    adv = torch.where(mask.bool(), adv, torch.full_like(adv, 1e9))
    check_grads(lambda a, b, c: prime.ppo_clip_loss(a, b, c, mask, 0.2, dual_clip),
                lambda a, b, c: plain_ppo(a, b, c, mask, 0.2, dual_clip), [logp, logp_old, adv], dtype)
    # at ratio 1 the gradient is the full -A / N (the clipped branch carries it too: a detached
    # clipped branch would halve it, since torch.minimum splits a tie)
    leaf = logp.clone().requires_grad_()
    (g,) = torch.autograd.grad(prime.ppo_clip_loss(leaf, logp_old, adv, mask, 0.2, dual_clip), leaf)
    n = sum(lengths)
    for t in range(3):
        assert g[0, t].item() == pytest.approx(-adv[0, t].item() / n, rel=1e-5)
    if dual_clip:
        assert g[2, 0].item() == 0.0  # capped at -c A: no gradient through the ratio
    else:
        assert g[2, 0].item() == pytest.approx(math.e / n, rel=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ppo_clip_loss_with_rollout_weights_gradient(dtype):
    """The rollout correction's weights scale each token's loss and receive no gradient."""
    lengths = [5, 2, 4]
    logp, mask = ragged(lengths, seed=17, dtype=dtype, pad=0.0)
    logp_old = torch.where(mask.bool(), logp + 0.5 * ragged(lengths, seed=18, dtype=dtype)[0], logp)
    adv, _ = ragged(lengths, seed=19, dtype=dtype)
    adv = torch.where(mask.bool(), adv, torch.full_like(adv, 1e9))  # train.py's advantages are finite everywhere
    weights = torch.where(mask.bool(), 2.0 * torch.rand(mask.shape, generator=torch.Generator().manual_seed(3),
                                                        dtype=torch.float64).to(dtype), torch.zeros_like(mask))

    def plain(a, b, c, w):
        total, count = 0.0, 0
        for i, L in enumerate(lengths_of(mask)):
            for t in range(L):
                ratio = torch.exp(a[i, t] - b[i, t])
                loss = torch.maximum(-ratio * c[i, t], -torch.clamp(ratio, 0.8, 1.2) * c[i, t])
                total, count = total + w[i, t].detach() * loss, count + 1
        return total / count

    grads = check_grads(lambda a, b, c, w: prime.ppo_clip_loss(a, b, c, mask, 0.2, token_weights=w),
                        plain, [logp, logp_old, adv, weights], dtype)
    assert torch.count_nonzero(grads[3]) == 0  # no gradient reaches the weights


def test_ppo_dual_clip_by_hand():
    # A = -1 at ratios 0.5, 1.1, 2, 4 with eps 0.2, c = 3: the PPO loss per token is
    # max(-r A, -clip(r) A) = max(r, clip(r)) = [0.8, 1.1, 2, 4]; the dual clip caps it at -c A = 3
    logp = torch.log(torch.tensor([[0.5, 1.1, 2.0, 4.0]]))
    adv, mask = -torch.ones(1, 4), torch.ones(1, 4)
    plain = prime.ppo_clip_loss(logp, torch.zeros(1, 4), adv, mask, 0.2)
    dual = prime.ppo_clip_loss(logp, torch.zeros(1, 4), adv, mask, 0.2, dual_clip=3.0)
    assert plain.item() == pytest.approx((0.8 + 1.1 + 2 + 4) / 4, rel=1e-6)
    assert dual.item() == pytest.approx((0.8 + 1.1 + 2 + 3) / 4, rel=1e-6)
    # positive advantages are untouched by the dual clip
    pos = prime.ppo_clip_loss(logp, torch.zeros(1, 4), -adv, mask, 0.2, dual_clip=3.0)
    assert pos.item() == pytest.approx(-(0.5 + 1.1 + 1.2 + 1.2) / 4, rel=1e-6)
    with pytest.raises(ValueError, match="dual_clip"):
        prime.ppo_clip_loss(logp, torch.zeros(1, 4), adv, mask, 0.2, dual_clip=1.0)


# ---------------------------------------------------------------------------------------------------
# Process-reward normalisation, advantages, whitening
# ---------------------------------------------------------------------------------------------------


def plain_rtg(values, gamma=1.0):
    """Return-to-go of a list of 0-d tensors."""
    out, running = [], 0.0
    for v in reversed(values):
        running = v + gamma * running
        out.append(running)
    return out[::-1]


def plain_normalize(reward, mask):
    T = mask.shape[1]
    rows = [[reward[i, t] for t in range(L)] for i, L in enumerate(lengths_of(mask))]
    scale = max((abs(v) for row in rows for v in plain_rtg(row)), key=lambda v: v.item()) + 1e-6
    return stack([[v / scale for v in row] + [0.0] * (T - len(row)) for row in rows], reward.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_normalize_process_reward_gradient_with_a_negative_largest_return(dtype):
    reward, mask = ragged([4, 2, 3], seed=10, dtype=dtype)
    reward[1, :2] = torch.tensor([-3.0, -4.0], dtype=dtype)  # |rtg| = 7 is the largest, and negative
    check_grads(lambda r: prime.normalize_process_reward(r, mask), lambda r: plain_normalize(r, mask),
                [reward], dtype)


def test_normalize_process_reward_all_returns_negative_by_hand():
    # rtg of [-1, -2] is [-3, -2]; of [-0.5] is [-0.5]: the scale is |-3| = 3, not max(rtg) = -0.5
    out = prime.normalize_process_reward(torch.tensor([[-1.0, -2.0], [-0.5, 8.0]]), torch.tensor([[1, 1], [1, 0]]))
    scale = 3.0 + 1e-6
    assert out.flatten().tolist() == pytest.approx([-1 / scale, -2 / scale, -0.5 / scale, 0.0], abs=1e-7)


def plain_rloo(process, outcome, mask, K, gamma, form, outcome_gamma=1.0):
    T = mask.shape[1]
    L = lengths_of(mask)
    means = [sum((process[i, t] for t in range(L[i])), 0.0) / max(L[i], 1) for i in range(len(L))]
    rows = []
    for i in range(len(L)):
        others = [j for j in range((i // K) * K, (i // K) * K + K) if j != i]
        o_adv = outcome[i].item() - sum(outcome[j].item() for j in others) / (K - 1)
        shaped = []
        for t in range(L[i]):
            r = process[i, t] - sum(means[j] for j in others) / (K - 1)
            if form == "official":
                r = r + (process[i, t] - means[i]) / (K - 1)
            shaped.append(r)
        row = plain_rtg(shaped, gamma)
        row = [v + outcome_gamma ** (L[i] - 1 - t) * o_adv for t, v in enumerate(row)]
        rows.append(row + [0.0] * (T - L[i]))
    return stack(rows, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["paper", "official"])
@pytest.mark.parametrize("gamma,outcome_gamma", [(1.0, 1.0), (0.9, 1.0), (0.5, 0.9)])
@pytest.mark.parametrize("pad", [float("nan"), float("inf"), 123.0])
def test_rloo_advantage_gradient_and_non_finite_padding(dtype, form, gamma, outcome_gamma, pad):
    lengths = [5, 3, 1, 4, 2, 5, 5, 3]
    process, mask = ragged(lengths, seed=11, dtype=dtype, pad=pad)
    outcome = torch.tensor([1.0, 0, 0, 1, 0.5, 0, 1, 1])
    check_grads(lambda r: prime.rloo_advantage(r, outcome, mask, 4, gamma, form, outcome_gamma),
                lambda r: plain_rloo(r, outcome, mask, 4, gamma, form, outcome_gamma), [process], torch.float32)


def plain_grpo(process, outcome, mask, K, gamma, eps=1e-6, outcome_gamma=1.0):
    T = mask.shape[1]
    L = lengths_of(mask)
    means = [sum((process[i, t] for t in range(L[i])), 0.0) / L[i] for i in range(len(L))]
    rows = []
    for i in range(len(L)):
        group = list(range((i // K) * K, (i // K) * K + K))
        o = [outcome[j].item() for j in group]
        mo = sum(o) / K
        so = math.sqrt(sum((v - mo) ** 2 for v in o) / (K - 1))
        m = [means[j] for j in group]
        mm = sum(m) / K
        sm = (sum((v - mm) ** 2 for v in m) / (K - 1)) ** 0.5
        z = [(process[i, t] - mm) / (sm + eps) for t in range(L[i])]
        a_o = (outcome[i].item() - mo) / (so + eps)
        rows.append([v + outcome_gamma ** (L[i] - 1 - t) * a_o for t, v in enumerate(plain_rtg(z, gamma))]
                    + [0.0] * (T - L[i]))
    return stack(rows, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma,outcome_gamma", [(1.0, 1.0), (0.8, 1.0), (0.8, 0.6)])
def test_grpo_advantage_gradient(dtype, gamma, outcome_gamma):
    lengths = [4, 2, 3, 4, 1, 2]
    process, mask = ragged(lengths, seed=12, dtype=dtype)
    outcome = torch.tensor([1.0, 0, 0, 1, 1, 0])
    check_grads(lambda r: prime.grpo_advantage(r, outcome, mask, 3, gamma, outcome_gamma=outcome_gamma),
                lambda r: plain_grpo(r, outcome, mask, 3, gamma, outcome_gamma=outcome_gamma), [process],
                torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reinforce_and_prm_value_advantage_gradients(dtype):
    lengths = [4, 1, 3]
    process, mask = ragged(lengths, seed=13, dtype=dtype)
    outcome = torch.tensor([1.0, 0.0, 0.5])
    T, gamma, outcome_gamma = mask.shape[1], 0.7, 0.9

    def plain_reinforce(r):
        return stack([[v + outcome_gamma ** (L - 1 - t) * outcome[i].item()
                       for t, v in enumerate(plain_rtg([r[i, t] for t in range(L)], gamma))]
                      + [0.0] * (T - L) for i, L in enumerate(lengths)], torch.float32)

    def plain_value(r):
        rows = []
        for i, L in enumerate(lengths):
            value_before = [sum((r[i, s] for s in range(t)), 0.0) for t in range(L)]  # q_{t-1}
            rows.append([outcome_gamma ** (L - 1 - t) * outcome[i].item() - value_before[t] for t in range(L)]
                        + [0.0] * (T - L))
        return stack(rows, torch.float32)

    check_grads(lambda r: prime.reinforce_advantage(r, outcome, mask, gamma, outcome_gamma), plain_reinforce,
                [process], torch.float32)
    check_grads(lambda r: prime.prm_value_advantage(r, outcome, mask, outcome_gamma), plain_value, [process],
                torch.float32)


def plain_whiten(x, mask, eps=1e-8):
    cells = [(i, t) for i, L in enumerate(lengths_of(mask)) for t in range(L)]
    mean = sum(x[c] for c in cells) / len(cells)
    var = sum((x[c] - mean) ** 2 for c in cells) / (len(cells) - 1)
    return stack([[(x[i, t] - mean) / (var + eps) ** 0.5 if t < L else 0.0 for t in range(mask.shape[1])]
                  for i, L in enumerate(lengths_of(mask))], x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_whiten_and_masked_mean_gradients(dtype):
    x, mask = ragged([4, 1, 3], seed=14, dtype=dtype)
    check_grads(lambda v: prime.whiten(v, mask), lambda v: plain_whiten(v, mask), [x], dtype)
    check_grads(lambda v: prime.masked_mean(v, mask),
                lambda v: sum(v[i, t] for i, L in enumerate(lengths_of(mask)) for t in range(L)) / 8, [x], dtype)


def test_whiten_near_zero_variance_batch_keeps_the_eps():
    # values 1 +- 1e-5: var = 1e-10 (unbiased, 4 values: sum of squares 4e-10 / 3), far below eps = 1e-8,
    # so the output is (x - mean) / sqrt(var + eps) ~ 1e-5 / 1.0049e-4, not the unit-variance +-0.87
    x = torch.tensor([[1 + 1e-5, 1 - 1e-5], [1 + 1e-5, 1 - 1e-5]], dtype=torch.float64)
    out = prime.whiten(x, torch.ones(2, 2))
    var = 4e-10 / 3
    assert out[0].tolist() == pytest.approx([1e-5 / math.sqrt(var + 1e-8), -1e-5 / math.sqrt(var + 1e-8)], rel=1e-6)
    assert torch.equal(prime.whiten(torch.ones(2, 3), torch.ones(2, 3)), torch.zeros(2, 3))  # constant -> 0


# ---------------------------------------------------------------------------------------------------
# PASS (gradient w.r.t. the process signal, through every stage)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("recipe", ["pass", "af_only", "no_cv", "gr3", "process_only"])
@pytest.mark.parametrize("normalizer", P.NORMALIZERS)
def test_pass_advantage_gradient_matches_the_plain_loop_version(dtype, recipe, normalizer):
    from test_pass import random_batch, reference_pass

    s, mask, outcome, fmt, gids, _ = random_batch(seed=3, blocky=False)
    s_t = torch.tensor(s, dtype=dtype)
    mask_t = torch.tensor(mask)
    kwargs = dict(recipe=recipe, normalizer=normalizer, weights=(0.7, 1.3, 0.5), gamma=0.5, k=0.7)

    def ours(x):
        return P.pass_advantage(x, mask_t, torch.tensor(outcome, dtype=dtype), torch.tensor(fmt, dtype=dtype),
                                torch.tensor(gids), **kwargs)

    def plain(x):  # docs/pass.md's loops, fed 0-d tensors so autograd follows them
        rows = [[x[i, t] for t in range(x.shape[1])] for i in range(x.shape[0])]
        return stack(reference_pass(rows, mask, outcome, fmt, gids, **kwargs), dtype)

    check_grads(ours, plain, [s_t], dtype)


# ---------------------------------------------------------------------------------------------------
# PPO's critic: GAE and the clipped value loss
# ---------------------------------------------------------------------------------------------------


def plain_gae(rewards, values, mask, gamma, lam):
    """GAE row by row, token by token, from its definition: A_t = sum_l (gamma lam)^l delta_{t+l}."""
    adv_rows, ret_rows = [], []
    for i, n in enumerate(lengths_of(mask)):
        r, v = [rewards[i, t] for t in range(n)], [values[i, t] for t in range(n)]
        delta = [r[t] + gamma * (v[t + 1] if t + 1 < n else 0.0) - v[t] for t in range(n)]
        a = [sum((gamma * lam) ** l * delta[t + l] for l in range(n - t)) for t in range(n)]
        pad = [torch.zeros((), dtype=rewards.dtype)] * (mask.shape[1] - n)
        adv_rows.append(a + pad)
        ret_rows.append([a[t] + v[t] for t in range(n)] + pad)
    return stack(adv_rows, rewards.dtype), stack(ret_rows, rewards.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_advantage_against_a_plain_loop_with_nan_padding(dtype, gamma, lam):
    lengths = [5, 1, 3, 6]  # ragged, with a one-token row
    rewards, mask = ragged(lengths, seed=11, dtype=dtype)  # NaN on padding
    values, _ = ragged(lengths, seed=12, dtype=dtype)
    for k in (0, 1):  # advantages, then returns: values and gradients against the loop
        check_grads(lambda r, v: prime.gae_advantage(r, v, mask, gamma, lam)[k],
                    lambda r, v: plain_gae(r, v, mask, gamma, lam)[k], [rewards, values], dtype)
    adv, ret = prime.gae_advantage(rewards, values, mask, gamma, lam)
    assert adv.dtype == ret.dtype == dtype
    assert (adv[~mask.bool()] == 0).all() and (ret[~mask.bool()] == 0).all()
    # the one-token row: A = r - V (nothing to bootstrap from), R = r
    assert adv[1, 0].item() == pytest.approx((rewards[1, 0] - values[1, 0]).item(), rel=1e-5)
    assert ret[1, 0].item() == pytest.approx(rewards[1, 0].item(), rel=1e-5)


def test_gae_worked_example_by_hand():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.8], gamma 1: delta = [0.1, 0.2, 0.2]
    r, v, m = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.8]]), torch.ones(1, 3)
    adv, ret = prime.gae_advantage(r, v, m, 1.0, 1.0)  # lam 1: return-to-go minus V
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    adv, ret = prime.gae_advantage(r, v, m, 1.0, 0.0)  # lam 0: the one-step TD error
    torch.testing.assert_close(adv, torch.tensor([[0.1, 0.2, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[0.6, 0.8, 1.0]]))
    # gamma 0.5, lam 0.5: delta = [0 + .3 - .5, 0 + .4 - .6, 1 - .8] = [-0.2, -0.2, 0.2];
    # A_2 = 0.2, A_1 = -0.2 + 0.25 * 0.2 = -0.15, A_0 = -0.2 + 0.25 * -0.15 = -0.2375
    adv, _ = prime.gae_advantage(r, v, m, 0.5, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[-0.2375, -0.15, 0.2]]))


def test_token_rewards_put_the_outcome_on_the_last_token():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    process = torch.tensor([[0.1, -0.2, 0.3], [0.5, float("nan"), float("nan")]])
    out = prime.token_rewards(process, torch.tensor([1.0, 0.0]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.1, -0.2, 1.3], [0.5, 0.0, 0.0]]))
    out = prime.token_rewards(None, torch.tensor([1.0, 0.5]), mask)
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]))


def plain_value_loss(values, old_values, returns, mask, clip):
    total, count = 0.0, 0
    for i, n in enumerate(lengths_of(mask)):
        for t in range(n):
            v, old, ret = values[i, t], old_values[i, t], returns[i, t]
            loss = (v - ret) ** 2
            if clip is not None:
                v_clip = old + torch.clamp(v - old, -clip, clip)
                loss = loss if loss.item() >= ((v_clip - ret) ** 2).item() else (v_clip - ret) ** 2
            total, count = total + 0.5 * loss, count + 1
    return total / count


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_gradient_on_a_ragged_batch(dtype, clip):
    lengths = [4, 1, 6]
    values, mask = ragged(lengths, seed=21, dtype=dtype)  # NaN on padding, even in the live values
    old_values = torch.where(mask.bool(), values + 0.5 * ragged(lengths, seed=22, dtype=dtype)[0], values)
    returns, _ = ragged(lengths, seed=23, dtype=dtype)
    g = check_grads(lambda a, b, c: prime.value_loss(a, b, c, mask, clip),
                    lambda a, b, c: plain_value_loss(a, b, c, mask, clip), [values, old_values, returns], dtype)
    if clip is not None:  # a token moved past the clip range on the side away from R gets no gradient
        assert (g[0] == 0).any()


def test_value_loss_by_hand():
    # one token: V = 1.0, old V = 0.0, R = 2.0, clip 0.5 -> V_clip = 0.5;
    # max((1 - 2)^2, (0.5 - 2)^2) = 2.25, times 0.5 = 1.125; unclipped: 0.5
    v, old, ret, m = torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]), torch.ones(1, 1)
    assert prime.value_loss(v, old, ret, m, 0.5).item() == pytest.approx(1.125)
    assert prime.value_loss(v, old, ret, m, None).item() == pytest.approx(0.5)
    # R = 0.8: unclipped (1 - 0.8)^2 = 0.04, clipped (0.5 - 0.8)^2 = 0.09; the max is the clipped
    # term: 0.5 * 0.09 = 0.045
    assert prime.value_loss(v, old, torch.tensor([[0.8]]), m, 0.5).item() == pytest.approx(0.045)


def test_gae_and_value_loss_defaults_and_a_one_token_batch():
    """Defaults: gamma = lam = 1 (veRL's, A = return-to-go - V) and clip_range 0.5; a batch whose
    responses are all one token long (T = 1); an integer outcome still gives float rewards."""
    r, v, m = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.8]]), torch.ones(1, 3)
    adv, ret = prime.gae_advantage(r, v, m)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.4, 0.2]]))
    one, mask1 = torch.tensor([[2.0], [0.0]]), torch.tensor([[1.0], [1.0]])
    adv, ret = prime.gae_advantage(one, torch.tensor([[0.5], [0.25]]), mask1, 0.9, 0.95)
    torch.testing.assert_close(adv, torch.tensor([[1.5], [-0.25]]))  # r - V: nothing to bootstrap from
    torch.testing.assert_close(ret, one)
    # clip 0.5 by default: V = 1, old 0, R = 2 -> 0.5 * (0.5 - 2)^2 = 1.125 (unclipped would be 0.5)
    assert prime.value_loss(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[2.0]]),
                            torch.ones(1, 1)).item() == pytest.approx(1.125)
    out = prime.token_rewards(None, torch.tensor([1, 0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert out.dtype == torch.float32 and out.tolist() == [[0.0, 1.0], [0.0, 0.0]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_logprobs_skips_a_trailing_position_without_copying_the_logits(dtype):
    """A model's output has one more position than there are labels (the prediction after the last
    token): token_logprobs reads the first T, gives that position a zero gradient, and holds no copy
    of the logits beyond the one gradient tensor (a slice [:, :-1] cost two more: a reshape's copy and
    the slice's padded gradient)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from live_bytes import LiveBytes
    g = torch.Generator().manual_seed(4)
    B, T, V = 3, 40, 500
    logits = (3 * torch.randn(B, T + 1, V, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g)
    w = torch.randn(B, T, generator=g, dtype=torch.float64)
    ours = prime.token_logprobs(logits, labels, 0.7, chunk_elements=8 * V)  # float32, whatever the logits' dtype
    ref = logits.detach().double().requires_grad_()
    plain = torch.log_softmax(ref[:, :T] / 0.7, -1).gather(-1, labels[..., None])[..., 0]
    torch.testing.assert_close(ours.double(), plain, rtol=0, atol=1e-5)  # float32 round-off of |log p| < 40
    (g_ours,) = torch.autograd.grad((ours * w.float()).sum(), logits)
    (g_plain,) = torch.autograd.grad((plain * w).sum(), ref)
    # |g| <= |w| / T, each term exp(x - lse) carrying lse's float32 round-off (|lse| < 64: 64 eps)
    atol = w.abs().max().item() / 0.7 * 64 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(g_ours.double(), g_plain, rtol=0, atol=atol)
    assert g_ours[:, T].abs().max() == 0
    with LiveBytes() as tracked:
        (prime.token_logprobs(logits, labels, 0.7, chunk_elements=8 * V) * w.to(torch.float32)).sum().backward()
    assert logits.grad[:, T].abs().max() == 0
    chunk = 8 * V * 4 * 3  # a chunk's float32 values and the two temporaries of its ops
    assert tracked.peak <= logits.numel() * logits.element_size() + chunk + 64 * B * T, tracked.peak


# ---------------------------------------------------------------------------------------------------
# kl_penalty: the reference regulariser (--kl-coef), k3 and abs
# ---------------------------------------------------------------------------------------------------


def plain_kl(logp, logp_ref, mask, kind):
    """A loop over tokens: k3 = r - log r - 1 with r = exp(ref - logp), clamped to [-10, 10]; abs = |logp - ref|."""
    total, count = 0.0, 0
    for i in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[i, t]:
                d = logp_ref[i, t].detach() - logp[i, t]
                term = (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0) if kind == "k3" else torch.abs(-d)
                total, count = total + term, count + 1
    return total / count


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["k3", "abs"])
def test_kl_penalty_gradient_on_a_ragged_batch(dtype, kind):
    lengths = [5, 1, 3, 4]
    logp, mask = ragged(lengths, seed=11, dtype=dtype, pad=0.0)
    logp_ref = torch.where(mask.bool(), logp + 0.7 * ragged(lengths, seed=12, dtype=dtype)[0], torch.full_like(logp, 7.0))
    logp_ref[3, 0] = logp[3, 0] + 30.0  # r = e^30: k3 past the clamp, no gradient there
    grads = check_grads(lambda a, b: prime.kl_penalty(a, b, mask, kind), lambda a, b: plain_kl(a, b, mask, kind),
                        [logp, logp_ref], dtype)
    assert torch.count_nonzero(grads[1]) == 0  # the reference is frozen: no gradient reaches it


def test_kl_penalty_by_hand():
    """k3 at pi = 0.5, pi_ref = 0.25: r = 0.5, kl = 0.5 - log 0.5 - 1 = 0.19315; d/d log pi = 1 - r = 0.5,
    over 2 valid tokens 0.25 each; abs: |log 0.5 - log 0.25| = log 2. Equal log-probs: 0 and no pull."""
    logp = torch.tensor([[math.log(0.5), math.log(0.5), 9.0]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.25), -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = prime.kl_penalty(logp, ref, mask, "k3")
    assert loss.item() == pytest.approx(0.5 - math.log(0.5) - 1.0, rel=1e-6)
    (g,) = torch.autograd.grad(loss, logp)
    assert g[0].tolist() == pytest.approx([0.25, 0.25, 0.0], rel=1e-6)
    assert prime.kl_penalty(logp, ref, mask, "abs").item() == pytest.approx(math.log(2.0), rel=1e-6)
    same = prime.kl_penalty(ref.clone().requires_grad_(), ref, mask, "k3")
    assert same.item() == 0.0
    with pytest.raises(ValueError, match="kind"):
        prime.kl_penalty(logp, ref, mask, "k2")


def test_policy_health_sums_by_hand_on_a_ragged_batch():
    """rho = (1.5, 0.5, 1.0 | 1.3, pad): A = (1, -1, 1 | -1, ...); eps 0.2. The clip binds at rho 1.5 with
    A > 0 (high) and rho 0.5 with A < 0 (low); rho 1.3 with A < 0 is on the side the clip lets through.
    k3 = rho - 1 - log rho: 0.0945 + 0.1931 + 0 + 0.0376 = 0.3252 over 4 tokens; padding counts nowhere."""
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.3, 50.0, 50.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 5.0, 5.0]])
    sums = prime.policy_health_sums(logp, torch.zeros(2, 3), adv, mask, 0.2)
    k3 = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.0, 1.3))
    assert (sums["clip_high"], sums["clip_low"], sums["tokens"]) == (1.0, 1.0, 4.0)
    assert sums["kl_k3"] == pytest.approx(k3, rel=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_entropy_matches_the_naive_softmax_in_chunks(temperature):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 11, generator=g) * 3
    p = torch.softmax(logits.double() / temperature, -1)
    naive = -(p * torch.log(p)).sum(-1)
    for chunk in (11, 22, 1000):  # one position a chunk, two, all
        torch.testing.assert_close(prime.token_entropy(logits, temperature, chunk).double(), naive, rtol=1e-5, atol=1e-6)
    assert prime.token_entropy(torch.zeros(1, 2, 8))[0].tolist() == pytest.approx([math.log(8)] * 2, rel=1e-6)
    assert prime.token_entropy(logits.bfloat16()).dtype == torch.float32
