"""PASS (Process Advantage Signal Shaping, arXiv 2606.29296) advantage construction, as pure functions.

PASS does not change GRPO's rollout, loss or reference regulariser: it only replaces the advantage
fed to the clipped surrogate (clip 0.2; `prime.ppo_clip_loss`). train.py keeps the regulariser as
the paper's App. G runs it: --kl-coef 1e-2 under --estimator pass (prime.kl_penalty: k3 against the
frozen SFT model; with --pass-preset qa, the masked absolute log-prob difference). The paper's text lost several
equations in conversion; docs/pass.md reconstructs them in this project's words, and every part of
this file that rests on that reconstruction or on one of its assumptions says so with "[A]"
(assumption) or "[R]" (reconstructed from the surviving text and tables). "The paper" = the version
this project implements (arXiv 2606.29296, current version); "v1" = its first public version (arXiv
2606.29296v1), offered as options where the two differ.

The algorithm (`pass_advantage`, default recipe "pass"):

    1. Process channel z_p: normalise the token signal s over the scope
       V = {s[i,t] : i in B, M[i,t] = 1} (the batch; v1: each prompt group) with Masked-Norm
       (s - mean V) / (std V + eps) or Abs-Max s / (max|V| + eps).          -> normalize_process
    2. Outcome and format channels z_o, z_f: GRPO z-scores per prompt group. -> group_zscore
    3. Advantage Fusion (AF, Eq. 4) with a format gate: a = gamma (w_p z_p
       + w_o z_o + w_f z_f) if r_fmt > 0, else gamma W z_f.                 -> advantage_fusion
    4. Chunk-by-Value (CV): the positional mean trace u[t] of the fused
       scores over the batch,                                               -> positional_trace
       shared endpoints where |u[t+1] - u[t]| > eta, plus t1 = T - 1;       -> trace_endpoints
       each response keeps the endpoints on its own valid tokens, and a
       chunk's value is the fused score at its endpoint.                    -> chunk_values
    5. Return-to-go and Divide-Length (DL): A[i,j] = sum_{l >= j} v[i,l]
       / (K_i - j + 1)^k, the divisor counting remaining CHUNKS, not tokens. -> rtg_divide_length
    6. Broadcast: every token of chunk j gets A[i,j]; tokens after the last
       kept endpoint (the "zero-filled tail") and padding get exactly 0.    -> broadcast

The paper's Table 11 controls are the `recipe` flag (outcome_only, process_only, af_only, no_dl, no_cv,
gr3); `PRESETS` holds the paper's math and QA settings and v1's.

Where the process signal comes from. PASS takes any token-level signal s (B, T):
- PRIME's implicit PRM (this project's `prime.py`): s = beta * (log pi_phi(y_t) - log pi_ref(y_t))
  (PRIME Eq. 3, `prime.implicit_process_reward`), one reward per token, token-varying like the QA
  signals below. Both normalisers divide by one scale per scope, so beta (0.05) and PRIME's official
  batch rescaling cancel up to eps: the raw log-ratio and the scaled one give the same z_p. PASS
  then takes the place of PRIME's advantage estimator (Eq. 5, RLOO + whitening): Masked-Norm's mean
  over V stands where PRIME's leave-one-out process baseline stood, the outcome enters as z_o
  (instead of its RLOO term), and CV + RTG + DL replace the token-level return. Everything else in
  PRIME (sampling, filtering, the PRM's online CE update, the PPO loss) is unchanged.
- Teacher signals (paper QA): `opd_signal`, `gopd_signal` (teacher forcing on the student's tokens).
- Step-level PRM scores (paper math: Qwen2.5-Math-PRM-7B, one score per blank-line step):
  `broadcast_step_scores` spreads them over each step's tokens; v1 also chunks by those steps
  (`chunking="steps"`, `step_ids`).
All log-probs are those of the sampled token at each response position (logits shifted by one),
every model on the same token ids.

Conventions shared with the rest of the project: tensors are (B, T) over RESPONSE tokens, right
padded; `mask` is 1 on valid response tokens (EOS included), 0 on padding; the responses of one
prompt share a group id (any integers, in any row order). The output is exactly 0 wherever mask is
0, whatever the padded positions of the inputs hold. The paper's math run masks the process channel
WITHOUT the terminal EOS; to reproduce it, pass that process mask here (the EOS then gets advantage
0). Torch only, on whatever device the inputs are: no model, no I/O, no state.

Usage:
    adv = pass_advantage(s, mask, outcome, fmt, group_ids, **PRESETS["qa"])          # (B, T)
    adv = pass_advantage(s, mask, outcome, fmt, group_ids, recipe="af_only", **PRESETS["qa"])
    adv = pass_advantage(s, mask, outcome, fmt, group_ids, **dict(PRESETS["qa"], normalizer="abs_max"))
    adv = pass_advantage(s, mask, outcome, fmt, group_ids, step_ids=step_ids, **PRESETS["v1"])
"""

import torch

NORMALIZERS = ("masked_norm", "abs_max")
SCOPES = ("batch", "group")
COMPARES = ("consecutive", "anchor")
CHUNKINGS = ("trace", "steps")
RECIPES = ("pass", "outcome_only", "process_only", "af_only", "no_dl", "no_cv", "gr3")

# Each preset lists only what docs/pass.md states for it; every other option keeps the function's
# default, which is always the paper's choice. To change one value:
# `pass_advantage(..., **dict(PRESETS["qa"], normalizer="abs_max"))`.
PRESETS = {
    # Paper, main math comparison (Table 1). Appendix C's single-run sweep finds k = 0.7 best
    # (36.9 vs 35.7 average pass@1); the main runs use k = 1.
    "math": dict(gamma=1.0, eta=1e-8, k=1.0, normalizer="masked_norm"),
    # Paper, multi-hop QA (Table 11): gamma = 1/W with W = w_p + w_o + w_f = 3.
    "qa": dict(weights=(1.0, 1.0, 1.0), gamma=1.0 / 3.0, eta=0.005, k=0.7, normalizer="masked_norm"),
    # v1: group scope, anchor comparison (v1 Algorithm 2), the terminal endpoint L_i always kept,
    # and for step-PRM signals the PRM's own steps as chunks (pass step_ids). For a token-level
    # signal use dict(PRESETS["v1"], chunking="trace"). The group trace is an [A]: docs/pass.md offers
    # a per-group trace as an option without naming its source; v1 is the group-scoped version.
    "v1": dict(gamma=1.0, eta=1e-8, norm_scope="group", trace_scope="group", compare="anchor",
               terminal_endpoint=True, chunking="steps"),
}


# ---------------------------------------------------------------------------------------------------
# Process signals (paper Sec. 4.1 "Process signals"; Sec. 5.1 setup)
# ---------------------------------------------------------------------------------------------------


def opd_signal(logp_teacher: torch.Tensor, logp_student: torch.Tensor) -> torch.Tensor:
    """On-policy distillation signal, paper Sec. 4.1 (Eq. 5):

        s^OPD_{i,t} = l_teacher(x_{i,t} | h_{i,t}) - l_student(x_{i,t} | h_{i,t})

    l = log-prob of the student's sampled token x_{i,t} given its prefix h_{i,t} (teacher forcing).
    Shapes: (B, T), (B, T) -> (B, T). Padding is left as is; `pass_advantage` ignores it.
    Example: opd_signal(tensor([[-1.0]]), tensor([[-3.0]])) -> [[2.0]] (the teacher likes it more).
    """
    return logp_teacher - logp_student


def gopd_signal(logp_teacher: torch.Tensor, logp_base: torch.Tensor, logp_student: torch.Tensor,
                lam: float = 1.25) -> torch.Tensor:
    """Generalised OPD signal, paper Eq. 6 (lost in conversion; docs/pass.md quotes v1 Eq. 5):

        s^G-OPD_{i,t} = lambda (l_T - l_B) - (l_theta - l_B),   lambda = 1.25

    l_B is the frozen base = the initial student. At lambda = 1 it is exactly OPD (l_T - l_theta);
    lambda > 1 extrapolates the teacher's improvement over the base.
    Shapes: three (B, T) -> (B, T).
    Example: l_T = -1, l_B = -2, l_theta = -3, lambda = 1.25 -> 1.25 * 1 - (-1) = 2.25.
    """
    return lam * (logp_teacher - logp_base) - (logp_student - logp_base)


def broadcast_step_scores(step_scores: torch.Tensor, step_ids: torch.Tensor,
                          mask: torch.Tensor) -> torch.Tensor:
    """Token-level signal from step-level PRM scores: s[i,t] = step_scores[i, step_ids[i,t]].

    Paper Sec. 5.1: the PRM scores steps split at blank lines (positive-class probability at each
    step marker), "mapped back to actor-token segments". Shapes: step_scores (B, S) float,
    step_ids (B, T) int with the 0-based step of each token and -1 on tokens in no step, mask (B, T)
    -> (B, T), 0 on tokens in no step and on padding.
    Example: step_scores [[0.9, 0.2]], step_ids [[0, 0, 1, 1, -1]] -> [[0.9, 0.9, 0.2, 0.2, 0.0]].
    """
    in_step = (step_ids >= 0) & (mask != 0)  # (B, T)
    scores = step_scores.gather(1, step_ids.clamp(min=0).long())  # (B, T)
    return torch.where(in_step, scores, torch.zeros_like(scores))


# ---------------------------------------------------------------------------------------------------
# Stage 1: Advantage Fusion (paper Sec. 3 "Normalization scope", Sec. 4.1)
# ---------------------------------------------------------------------------------------------------


def normalize_process(s: torch.Tensor, valid: torch.Tensor, scope_idx: torch.Tensor, n_scopes: int,
                      normalizer: str, eps: float, sum_over_ranks=None, max_over_ranks=None) -> torch.Tensor:
    """Process channel z_p over the scope, paper Sec. 3 "Normalization scope":

        V = {s_{i,t} : i in B, M_{i,t} = 1}
        Masked-Norm: z_p = (s - mean V) / (std V + eps)      Abs-Max: z_p = s / (max|V| + eps)

    [R] The two operators' formulas are docs/pass.md's reconstruction (the paper names them only).
    [A] eps is added to the scale; std is unbiased (ddof 1); std := 0 when |V| <= 1.
    V is the whole batch (paper) or each prompt group (v1): `scope_idx` (B,) maps each row to one of
    `n_scopes` sets. Shapes: s, valid (B, T) -> (B, T), 0 where not valid.
    A scope split over data-parallel ranks (the batch scope) passes `sum_over_ranks` and
    `max_over_ranks` (ddp.Dist.sum / .max): its count, sums and max are then the whole batch's.
    """
    total_ranks = sum_over_ranks or (lambda t: t)
    zero = s.new_zeros(())
    s = torch.where(valid, s, zero)  # (B, T) padding may hold anything (e.g. -inf log-probs)
    if normalizer == "abs_max":
        scale = s.new_zeros(n_scopes).scatter_reduce(
            0, scope_idx, s.abs().amax(dim=1), reduce="amax")  # (S,) max|V|
        scale = max_over_ranks(scale) if max_over_ranks is not None else scale
        return torch.where(valid, s / (scale[scope_idx, None] + eps), zero)
    count = total_ranks(s.new_zeros(n_scopes).index_add_(0, scope_idx, valid.sum(1).to(s.dtype)))
    total = total_ranks(s.new_zeros(n_scopes).index_add_(0, scope_idx, s.sum(1)))
    mean = total / count.clamp(min=1)  # (S,)
    dev = torch.where(valid, s - mean[scope_idx, None], zero)  # (B, T)
    sq = total_ranks(s.new_zeros(n_scopes).index_add_(0, scope_idx, dev.square().sum(1)))
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), zero)  # (S,)
    return dev / (std[scope_idx, None] + eps)


def group_zscore(x: torch.Tensor, group_idx: torch.Tensor, n_groups: int, eps: float) -> torch.Tensor:
    """Sequence-level channel standardised within its prompt group (paper Sec. 3: "z_{o,i} and
    z_{f,i} for their separately group-standardized values"):

        z_i = (r_i - mean_g r) / (std_g r + eps)

    [A] the same eps and ddof as Masked-Norm (so a group of one, or a constant group, gives 0).
    [A] every response of the group counts, also one whose token mask is all zero: these are
    sequence-level rewards with their own (sequence-level) mask (paper Appendix B).
    Shapes: x (B,), group_idx (B,) in [0, n_groups) -> (B,).
    Example: r = [1, 0] in one group -> [0.707, -0.707] (std = 0.7071 with ddof 1).
    """
    one_token = torch.ones(x.shape[0], 1, dtype=torch.bool, device=x.device)
    return normalize_process(x[:, None], one_token, group_idx, n_groups, "masked_norm", eps)[:, 0]


def advantage_fusion(z_p: torch.Tensor, z_o: torch.Tensor, z_f: torch.Tensor, fmt: torch.Tensor,
                     valid: torch.Tensor, weights, W, gamma: float) -> torch.Tensor:
    """Advantage Fusion with a format gate, paper Sec. 4.1, Eq. 4:

        a_{i,t} = gamma * { w_p z_p,i,t + w_o z_o,i + w_f z_f,i   if r_f,i > 0
                          { W z_f,i                                if r_f,i = 0

    gamma sits outside the brace, so it scales both branches (v1 has no gamma: gamma = 1).
    [A] W = w_p + w_o + w_f when not given (3 for unit weights; 2 for outcome-only, where w_p = 0).
    A format violator thus gets the same value at every token, W times its (negative) format score.
    Shapes: z_p (B, T), z_o, z_f, fmt (B,), valid (B, T) -> (B, T), 0 where not valid.
    """
    w_p, w_o, w_f = weights
    W = w_p + w_o + w_f if W is None else W
    kept = w_p * z_p + (w_o * z_o + w_f * z_f)[:, None]  # (B, T)
    gated = (W * z_f)[:, None].expand_as(z_p)  # (B, T)
    a = gamma * torch.where((fmt > 0)[:, None], kept, gated)
    return torch.where(valid, a, a.new_zeros(()))


# ---------------------------------------------------------------------------------------------------
# Stage 2: Chunk-by-Value (paper Sec. 4.2; Appendix B "Masks and endpoints"; v1 Algorithm 2)
# ---------------------------------------------------------------------------------------------------


def positional_trace(a: torch.Tensor, valid: torch.Tensor, trace_idx: torch.Tensor,
                     n_traces: int, sum_over_ranks=None) -> torch.Tensor:
    """Positional mean trace of the fused scores, paper Sec. 4.2:

        u_t = sum_{i in B} M_{i,t} a_{i,t} / max(1, sum_{i in B} M_{i,t}),   t0 <= t <= t1

    The denominator counts the responses still valid at t, so a short response stops pulling the
    mean once it ends; an all-zero-mask row adds no value and no count (Appendix B).
    [A] t0 = 0 and t1 = T - 1: every row of a (B, T) tensor stores T positions, and the interval
    is "the last position covered by any response's stored span" (an all-zero row still counts).
    One trace over the batch (paper) or one per prompt group (option): `trace_idx` (B,) maps rows to
    `n_traces` traces. Shapes: a, valid (B, T) -> u (n_traces, T).
    A trace over a batch split across data-parallel ranks passes `sum_over_ranks` (ddp.Dist.sum):
    the trace is then the whole batch's, as wide as the widest rank's T (so u may be wider than a).
    """
    total_ranks = sum_over_ranks or (lambda t: t)
    fused = torch.where(valid, a, a.new_zeros(()))  # (B, T)
    total = total_ranks(a.new_zeros(n_traces, a.shape[1]).index_add_(0, trace_idx, fused))
    count = total_ranks(a.new_zeros(n_traces, a.shape[1]).index_add_(0, trace_idx, valid.to(a.dtype)))
    return total / count.clamp(min=1)


def trace_endpoints(u: torch.Tensor, eta: float, compare: str) -> torch.Tensor:
    """Shared chunk endpoints from the trace, paper Sec. 4.2 ([R], equation lost in conversion):

        E = { t in [t0, t1] : t = t1  or  |u_{t+1} - u_t| > eta }

    compare="consecutive" (paper, [A]): the prose says CV "uses changes in the fused score trace".
    compare="anchor" (v1 Algorithm 2): compare u_{t+1} with u at the FIRST token of the current
    chunk, so a slow drift eventually closes a chunk; a scan over positions (vectorised over traces).
    Shapes: u (R, T) -> (R, T) bool.
    Example: u = [0, .004, .008, .012], eta = .005: consecutive -> {3}; anchor -> {1, 3}.
    """
    ends = torch.ones_like(u, dtype=torch.bool)  # (R, T); column T-1 = t1 is always an endpoint
    if compare == "consecutive":
        ends[:, :-1] = (u[:, 1:] - u[:, :-1]).abs() > eta
        return ends
    anchor = u[:, 0]  # (R,)
    for t in range(u.shape[1] - 1):
        closes = (u[:, t + 1] - anchor).abs() > eta  # (R,)
        ends[:, t] = closes
        anchor = torch.where(closes, u[:, t + 1], anchor)
    return ends


def step_endpoints(step_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """v1's chunks for step-PRM signals: the PRM's own steps, per response (no trace).

    Endpoint = the last valid token of each step: t is an endpoint if valid and the next token is
    invalid or in another step. The response's last valid token is therefore always one (v1 keeps
    the terminal endpoint L_i). Shapes: step_ids (B, T) int, valid (B, T) -> (B, T) bool.
    Example: step_ids [[0, 0, 1, 1, 1, 2]], all valid -> endpoints at 1, 4, 5.
    """
    same_next = torch.zeros_like(valid)  # (B, T)
    same_next[:, :-1] = (step_ids[:, 1:] == step_ids[:, :-1]) & valid[:, 1:]
    return valid & ~same_next


def last_valid_token(valid: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B, T) bool, True at each row's last valid position (v1's terminal L_i)."""
    pos = torch.arange(valid.shape[1], device=valid.device)
    last = torch.where(valid, pos, -1).amax(dim=1)  # (B,); -1 for an all-zero row
    return pos == last[:, None]


def chunk_values(a: torch.Tensor, ends: torch.Tensor):
    """Chunk values at the response's own endpoints, paper Sec. 4.2 and Appendix B:

        E_i = {b in E : M_{i,b} = 1} = {b_{i,1} < ... < b_{i,K_i}},   b_{i,0} = t0 - 1
        v_{i,j} = a_{i, b_{i,j}}      (the fused score AT the endpoint, not the chunk's mean or sum)

    [R] the value rule is docs/pass.md's reading of the paper's "accumulates endpoint scores".
    Returns v (B, T + 1) with v[i, j-1] = v_{i,j} and zeros from K_i on, K (B,), and chunk_id (B, T):
    the 0-based chunk j - 1 of each token b_{i,j-1} < t <= b_{i,j}, equal to K_i on the tokens after
    the last endpoint (the zero-filled tail). Shapes: a, ends (B, T) with ends already restricted to
    valid tokens.
    """
    ends_int = ends.long()  # (B, T)
    upto = ends_int.cumsum(dim=1)  # (B, T) endpoints at or before t
    chunk_id = upto - ends_int  # (B, T) endpoints strictly before t
    endpoint_score = torch.where(ends, a, a.new_zeros(()))  # (B, T)
    v = a.new_zeros(a.shape[0], a.shape[1] + 1).scatter_add_(1, chunk_id, endpoint_score)
    return v, upto[:, -1], chunk_id


# ---------------------------------------------------------------------------------------------------
# Stage 3: return-to-go and Divide-Length (paper Sec. 3 "Alternative estimators", Sec. 4.3)
# ---------------------------------------------------------------------------------------------------


def rtg_divide_length(v: torch.Tensor, K: torch.Tensor, k: float) -> torch.Tensor:
    """Chunk return-to-go divided by a power of the remaining CHUNK count, paper Sec. 4.3:

        R_{i,j} = sum_{l=j}^{K_i} v_{i,l}          A^DL_{i,j} = R_{i,j} / (K_i - j + 1)^k

    K_i - j + 1 counts the chunks from j to the end, never tokens. k = 1 averages the remaining chunk
    values; k = 0 is the plain chunk return-to-go (the "without DL" control); 0 < k < 1 keeps some
    dependence on the horizon (paper Appendix A, S = R / K^k).
    Shapes: v (B, C) with zeros from column K_i on, K (B,) -> (B, C), 0 from column K_i on.
    Example: v = [1, 2, 4], k = 1 -> [7/3, 3, 4]; k = 0 -> [7, 6, 4].
    """
    R = v.flip(1).cumsum(dim=1).flip(1)  # (B, C)
    # (B, C): K_i - j + 1 for the paper's 1-based j, i.e. K_i - column
    remaining = K[:, None] - torch.arange(v.shape[1], device=v.device)
    divisor = remaining.clamp(min=1).to(v.dtype).pow(k)
    return torch.where(remaining > 0, R / divisor, v.new_zeros(()))


# ---------------------------------------------------------------------------------------------------
# Stage 4: broadcast back to tokens (paper Sec. 4.2)
# ---------------------------------------------------------------------------------------------------


def broadcast(A: torch.Tensor, chunk_id: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Chunk advantages to tokens, paper Sec. 4.2:

        Broadcast(v_i)_t = v_{i,j},   b_{i,j-1} < t <= b_{i,j},   b_{i,0} = t0 - 1

    and 0 elsewhere: on the tail after the last kept endpoint (chunk_id = K_i, where A is 0) and
    wherever the mask is 0. Shapes: A (B, C), chunk_id (B, T) in [0, C), valid (B, T) -> (B, T).
    """
    tokens = A.gather(1, chunk_id)  # (B, T)
    return torch.where(valid, tokens, A.new_zeros(()))


# ---------------------------------------------------------------------------------------------------
# Controls (paper Table 11)
# ---------------------------------------------------------------------------------------------------


def gr3_length_factor(valid: torch.Tensor, group_idx: torch.Tensor, n_groups: int, alpha: float,
                      eps: float) -> torch.Tensor:
    """GR3-style factor, paper Appendix "GR3-style length rescaling" (after Li et al. 2026b):

        q_i = 1 / (1 + alpha L_i / (mean_g L + eps)),   alpha = 0.33

    L_i = the masked response length, mean_g L its prompt group's mean (every response of the group
    counts). [A] eps is the normalisation eps. Applied to the FUSED advantage (not to raw rewards, as
    GR3 does), without CV or RTG. Shapes: valid (B, T), group_idx (B,) -> (B,).
    """
    length = valid.sum(dim=1).double()  # (B,) float64: B numbers, exact whatever the caller's dtype
    total = length.new_zeros(n_groups).index_add_(0, group_idx, length)
    size = length.new_zeros(n_groups).index_add_(0, group_idx, torch.ones_like(length))
    mean = (total / size)[group_idx]  # (B,)
    return 1.0 / (1.0 + alpha * length / (mean + eps))


# ---------------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------------


def _check_option(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def _check_shape(name: str, tensor, shape) -> None:
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(shape):
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name} must be a tensor of shape {tuple(shape)}, got {got}")


def pass_advantage(process_signal: torch.Tensor, mask: torch.Tensor, outcome: torch.Tensor,
                   fmt: torch.Tensor, group_ids: torch.Tensor, *, weights=(1.0, 1.0, 1.0), W=None,
                   gamma: float = 1.0, eta: float = 1e-8, k: float = 1.0,
                   normalizer: str = "masked_norm", eps: float = 1e-4, norm_scope: str = "batch",
                   compare: str = "consecutive", recipe: str = "pass", alpha: float = 0.33,
                   trace_scope: str = "batch", terminal_endpoint: bool = False,
                   chunking: str = "trace", step_ids=None, sum_over_ranks=None,
                   max_over_ranks=None) -> torch.Tensor:
    """PASS token advantages (paper Sec. 4, Figure 1): AF -> CV -> RTG + DL -> broadcast.

    Inputs: process_signal s (B, T) float; mask (B, T), 1 on valid response tokens; outcome r_o and
    fmt r_f (B,) sequence rewards (fmt > 0 passes the format gate); group_ids (B,) ints, equal for
    the responses of one prompt. Output: (B, T) advantages in s's float dtype, exactly 0 on padding.

    Options (defaults = the paper's choices; v1's in brackets):
      weights (w_p, w_o, w_f), W (None: w_p + w_o + w_f), gamma: the AF weights, Eq. 4.
      normalizer "masked_norm" | "abs_max", eps: the process normaliser; eps also in z_o, z_f, gr3.
      norm_scope "batch" ["group"]: V, the set the process channel is normalised over.
      trace_scope "batch" ["group"]: the set the CV trace u_t averages over.
      compare "consecutive" ["anchor"], eta: when the trace closes a chunk.
      terminal_endpoint False [True]: also end a chunk at each response's last valid token.
      chunking "trace" ["steps", with step_ids (B, T) int, for step-PRM signals]: where chunks come from.
      k: the DL exponent.
      recipe, the paper's Table 11 controls:
        "pass"          full pipeline.
        "outcome_only"  A = a with w_p = 0 (W = w_o + w_f = 2 unless W is given); no CV/RTG/DL.
        "process_only"  A = z_p (no outcome, format, weights or gamma).
        "af_only"       A = a; no CV/RTG/DL.
        "no_dl"         PASS with k = 0 (plain chunk return-to-go).
        "no_cv"         PASS with every valid token its own chunk.
        "gr3"           A = a * q_i (gr3_length_factor, alpha); no CV/RTG.
    Unknown option values raise ValueError naming the argument.
    Data parallel: the batch-scope statistics (the process normaliser, the CV trace) are the whole
    batch's when a batch split over ranks passes `sum_over_ranks` and `max_over_ranks`
    (ddp.Dist.sum / .max); group-scope ones need nothing, a group lives on one rank.
    """
    _check_option("normalizer", normalizer, NORMALIZERS)
    _check_option("norm_scope", norm_scope, SCOPES)
    _check_option("trace_scope", trace_scope, SCOPES)
    _check_option("compare", compare, COMPARES)
    _check_option("chunking", chunking, CHUNKINGS)
    _check_option("recipe", recipe, RECIPES)
    if len(weights) != 3:
        raise ValueError(f"weights must be (w_p, w_o, w_f), got {weights!r}")
    if not isinstance(process_signal, torch.Tensor) or process_signal.dim() != 2:
        raise ValueError("process_signal must be a (B, T) tensor")
    B, T = process_signal.shape
    _check_shape("mask", mask, (B, T))
    _check_shape("outcome", outcome, (B,))
    _check_shape("fmt", fmt, (B,))
    _check_shape("group_ids", group_ids, (B,))
    if chunking == "steps" and recipe in ("pass", "no_dl"):
        _check_shape("step_ids (needed by chunking='steps')", step_ids, (B, T))

    s = process_signal if process_signal.is_floating_point() else process_signal.float()
    valid = mask != 0  # (B, T)
    _, group_idx = torch.unique(group_ids, return_inverse=True)  # (B,) in [0, G)
    n_groups = int(group_idx.max()) + 1 if B > 0 else 0
    batch_idx = torch.zeros_like(group_idx)  # (B,) the whole batch as one scope

    # Stage 1: Advantage Fusion ----------------------------------------------------------------------
    if norm_scope == "group":
        z_p = normalize_process(s, valid, group_idx, n_groups, normalizer, eps)  # (B, T)
    else:
        z_p = normalize_process(s, valid, batch_idx, 1, normalizer, eps, sum_over_ranks, max_over_ranks)
    if recipe == "process_only":
        return z_p
    z_o = group_zscore(outcome.to(s.dtype), group_idx, n_groups, eps)  # (B,)
    z_f = group_zscore(fmt.to(s.dtype), group_idx, n_groups, eps)  # (B,)
    if recipe == "outcome_only":
        weights = (0.0, weights[1], weights[2])
    a = advantage_fusion(z_p, z_o, z_f, fmt, valid, weights, W, gamma)  # (B, T)
    if recipe in ("outcome_only", "af_only"):
        return a
    if recipe == "gr3":
        return a * gr3_length_factor(valid, group_idx, n_groups, alpha, eps).to(s.dtype)[:, None]

    # Stage 2: Chunk-by-Value ------------------------------------------------------------------------
    if recipe == "no_cv":
        ends = valid  # (B, T) every valid token is its own chunk
    elif chunking == "steps":
        ends = step_endpoints(step_ids, valid)  # (B, T)
    else:
        if trace_scope == "group":
            u = positional_trace(a, valid, group_idx, n_groups)  # (G, T)
            ends = trace_endpoints(u, eta, compare)[group_idx] & valid  # (B, T)
        else:
            u = positional_trace(a, valid, batch_idx, 1, sum_over_ranks)  # (1, T') T' >= T: all ranks' widest
            ends = trace_endpoints(u, eta, compare)[:, :T] & valid  # (B, T)
        if terminal_endpoint:
            ends = ends | last_valid_token(valid)
    v, K, chunk_id = chunk_values(a, ends)  # (B, T+1), (B,), (B, T)

    # Stage 3: return-to-go and Divide-Length --------------------------------------------------------
    A = rtg_divide_length(v, K, 0.0 if recipe == "no_dl" else k)  # (B, T+1)

    # Stage 4: broadcast -----------------------------------------------------------------------------
    return broadcast(A, chunk_id, valid)
