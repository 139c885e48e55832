"""PRIME's equations as small, pure tensor functions.

PRIME (Process Reinforcement through IMplicit rEwards, arXiv 2502.01456) turns outcome labels into
dense token rewards. Everything it adds to plain RL is in this file; `train.py` calls these functions
in the order of the paper's Algorithm 1:

    1. sample K = n_samples responses per prompt, verify them      -> outcome r_o in [0, 1]
    2. keep prompt groups whose mean accuracy is in [0.2, 0.8]     -> keep_groups
    3. implicit process reward r_phi(y_t) (Eq. 3)                  -> implicit_process_reward
    4. update the implicit PRM on outcome labels (CE, Alg. 1 l. 8) -> prm_ce_loss / prm_dpo_loss
    5. advantages from both reward sources (Eq. 5)                 -> rloo_advantage (+ whiten)
    6. PPO clipped surrogate (Eq. 6)                               -> ppo_clip_loss

Conventions, used by every function:
- Tensors are (B, T) over RESPONSE tokens only (the prompt is cut off), right-padded.
- `mask` is 1 on valid response tokens, EOS included (the official code's mask runs up to and
  including the first EOS), 0 on padding. Functions return exactly 0 wherever mask is 0.
- The K = `n_samples` responses of one prompt are contiguous rows: rows [g*K, (g+1)*K) are group g.
- `outcome` is (B,) in [0, 1]: 0/1 for math, the fraction of tests passed for code.

Where the official code differs from the paper, the function offers both and its docstring says which
is which. "The official code" is the PRIME team's trainer, github.com/PRIME-RL/PRIME, folder `training/`
(an early-2025 fork of veRL: `verl/trainer/ppo/ray_trainer.py` for the loop and the advantages,
`verl/workers/` for the PRM), and veRL's own PRIME recipe (github.com/volcengine/verl, `recipe/prime/`).
Torch only: no model, no I/O.
"""

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------
# Small masked helpers
# ---------------------------------------------------------------------------------------------------


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of x over positions where mask == 1 (0 where there are none). Padding may hold anything,
    NaN and inf included: it is selected away, not multiplied by 0 (NaN * 0 is NaN)."""
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    mask = mask.to(x.dtype)
    total = x.sum() if dim is None else x.sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def reverse_cumsum(x: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return-to-go along the last dim: out[t] = sum_{s >= t} gamma^(s - t) x[s].

    `x` must already be 0 on padding: with right padding the trailing zeros then add nothing.
    """
    if gamma == 1.0:
        return x.flip(-1).cumsum(-1).flip(-1)
    out = torch.zeros_like(x)
    running = torch.zeros_like(x[..., 0])
    for t in range(x.shape[-1] - 1, -1, -1):  # a scan over positions, vectorised over the batch
        running = x[..., t] + gamma * running
        out[..., t] = running
    return out


def _check_groups(batch_size: int, n_samples: int, needs_two: bool = True) -> None:
    if n_samples < 1 or batch_size % n_samples != 0:
        raise ValueError(f"batch of {batch_size} responses is not a whole number of groups of "
                         f"n_samples={n_samples}")
    if needs_two and n_samples < 2:
        raise ValueError(f"n_samples={n_samples}: a leave-one-out / group baseline needs at least "
                         "2 responses per prompt")


def _last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) one-hot of each row's last valid token (all-zero for an empty row)."""
    lengths = mask.long().sum(-1)  # (B,)
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return (positions[None, :] == (lengths - 1)[:, None]) & (lengths[:, None] > 0)


# ---------------------------------------------------------------------------------------------------
# Log-probabilities without a (B, T, V) float32 log-softmax
# ---------------------------------------------------------------------------------------------------


class _TokenLogprob(torch.autograd.Function):
    """log p(label) = logit[label] - logsumexp(logits), computed and differentiated in chunks of positions.

    A plain `log_softmax(logits.float())` materialises a float32 (B, T, V) tensor and autograd keeps
    it for backward: for (8, 4096, 152064) that is 20 GB on top of the logits. Here the forward keeps
    only the per-token logsumexp (B*T floats) and the backward recomputes softmax one chunk at a time:
        d log p(y) / d logit_v = (1[v == y] - softmax(logits / temperature)_v) / temperature.
    Chunks are positions of one row, so `logits` may be a model's output with positions after the last
    label (the prediction that follows the sequence): those are read by no one, and the gradient comes
    back in the output's own shape, with zeros there. No copy of the logits is made: a slice
    `logits[:, :-1]` would be copied whole by a reshape, and its gradient padded back by another.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, chunk_rows):
        B, T = labels.shape
        logsumexp = torch.empty(B, T, dtype=torch.float32, device=logits.device)
        picked = torch.empty_like(logsumexp)
        for b in range(B):
            for start in range(0, T, chunk_rows):
                end = min(start + chunk_rows, T)
                # `.float()` of a float32 tensor is the tensor itself, not a copy: an in-place op here
                # would write into the caller's logits. `/` always allocates. (chunk, V) float32, the
                # only big temporary.
                rows = logits[b, start:end].float() / temperature
                logsumexp[b, start:end] = torch.logsumexp(rows, dim=-1)
                picked[b, start:end] = rows.gather(-1, labels[b, start:end, None]).squeeze(-1)
        ctx.save_for_backward(logits, labels, logsumexp)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return picked - logsumexp

    @staticmethod
    def backward(ctx, grad_out):
        logits, labels, logsumexp = ctx.saved_tensors
        B, T = labels.shape
        scale = grad_out.float() / ctx.temperature  # (B, T)
        grad = torch.empty_like(logits) if logits.shape[1] == T else torch.zeros_like(logits)
        for b in range(B):
            for start in range(0, T, ctx.chunk_rows):
                end = min(start + ctx.chunk_rows, T)
                g = logits[b, start:end].float() / ctx.temperature  # a new tensor: the in-place ops below
                g.sub_(logsumexp[b, start:end, None]).exp_().neg_()  # are on it, never on the logits (-softmax)
                g.scatter_add_(-1, labels[b, start:end, None], torch.ones_like(g[:, :1]))
                grad[b, start:end] = g.mul_(scale[b, start:end, None])
        return grad, None, None, None


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                   chunk_elements: int = 2**24) -> torch.Tensor:
    """Log-probability of each label token: log softmax(logits / temperature)[label].

    Shapes: logits (B, T', V) in any float dtype with T' >= T, labels (B, T) int -> (B, T) float32.
    `logits[:, t]` must be the prediction for `labels[:, t]`; positions T' > T (a model's prediction
    after the last token, when it returns one more) are ignored, with no copy of the logits made.
    Memory: never builds a full (B, T, V) float32 log-softmax; it works on chunks of positions of
    about `chunk_elements` float32 values (64 MB by default), in forward and backward, and its
    gradient is one tensor the size of the logits. Equal to the naive log_softmax + gather to float32
    round-off.
    `temperature` divides the logits, as the sampler did, so the log-probs are those of the
    distribution the tokens were actually drawn from (veRL does the same).
    """
    if logits.dim() != 3 or logits.shape[0] != labels.shape[0] or logits.shape[1] < labels.shape[1]:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    chunk_rows = max(1, chunk_elements // logits.shape[-1])
    return _TokenLogprob.apply(logits, labels.long(), float(temperature), chunk_rows)


# ---------------------------------------------------------------------------------------------------
# Implicit process reward (Sec. 3.1, Eq. 3)
# ---------------------------------------------------------------------------------------------------


def implicit_process_reward(logp_prm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                            beta: float) -> torch.Tensor:
    """Eq. 3: r_phi(y_t) = beta * log( pi_phi(y_t | y_<t) / pi_ref(y_t | y_<t) ).

    Shapes: (B, T) each -> (B, T), exactly 0 on padding (whatever the padded log-probs hold).
    Paper: multiplied by beta (0.05). Official code: the POLICY's reward is the raw log-ratio, then
    `normalize_process_reward` rescales the batch, so beta only matters inside the PRM loss. Pass
    beta=1.0 and call `normalize_process_reward` for the official behaviour.
    At initialisation the PRM equals the reference, so every reward is exactly 0.
    Every valid token is rewarded, the last one (normally EOS) included, as in PRIME-RL. veRL's PRIME
    recipe differs here: it gives the last valid token process reward 0 (it masks the EOS out of the
    log-ratio). We follow PRIME-RL; pass `mask` without the EOS for veRL's behaviour.
    """
    return torch.where(mask.bool(), beta * (logp_prm - logp_ref), torch.zeros_like(logp_prm))


def normalize_process_reward(reward: torch.Tensor, mask: torch.Tensor, max_over_ranks=None) -> torch.Tensor:
    """Official "prime_norm: batch_norm": r <- r / (max_{i,t} |sum_{s >= t} r_{i,s}| + 1e-6).

    One scalar for the whole batch, chosen so that the largest process return-to-go becomes 1: it
    keeps the process term on the scale of the 0/1 outcome term whatever beta and the PRM's drift.
    Not in the paper. Shapes: (B, T) -> (B, T), 0 on padding.
    The official code computes it in one place over the whole batch (veRL's single controller).
    When the batch is split over data-parallel ranks, pass `max_over_ranks` (a function: a tensor ->
    its elementwise max over ranks, e.g. ddp.Dist.max) and the scalar is the whole batch's again;
    without it, each rank's share would be divided by its own largest return.
    """
    reward = torch.where(mask.bool(), reward, torch.zeros_like(reward))
    largest = reverse_cumsum(reward).abs().max() if reward.numel() else reward.new_zeros(())
    if max_over_ranks is not None:
        largest = max_over_ranks(largest)
    return reward / (largest + 1e-6)


# ---------------------------------------------------------------------------------------------------
# Implicit PRM losses (Algorithm 1 line 8; Appendix C.2)
# ---------------------------------------------------------------------------------------------------


def sequence_reward(logp_prm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                    beta: float) -> torch.Tensor:
    """r_phi(y) = beta * sum_t log(pi_phi / pi_ref): the PRM's outcome logit, (B, T) -> (B,)."""
    return implicit_process_reward(logp_prm, logp_ref, mask, beta).sum(-1)


def prm_ce_loss(logp_prm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                outcome: torch.Tensor, beta: float) -> torch.Tensor:
    """Algorithm 1 line 8, the online PRM's cross-entropy:

        L_CE(phi) = -E[ r_o log sigmoid(r_phi(y)) + (1 - r_o) log(1 - sigmoid(r_phi(y))) ],
        r_phi(y) = beta * sum_t log(pi_phi(y_t|y_<t) / pi_ref(y_t|y_<t)).

    Shapes: (B, T) log-probs, (B,) outcome in [0, 1] (soft labels, e.g. a code pass fraction, are
    allowed) -> scalar, mean over the batch. As in the official code the sum runs over all valid
    tokens (EOS included) of the RAW log-ratio, never the normalised policy reward. Computed with
    `binary_cross_entropy_with_logits` (stable for large |r_phi|). At initialisation r_phi = 0 and the
    loss is ln 2 whatever the labels.
    """
    logits = sequence_reward(logp_prm, logp_ref, mask, beta)
    return F.binary_cross_entropy_with_logits(logits, outcome.to(logits.dtype))


def prm_dpo_loss(logp_prm: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                 outcome: torch.Tensor, beta: float, n_samples: int) -> torch.Tensor:
    """Appendix C.2's DPO variant of the PRM loss, as veRL's PRIME recipe implements it.

    For response i with Q_i = r_phi(y^i) (= beta * sum_t log-ratio), compare with the mean Q of the
    responses of the SAME group that have the opposite label:
        correct (r_o > 0):  others = {j : r_o^j < r_o^i},  loss_i = -log sigmoid(Q_i - mean Q_others)
        wrong   (r_o = 0):  others = {j : r_o^j > r_o^i},  loss_i = -log sigmoid(mean Q_others - Q_i)
    With no opposite response in the group, mean Q_others := 0 (veRL). The others' Q is detached, as
    in veRL, where each micro-batch sees only part of a group. Returns the batch mean, a scalar.
    The paper finds DPO and CE equal in accuracy (32.4 vs 32.3) and keeps CE for memory.
    """
    _check_groups(outcome.shape[0], n_samples, needs_two=False)
    q = sequence_reward(logp_prm, logp_ref, mask, beta).view(-1, n_samples)  # (G, K)
    acc = outcome.to(q.dtype).view(-1, n_samples)                             # (G, K)
    correct = acc > 0
    # opposite[g, i, j]: response j of group g has the opposite label to response i
    opposite = torch.where(correct[:, :, None], acc[:, None, :] < acc[:, :, None],
                           acc[:, None, :] > acc[:, :, None])
    q_others = q.detach()[:, None, :].expand_as(opposite)
    other_mean = (q_others * opposite).sum(-1) / opposite.sum(-1).clamp(min=1)  # 0 if none
    sign = correct.to(q.dtype) * 2 - 1
    return -F.logsigmoid(sign * (q - other_mean)).mean()


# ---------------------------------------------------------------------------------------------------
# Advantage estimators (Sec. 3.2 Eq. 5; Appendix B.3; Sec. 5.4)
# ---------------------------------------------------------------------------------------------------


def _outcome_rloo(outcome: torch.Tensor, n_samples: int) -> torch.Tensor:
    """r_o(y^i) - 1/(K-1) sum_{j != i} r_o(y^j), per group, (B,) -> (B,)."""
    groups = outcome.view(-1, n_samples)
    others_mean = (groups.sum(-1, keepdim=True) - groups) / (n_samples - 1)
    return (groups - others_mean).reshape(-1)


def _outcome_return(per_response: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """(B,) -> (B, T): each response's outcome term placed on its last valid token and discounted
    back, gamma^(L-1-t) x; the same value at every token when gamma = 1 (0 on padding)."""
    return reverse_cumsum(per_response[:, None] * _last_token_mask(mask), gamma)


def rloo_advantage(process_reward, outcome: torch.Tensor, mask: torch.Tensor, n_samples: int,
                   gamma: float = 1.0, form: str = "paper", outcome_gamma: float = 1.0) -> torch.Tensor:
    """Eq. 5, RLOO with implicit process rewards plus RLOO with outcome rewards:

        A^i_t = sum_{s=t}^{|y^i|} gamma^(s-t) [ r_phi(y^i_s) - 1/(K-1) sum_{j!=i} mean_s' r_phi(y^j_s') ]
              + gamma_o^(|y^i|-t) [ r_o(y^i) - 1/(K-1) sum_{j!=i} r_o(y^j) ]

    Two discounts, as the official code has them: `gamma` discounts the process return
    (reward_model_gamma), `outcome_gamma` = gamma_o the outcome's, counted back from the last token
    (verifier_gamma). Eq. 5 leaves the outcome undiscounted (gamma_o = 1: the same at every token);
    the paper's runs use 1 for both.

    Shapes: process_reward (B, T) or None (outcome-only RLOO, the paper's baseline), outcome (B,),
    mask (B, T) -> (B, T) unwhitened returns, 0 on padding. Each source gets its own baseline and
    return, then they are added 1:1 ("computed separately to avoid numerical instability").

    form="paper": the equation literally; the outcome term is the same at every token.
    form="official": PRIME's `compute_rloo_returns` (= veRL `masked_rloo`). Per source,
        r'_{i,t} = r_{i,t} * K/(K-1) - (sum_j m_j)/(K-1),  m_j = masked mean of r_j over its tokens,
    the outcome sitting on the last valid token. Expanded, the process part is
        r'_{i,t} = [r_{i,t} - mean_{j!=i} m_j] + (r_{i,t} - m_i)/(K-1),
    the paper's bracket plus a term that sums to zero over each response: per-response sums of
    process reward agree with the paper, token values differ. The outcome term is the same in both
    forms (a single masked position: the bracket is all there is).
    """
    if form not in ("paper", "official"):
        raise ValueError(f"form must be 'paper' or 'official', got {form!r}")
    _check_groups(outcome.shape[0], n_samples)
    valid = mask.bool()
    outcome = outcome.to(torch.float32)
    returns = _outcome_return(_outcome_rloo(outcome, n_samples), mask, outcome_gamma)
    if process_reward is not None:
        r = torch.where(valid, process_reward.to(torch.float32), torch.zeros_like(returns))
        m = masked_mean(r, mask, dim=-1).view(-1, n_samples)  # (G, K) per-response mean reward
        others_mean = ((m.sum(-1, keepdim=True) - m) / (n_samples - 1)).reshape(-1)  # (B,)
        shaped = r - others_mean[:, None]
        if form == "official":
            shaped = shaped + (r - m.reshape(-1)[:, None]) / (n_samples - 1)
        returns = returns + reverse_cumsum(torch.where(valid, shaped, torch.zeros_like(shaped)), gamma)
    return torch.where(valid, returns, torch.zeros_like(returns))


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, sum_over_ranks=None) -> torch.Tensor:
    """Official global whitening: (x - mean) / sqrt(var + 1e-8) over ALL valid tokens of the batch.

    var is the unbiased (n - 1) variance, as in veRL's `masked_whiten`. (B, T) -> (B, T), 0 on padding.
    Not in the paper's equations, but applied to every advantage in the official runs.
    "The batch" is the whole batch of the step: when it is split over data-parallel ranks, pass
    `sum_over_ranks` (a function: a tensor -> its elementwise sum over ranks, e.g. ddp.Dist.sum) and
    the mean and variance are the whole batch's (two small all-reduces: sum and count, then the sum of
    squared deviations), so 1 and 8 GPUs whiten alike. Without it, the statistics are this tensor's.
    """
    total = sum_over_ranks or (lambda t: t)
    valid = mask.bool()
    x = torch.where(valid, x, torch.zeros_like(x))  # padding may hold NaN: never let it reach var
    sums = total(torch.stack([x.sum(), valid.sum().to(x.dtype)]))  # (sum, n)
    n = sums[1]
    mean = sums[0] / n.clamp(min=1)
    var = total((((x - mean) ** 2) * valid).sum()) / (n - 1).clamp(min=1)
    return torch.where(valid, (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


def grpo_advantage(process_reward, outcome: torch.Tensor, mask: torch.Tensor, n_samples: int,
                   gamma: float = 1.0, eps: float = 1e-6, outcome_gamma: float = 1.0) -> torch.Tensor:
    """GRPO (Shao et al. 2024) with optional implicit process rewards (paper Fig. 7 / Table 4).

    Outcome part (GRPO's outcome supervision), the same at every token of response i
    (outcome_gamma = 1; else gamma_o^(|y^i|-t) A_o^i, discounted back from the last token):
        A_o^i = (r_o^i - mean_g r_o) / (std_g r_o + eps)
    Process part, DERIVED here (the paper's Appendix B.3 Eq. 7-8 lost its formula in conversion): the paper states
    that GRPO's process baseline uses the mean and standard deviation of the group's response-averaged
    process rewards m_j, so each token reward is standardised by those group statistics and summed
    into a return, as in GRPO's process supervision:
        A_p^i_t = sum_{s >= t} gamma^(s-t) (r_phi(y^i_s) - mean_g m) / (std_g m + eps)
    std is the unbiased group std (torch.std, as veRL's GRPO). (B, T) -> (B, T), 0 on padding.
    Beware the scale: response means, each an average over tokens, usually spread far less than tokens
    do, and the return sums a z-score per token, so the process part can swamp the outcome's (on the
    embedded default 34-36x its RMS at step 70, where RLOO's is 0.3x: bench/advantage_scale.py;
    docs/REPRODUCTION.md 2.3).
    """
    _check_groups(outcome.shape[0], n_samples)
    valid = mask.bool()
    groups = outcome.to(torch.float32).view(-1, n_samples)
    outcome_adv = ((groups - groups.mean(-1, keepdim=True))
                   / (groups.std(-1, keepdim=True) + eps)).reshape(-1)
    adv = _outcome_return(outcome_adv, mask, outcome_gamma)
    if process_reward is not None:
        r = torch.where(valid, process_reward.to(torch.float32), torch.zeros_like(adv))
        m = masked_mean(r, mask, dim=-1).view(-1, n_samples)
        mean_g = m.mean(-1, keepdim=True).expand_as(m).reshape(-1)
        std_g = m.std(-1, keepdim=True).expand_as(m).reshape(-1)
        z = torch.where(valid, (r - mean_g[:, None]) / (std_g[:, None] + eps), torch.zeros_like(r))
        adv = adv + reverse_cumsum(z, gamma)
    return torch.where(valid, adv, torch.zeros_like(adv))


def reinforce_advantage(process_reward, outcome: torch.Tensor, mask: torch.Tensor,
                        gamma: float = 1.0, outcome_gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE (Williams 1992) with optional implicit process rewards (paper Fig. 7 / Table 4).

    No baseline: the advantage is the return of the combined reward,
        A^i_t = gamma_o^(|y^i|-t) r_o(y^i) + sum_{s >= t} gamma^(s-t) r_phi(y^i_s)
    DERIVED (the paper's Appendix B.3 gives no formula for it): Eq. 5 with its leave-one-out baselines
    removed. Variance reduction then comes only from the global `whiten` applied by train.py, as
    in veRL's REINFORCE++. (B, T) -> (B, T), 0 on padding.
    """
    valid = mask.bool()
    adv = _outcome_return(outcome.to(torch.float32), mask, outcome_gamma)
    if process_reward is not None:
        r = torch.where(valid, process_reward.to(torch.float32), torch.zeros_like(adv))
        adv = adv + reverse_cumsum(r, gamma)
    return torch.where(valid, adv, torch.zeros_like(adv))


def prm_value_advantage(process_reward: torch.Tensor, outcome: torch.Tensor, mask: torch.Tensor,
                        outcome_gamma: float = 1.0) -> torch.Tensor:
    """Sec. 5.4: the implicit PRM as a VALUE model instead of a reward model (worse: 36.6 vs 37.8).

    Yuan et al.'s implicit PRM gives the Q-value of a prefix in closed form,
        q_t = sum_{i <= t} r_phi(y_i),
    so the value of the state before token t is V(y_<t) = q_{t-1} (V = 0 before the first token).
    Used as the baseline of the outcome return, with GAE lambda = 1 (DERIVED: the paper gives no
    formula; this is the Monte-Carlo advantage of a critic, as PPO with lambda = 1 computes it):
        A_t = gamma_o^(L-1-t) r_o - V(y_<t)
    `process_reward` is the raw r_phi (beta-scaled, not normalised): its sum is the PRM's estimate
    of the outcome logit. Only the outcome has a return here, so its discount is the only one.
    (B, T) -> (B, T), 0 on padding.
    """
    valid = mask.bool()
    r = torch.where(valid, process_reward.to(torch.float32), torch.zeros_like(process_reward,
                                                                              dtype=torch.float32))
    value_before = r.cumsum(-1) - r  # q_{t-1}
    adv = _outcome_return(outcome.to(torch.float32), mask, outcome_gamma) - value_before
    return torch.where(valid, adv, torch.zeros_like(adv))


def token_rewards(process_reward, outcome: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The per-token reward a critic-based estimator (PPO + GAE) sees: the outcome reward r_o on each
    row's last valid token, plus the process reward of every token when there is one (PPO + PRIME).
    (B, T), (B,) -> (B, T), 0 on padding (padding may hold NaN: it is selected away)."""
    valid = mask.bool()
    r = outcome.to(torch.float32)[:, None] * _last_token_mask(mask)
    if process_reward is not None:
        r = r + torch.where(valid, process_reward.to(torch.float32), torch.zeros_like(r))
    return torch.where(valid, r, torch.zeros_like(r))


def gae_advantage(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                  lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), PPO's estimator (PRIME Table 4, Fig. 7).

    rewards[i, t]: the reward of token t (`token_rewards`); values[i, t]: the critic's V of the state
    BEFORE token t. Beyond a row's last valid token V and the mask are 0, so the last token's
    bootstrap is 0 (the response has ended):
        delta_t = r_t + gamma * V_{t+1} * m_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}          (A = 0 past the end)
        R_t     = A_t + V_t                                 (the critic's regression target)
    Returns (advantages, returns), both (B, T) float32 (float64 for float64 inputs), unwhitened (train.py whitens the advantages as
    for the other estimators), exactly 0 on padding; padding of the inputs may hold NaN.
    lam = 1: A_t = sum_{s >= t} gamma^(s-t) r_s - V_t, the return-to-go minus V (Monte Carlo).
    lam = 0: A_t = delta_t, the one-step TD error.
    Worked example, one row, r = [0, 0, 1], V = [0.5, 0.6, 0.8], gamma = 1:
        delta = [0 + 0.6 - 0.5, 0 + 0.8 - 0.6, 1 + 0 - 0.8] = [0.1, 0.2, 0.2]
        lam = 1: A = [0.5, 0.4, 0.2] (= 1 - V), R = [1, 1, 1];  lam = 0: A = delta, R = [0.6, 0.8, 1.0].
    The same recursion as veRL's `compute_gae_advantage_return`.
    """
    valid = mask.bool()
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    r = torch.where(valid, rewards.to(dtype), zeros)
    v = torch.where(valid, values.to(dtype), zeros)
    advantages = torch.zeros_like(zeros)
    next_value = torch.zeros_like(zeros[:, 0])
    running = torch.zeros_like(zeros[:, 0])
    for t in range(mask.shape[-1] - 1, -1, -1):  # a scan over positions, vectorised over the batch
        delta = r[:, t] + gamma * next_value - v[:, t]
        running = torch.where(valid[:, t], delta + gamma * lam * running, torch.zeros_like(running))
        advantages[:, t] = running
        next_value = v[:, t]  # 0 at padding: the bootstrap past a row's end
    returns = torch.where(valid, advantages + v, zeros)
    return advantages, returns


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_range: float | None = 0.5) -> torch.Tensor:
    """PPO's clipped value loss (the critic's update), token mean over the valid tokens:

        V_clip = old_V + clip(V - old_V, -c, c)
        L_V    = 0.5 * E_t[ max( (V - R)^2, (V_clip - R)^2 ) ]

    The max keeps the critic from moving its prediction more than c from the value it had when the
    batch was sampled (as veRL's `compute_value_loss`, cliprange_value 0.5). clip_range None: the plain
    0.5 * (V - R)^2. (B, T) each -> scalar; padding may hold NaN.
    """
    valid = mask.bool()
    # select padding away BEFORE any arithmetic: NaN * 0 is NaN, in the backward pass too
    values = torch.where(valid, values, torch.zeros_like(values))
    old_values = torch.where(valid, old_values, torch.zeros_like(values))
    returns = torch.where(valid, returns, torch.zeros_like(values))
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * masked_mean(unclipped, mask)
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    return 0.5 * masked_mean(torch.maximum(unclipped, (clipped_values - returns) ** 2), mask)


# ---------------------------------------------------------------------------------------------------
# Policy loss (Eq. 6)
# ---------------------------------------------------------------------------------------------------


def ppo_clip_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, clip_eps: float = 0.2, dual_clip: float | None = None,
                  token_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 6, PPO's clipped surrogate, negated to be minimised and averaged over valid tokens:

        L(theta) = -E_t[ min( rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t ) ],
        rho_t = pi_theta(y_t|y_<t) / pi_theta_old(y_t|y_<t).

    Shapes: (B, T) each -> scalar. Token-mean over the valid tokens of this (micro-)batch, as the
    official code does (it then averages micro-batch losses over gradient-accumulation steps).
    The min means: once rho_t leaves [1 - eps, 1 + eps] on the side the advantage pushes towards,
    the token contributes no gradient. Inside the range (rho_t = 1 on the first epoch) both branches
    are equal and both carry the full gradient. No KL or entropy term (the paper's run uses neither).

    `dual_clip` = c > 1 (Ye et al. 2020, "dual-clip PPO"; veRL's `clip_ratio_c = 3`): for A_t < 0 the
    per-token loss is also capped at -c A_t, so a token whose ratio has already grown past c stops
    pulling (its unclipped loss -rho_t A_t would grow without bound):
        A_t < 0:  loss_t = min( max(-rho_t A_t, -clip(rho_t) A_t), -c A_t )
    None (the default) is PRIME-RL's loss, which has no dual clip. veRL also clamps the log-ratio
    log rho_t to [-20, 20] before exp; we do not (PRIME-RL does not, and with one PPO epoch per
    batch rho_t stays near 1).

    `token_weights` (B, T), no gradient, multiplies each token's loss before the mean: the rollout
    correction's importance weights (`rollout_is_weights`), as veRL applies them. None = all 1.
    """
    ratio = torch.exp(logp - logp_old)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    loss = torch.maximum(unclipped, clipped)  # (B, T) = -min(rho A, clip(rho) A)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    if token_weights is not None:
        loss = loss * token_weights.detach()
    return masked_mean(loss, mask)


def kl_penalty(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """The reference regulariser GRPO adds to Eq. 6's loss (PASS App. G: coefficient 1e-2), a token mean
    over the sampled tokens y_t of the policy pi and the frozen reference pi_ref:

        k3   (veRL's "low_var_kl", Schulman's k3):  kl_t = r_t - log r_t - 1,  r_t = pi_ref(y_t) / pi(y_t),
             clamped to [-10, 10] as veRL does; an unbiased, always >= 0 estimate of KL(pi || pi_ref)
        abs  (PASS's QA runs: "the masked absolute sampled log-probability difference"):
             kl_t = |log pi(y_t) - log pi_ref(y_t)|
    Shapes: (B, T) each -> scalar. The gradient flows through logp only (pi_ref is frozen):
    d k3_t / d log pi(y_t) = 1 - r_t, so the term pulls log pi(y_t) towards log pi_ref(y_t).
        kl_penalty(log 0.5, log 0.25, 1, "k3") -> 0.5 - log 0.5 - 1 = 0.1931...
    """
    if kind == "k3":
        log_ratio = logp_ref.detach() - logp
        kl = (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)
    elif kind == "abs":
        kl = (logp - logp_ref.detach()).abs()
    else:
        raise ValueError(f"kind must be 'k3' or 'abs', got {kind!r}")
    return masked_mean(kl, mask)


def policy_health_sums(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       clip_eps: float = 0.2) -> dict[str, float]:
    """What RL users watch to see Eq. 6's update go wrong, as sums over valid tokens (to add up over
    micro-batches and ranks, then divide by "tokens"), no gradient:
        clip_high   tokens whose ratio rho_t = pi/pi_old passed 1 + eps with A_t > 0: the clip binds there
                    (veRL's actor/pg_clipfrac counts both sides together)
        clip_low    tokens whose ratio fell below 1 - eps with A_t < 0
        kl_k3       the k3 estimate of KL(pi_old || pi) per token: rho_t - 1 - log rho_t (>= 0; its mean is
                    veRL's actor/ppo_kl up to the estimator, CleanRL's losses/approx_kl)
    Shapes: (B, T) each. With rho_t = 1 (the first step of a batch) every sum but "tokens" is 0.
        rho = (1.5, 0.5, 1.0), A = (1, -1, 1), eps 0.2 -> clip_high 1, clip_low 1,
        kl_k3 = (0.5 - log 1.5) + (-0.5 - log 0.5) + 0 = 0.0945 + 0.1931 = 0.2877"""
    with torch.no_grad():
        m = mask.bool()
        log_ratio = torch.where(m, logp - logp_old, torch.zeros_like(logp))
        ratio = torch.exp(log_ratio)
        high = (ratio > 1.0 + clip_eps) & (advantages > 0) & m
        low = (ratio < 1.0 - clip_eps) & (advantages < 0) & m
        k3 = torch.where(m, ratio - 1.0 - log_ratio, torch.zeros_like(ratio))
        return {"clip_high": float(high.sum()), "clip_low": float(low.sum()), "kl_k3": float(k3.sum()),
                "tokens": float(m.sum())}


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_elements: int = 2**24) -> torch.Tensor:
    """Entropy of the sampling distribution at each position, H_t = -sum_v p_v log p_v with p =
    softmax(logits_t / temperature), computed as logsumexp(z) - sum_v p_v z_v a chunk of positions at a
    time, so no (B, T, V) float32 tensor is made (as token_logprobs). No gradient. Shapes: (B, T, V) ->
    (B, T) float32. Uniform logits over V give log V; one-hot-like logits give ~0."""
    B, T, V = logits.shape
    out = torch.empty(B, T, dtype=torch.float32, device=logits.device)
    chunk = max(1, chunk_elements // V)
    with torch.no_grad():
        for b in range(B):
            for start in range(0, T, chunk):
                z = logits[b, start:start + chunk].float() / temperature  # (chunk, V)
                lse = torch.logsumexp(z, dim=-1, keepdim=True)
                out[b, start:start + chunk] = (lse - (torch.softmax(z, dim=-1) * z).sum(-1, keepdim=True)).squeeze(-1)
    return out


# ---------------------------------------------------------------------------------------------------
# Rollout correction: the sampler is not the trainer
# ---------------------------------------------------------------------------------------------------

IS_LEVELS, IS_MODES = ("token", "sequence"), ("truncate", "mask", "band")


def rollout_is_weights(logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
                       level: str = "token", mode: str = "truncate", cap: float = 2.0) -> torch.Tensor:
    """Importance weights that correct for sampling with another engine than the one that trains.

    vLLM samples in bf16 with its own kernels, so the tokens come from pi_rollout, not from the
    trainer's pi_old that Eq. 6's ratio assumes. Weighting each token's loss by rho = pi_old / pi_rollout
    (capped, since a rare token can make it huge) turns the expectation back into pi_old's:
        level "token":     rho_t = exp(clamp(logp_old_t - logp_rollout_t, -20, 20))
        level "sequence":  rho_i = exp(clamp(sum_t (logp_old_t - logp_rollout_t), -20, 20)), on every token of i
        mode "truncate":   w = min(rho, cap)                      (TIS; veRL's rollout_correction, threshold 2)
        mode "mask":       w = rho if rho <= cap, else 0          (TRL's token_mask / sequence_mask: one-sided)
        mode "band":       w = rho if 1/cap <= rho <= cap, else 0 (IcePop; veRL's mask mode, lower bound 1/upper)
    The two masks differ in more than the lower bound: TRL keeps a masked token in the token mean's
    denominator (it only weighs 0), veRL takes it out of the response mask (the mean is over the tokens
    left). train.py follows each: with "band" the policy loss's token mean counts only in-band tokens
    (band_mask below).
    `logp_old` is the trainer's log-prob of each sampled token under the policy that sampled it, at the
    sampling temperature; `logp_rollout` the sampler's log-prob of the same token under the
    distribution it actually drew from (vLLM's logprobs_mode="processed_logprobs": after temperature,
    and after top-p/top-k renormalisation). With top-p < 1 the weight also carries the nucleus mass
    (pi_old counts the whole vocabulary, pi_rollout only the nucleus), so it corrects the tokens that
    were sampled but cannot correct for the tokens top-p never lets be sampled: that bias remains.
    Shapes: (B, T) each -> (B, T) float32, 0 on padding, no gradient.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"level must be one of {IS_LEVELS}, got {level!r}")
    if mode not in IS_MODES:
        raise ValueError(f"mode must be one of {IS_MODES}, got {mode!r}")
    valid = mask.bool()
    delta = torch.where(valid, logp_old.detach().float() - logp_rollout.detach().float(), 0.0)
    if level == "sequence":
        delta = delta.sum(-1, keepdim=True).expand_as(delta)
    rho = torch.exp(delta.clamp(-20.0, 20.0))
    if mode == "truncate":
        w = rho.clamp(max=cap)
    else:
        w = torch.where((rho <= cap) & ((mode == "mask") | (rho >= 1.0 / cap)), rho, 0.0)
    return torch.where(valid, w, 0.0)


def band_mask(is_weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The loss mask of the "band" mode (veRL's rollout-correction mask, IcePop): the response tokens
    whose weight survived, so that a masked token leaves the token mean's denominator as well as its
    numerator. (B, T) each -> (B, T) float."""
    return mask * (is_weights > 0)


def rollout_mismatch(logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
                     level: str = "token", cap: float = 2.0, mode: str = "truncate") -> dict:
    """What the rollout correction sees, before any truncation, as sums to add over ranks:
    {"abs_logp_diff": sum over tokens of |logp_old - logp_rollout|, "mismatch_tokens": their number,
     "rho_max": the largest rho of `level` (a max, not a sum), "over_cap": tokens (or sequences)
     whose rho exceeds `cap` (with mode "band", or is below 1/cap), "units": tokens (or sequences)}.
     Python floats."""
    valid = mask.bool()
    delta = torch.where(valid, logp_old.float() - logp_rollout.float(), 0.0)
    if level == "sequence":
        rows = valid.any(-1)
        log_rho, units = delta.sum(-1)[rows], rows.sum()
    else:
        log_rho, units = delta[valid], valid.sum()
    rho = torch.exp(log_rho.clamp(-20.0, 20.0))
    cut = (rho > cap) | ((rho < 1.0 / cap) & (mode == "band"))
    return {"abs_logp_diff": delta.abs().sum().item(), "mismatch_tokens": valid.sum().item(),
            "rho_max": rho.max().item() if rho.numel() else 0.0, "over_cap": cut.sum().item(),
            "units": units.item()}


# ---------------------------------------------------------------------------------------------------
# Online prompt filtering (Sec. 3.4) and the PRM accuracy diagnostic (Fig. 5)
# ---------------------------------------------------------------------------------------------------


def keep_groups(outcome: torch.Tensor, n_samples: int, low: float = 0.2,
                high: float = 0.8) -> torch.Tensor:
    """Online prompt filter: keep a prompt if low <= mean accuracy of its K responses <= high.

    (B,) -> (G,) bool, G = B / K. Bounds inclusive, as the official code; a 1e-6 slack keeps
    0.2 inclusive for K = 5 despite float round-off. For K = 4 the means are 0, .25, .5, .75, 1,
    so [0.2, 0.8] drops exactly the all-wrong and all-right groups, whose RLOO outcome advantage is
    0 anyway: filtering spends the batch on prompts that teach something.
    """
    _check_groups(outcome.shape[0], n_samples, needs_two=False)
    mean = outcome.to(torch.float32).view(-1, n_samples).mean(-1)
    return (mean >= low - 1e-6) & (mean <= high + 1e-6)


def mixed_groups(outcome: torch.Tensor, n_samples: int) -> torch.Tensor:
    """(B,) outcomes -> (G,) bool: the groups whose responses do not all have the same outcome."""
    grouped = outcome.view(-1, n_samples)
    return grouped.max(-1).values > grouped.min(-1).values


def prm_pairwise_accuracy(sequence_score: torch.Tensor, outcome: torch.Tensor,
                          n_samples: int) -> torch.Tensor:
    """Fig. 5's PRM classification accuracy, as the official code computes it (`dpo_acc`).

    Within each group, over pairs i < j, with d = score_i - score_j and a = acc_i - acc_j:
        acc_g = sum_pairs [ (d > 0) == (a > 0) ] * |a|  /  sum_pairs |a|
    (pairs with equal accuracy weigh 0); a group whose accuracies are all equal counts 0.5. The
    result is the mean over groups, a 0-d tensor.
    Note the official tie rule: a pair with EQUAL scores counts as right when a < 0 (the later
    response is the better one), so at initialisation (all scores 0) the value depends on the order
    of responses inside each group and is 0.5 only on average. `sequence_score` is sum_t r_phi (B,).
    """
    _check_groups(outcome.shape[0], n_samples, needs_two=False)
    score = sequence_score.to(torch.float32).view(-1, n_samples)
    acc = outcome.to(torch.float32).view(-1, n_samples)
    d = score[:, :, None] - score[:, None, :]  # (G, K, K): d[g, i, j] = s_i - s_j
    a = acc[:, :, None] - acc[:, None, :]
    upper = torch.triu(torch.ones(n_samples, n_samples, dtype=torch.bool, device=score.device), diagonal=1)
    weight = a.abs() * upper
    agree = ((d > 0) == (a > 0)).to(torch.float32)
    total = weight.sum((-1, -2))
    per_group = torch.where(total > 0, (agree * weight).sum((-1, -2)) / total.clamp(min=1e-12),
                            torch.full_like(total, 0.5))
    return per_group.mean()
