"""pass_advantage.py against values worked out independently: docs/pass.md's worked example, numbers by
hand (Python's `statistics`, never the module's own helpers), and a plain-loop version of the whole
algorithm written from docs/pass.md's text."""

import importlib.util
import math
import random
import statistics
from pathlib import Path

import pytest
import torch

import pass_advantage as P
from pass_advantage import PRESETS, pass_advantage


def assert_close(actual, expected, atol=1e-9):
    """Element-wise |actual - expected| <= atol; either side a tensor or a nested list."""
    as64 = lambda x: torch.as_tensor(x, dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(as64(actual), as64(expected), atol=atol, rtol=0)


# ---------------------------------------------------------------------- docs/pass.md's worked example

S = [[.25, -.25, -1., -.5, -1., -1.], [-.25, .25, -.5, -1., 0, 0],
     [.5, .5, 0., 0., 0, 0], [-.5, -.5, -.5, 0, 0, 0]]
MASK = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]
R_OUT = [1, 0, 1, 0]
R_FMT = [1, 0, 1, 1]
GID = [0, 0, 1, 1]

# Printed in docs/pass.md (4 decimals), checked there against an independent implementation.
EXPECTED = {
    "math": [[1.0705, 0.7055, 0.4216, 0.5838, 0.0972, 0.0972],
             [-2.121, -2.121, -2.121, -2.121, 0., 0.],
             [1.8235, 1.6612, 1.3368, 1.3368, 0., 0.],
             [-1.0505, -1.0505, -1.0505, 0., 0., 0.]],
    "math_k0.7": [[1.7349, 1.0693, 0.5862, 0.7188, 0.0972, 0.0972],
                  [-3.2149, -2.949, -2.6113, -2.121, 0., 0.],
                  [2.7639, 2.3098, 1.6458, 1.3368, 0., 0.],
                  [-1.4607, -1.2934, -1.0505, 0., 0., 0.]],
    "qa": [[0.5409, 0.2706, 0.0399, 0.0324, 0.0324, 0.0324],
           [-0.983, -0.8704, -0.707, 0., 0., 0.],
           [0.9203, 0.7483, 0.4456, 0., 0., 0.],
           [-0.4869, -0.4311, -0.3502, 0., 0., 0.]],
}
SETTINGS = {"math": PRESETS["math"], "math_k0.7": dict(PRESETS["math"], k=0.7), "qa": PRESETS["qa"]}


def example(dtype=torch.float64):
    """The worked example as (s, mask, outcome, fmt, group_ids) tensors."""
    return (torch.tensor(S, dtype=dtype), torch.tensor(MASK), torch.tensor(R_OUT, dtype=dtype),
            torch.tensor(R_FMT, dtype=dtype), torch.tensor(GID))


def hand_channels():
    """z_p, z_o, z_f of the worked example from `statistics` (batch Masked-Norm, ddof 1, eps 1e-4)."""
    V = [S[i][t] for i in range(4) for t in range(6) if MASK[i][t]]
    mean, std = statistics.mean(V), statistics.stdev(V)
    z_p = [[(S[i][t] - mean) / (std + 1e-4) if MASK[i][t] else 0.0 for t in range(6)] for i in range(4)]
    z_half = 0.5 / (math.sqrt(0.5) + 1e-4)  # a group with rewards {1, 0}: mean 0.5, stdev sqrt(0.5)
    z_o = [z_half, -z_half, z_half, -z_half]
    z_f = [z_half, -z_half, 0.0, 0.0]  # group 1's format rewards are {1, 1}: a constant channel
    return z_p, z_o, z_f


def hand_fused(gamma=1.0, w=(1.0, 1.0, 1.0), W=3.0):
    z_p, z_o, z_f = hand_channels()
    return [[(gamma * (w[0] * z_p[i][t] + w[1] * z_o[i] + w[2] * z_f[i]) if R_FMT[i] > 0
              else gamma * W * z_f[i]) if MASK[i][t] else 0.0 for t in range(6)] for i in range(4)]


@pytest.mark.parametrize("setting", sorted(EXPECTED))
def test_worked_example_reproduces_the_docs(setting):
    for dtype in (torch.float64, torch.float32):
        out = pass_advantage(*example(dtype), **SETTINGS[setting])
        assert out.dtype == dtype
        assert_close(out, EXPECTED[setting], atol=1e-4)


def test_format_violator_carries_gamma_W_z_f_before_return_to_go():
    z_f_violator = -0.5 / (math.sqrt(0.5) + 1e-4)  # response 1: r_fmt = 0 in a group with {1, 0}
    for preset, gamma in (("math", 1.0), ("qa", 1.0 / 3.0)):
        fused = pass_advantage(*example(), recipe="af_only", **PRESETS[preset])
        assert_close(fused[1, :4], [gamma * 3.0 * z_f_violator] * 4)
        assert torch.all(fused[1, 4:] == 0)
    # an explicit W replaces w_p + w_o + w_f in the violator's branch only
    fused = pass_advantage(*example(), recipe="af_only", W=6.0)
    assert_close(fused[1, :4], [6.0 * z_f_violator] * 4)
    assert_close(fused[0], hand_fused()[0])
    # k = 1 averages the remaining chunk values: a constant row stays that constant after RTG + DL
    out = pass_advantage(*example(), **PRESETS["math"])
    assert_close(out[1, :4], [3.0 * z_f_violator] * 4)


def test_padding_and_the_zero_filled_tail_are_exactly_zero():
    s, mask, outcome, fmt, gid = example()
    garbage = torch.where(mask.bool(), s, torch.tensor(float("nan"), dtype=s.dtype))
    garbage[3, 5] = float("-inf")  # e.g. -inf log-probs on padding
    for recipe in P.RECIPES:
        for preset in ("math", "qa"):
            out = pass_advantage(garbage, mask, outcome, fmt, gid, recipe=recipe, **PRESETS[preset])
            assert torch.all(out[mask == 0] == 0), (recipe, preset)
            assert torch.isfinite(out).all()
    # docs/pass.md: with eta = 0.005 rows 1 and 2 end in a zero tail from position 3 (a VALID token)
    out = pass_advantage(s, mask, outcome, fmt, gid, **PRESETS["qa"])
    assert out[1, 3] == 0 and out[2, 3] == 0
    assert out[0, 3] != 0  # row 0's last chunk spans 3..5, so 3 is not in a tail there


def test_all_zero_mask_row_gives_zeros_and_changes_nothing_else():
    s, mask, outcome, fmt, gid = example()
    s5 = torch.cat([s, torch.full((1, 6), 5.0, dtype=s.dtype)])  # a value that would shift V if counted
    mask5 = torch.cat([mask, torch.zeros(1, 6, dtype=mask.dtype)])
    out = pass_advantage(s5, mask5, torch.cat([outcome, outcome[:1]]), torch.cat([fmt, fmt[:1]]),
                         torch.cat([gid, torch.tensor([7])]), **PRESETS["qa"])
    assert torch.all(out[4] == 0)
    # its own group: it adds no process values, no trace counts, no group statistics to the others
    assert_close(out[:4], EXPECTED["qa"], atol=1e-4)
    # in an existing group too, and under every option that touches it
    for kwargs in (dict(norm_scope="group"), dict(trace_scope="group"), dict(compare="anchor"),
                   dict(terminal_endpoint=True), dict(recipe="no_cv"), dict(recipe="gr3")):
        out = pass_advantage(s5, mask5, torch.cat([outcome, outcome[:1]]), torch.cat([fmt, fmt[:1]]),
                             torch.cat([gid, gid[:1]]), **kwargs)
        assert torch.all(out[4] == 0), kwargs


def test_constant_channel_normalises_to_zero():
    s, mask, outcome, fmt, gid = example()
    z = pass_advantage(torch.full_like(s, 0.5), mask, outcome, fmt, gid, recipe="process_only")
    assert z.abs().max() < 1e-9
    # a group whose format rewards are all 1 has z_f = 0: fused = z_p + z_o for group 1
    z_p, z_o, _ = hand_channels()
    fused = pass_advantage(s, mask, outcome, fmt, gid, recipe="af_only")
    assert abs(fused[2, 0].item() - (z_p[2][0] + z_o[2])) < 1e-9


# --------------------------------------------------------------------------- RTG and Divide-Length


def one_response(values, k, **kwargs):
    """PASS on one response of a one-response group (z_o = z_f = 0): the fused trace is z_p itself,
    so with eta = 1e-8 the chunks are exactly the runs of equal values."""
    s = torch.tensor([values], dtype=torch.float64)
    mask = torch.ones_like(s)
    one = torch.ones(1, dtype=torch.float64)
    return pass_advantage(s, mask, one, one, torch.zeros(1, dtype=torch.long), k=k, **kwargs)[0]


def hand_z(values):
    mean, std = statistics.mean(values), statistics.stdev(values)
    return [(x - mean) / (std + 1e-4) for x in values]


def test_divide_length_divides_by_remaining_chunks_not_tokens():
    values = [1.0, 1.0, 1.0, 2.0, 2.0, 4.0]  # chunks {0, 1, 2}, {3, 4}, {5}: K = 3, 6 tokens
    z = hand_z(values)
    v1, v2, v3 = z[2], z[4], z[5]  # each chunk's value is the fused score at its endpoint
    for k in (1.0, 0.7):
        per_chunk = [(v1 + v2 + v3) / 3 ** k, (v2 + v3) / 2 ** k, v3 / 1 ** k]
        expected = [per_chunk[0]] * 3 + [per_chunk[1]] * 2 + [per_chunk[2]]
        out = one_response(values, k)
        assert_close(out, expected)
        # dividing by remaining tokens (6, 5, 4, ...) would give a different first value
        assert abs(out[0].item() - (v1 + v2 + v3) / 6 ** k) > 0.1


def test_k_zero_gives_the_plain_chunk_return_to_go():
    values = [1.0, 1.0, 1.0, 2.0, 2.0, 4.0]
    z = hand_z(values)
    expected = [z[2] + z[4] + z[5]] * 3 + [z[4] + z[5]] * 2 + [z[5]]
    assert_close(one_response(values, 0.0), expected)
    # the "without DL" control is k = 0 whatever k says
    assert_close(one_response(values, 0.7, recipe="no_dl"), expected)


def test_rtg_divide_length_stage_example():
    v = torch.tensor([[1.0, 2.0, 4.0, 0.0]], dtype=torch.float64)
    K = torch.tensor([3])
    assert_close(P.rtg_divide_length(v, K, 1.0), [[7 / 3, 3.0, 4.0, 0.0]])  # (1+2+4)/3, (2+4)/2, 4/1
    assert_close(P.rtg_divide_length(v, K, 0.0), [[7.0, 6.0, 4.0, 0.0]])


# --------------------------------------------------------------------------- Chunk-by-Value options


def test_anchor_comparison_closes_a_chunk_on_slow_drift():
    u = torch.tensor([[0.0, 0.004, 0.008, 0.012]])
    consecutive = P.trace_endpoints(u, 0.005, "consecutive")
    anchor = P.trace_endpoints(u, 0.005, "anchor")
    assert consecutive.tolist() == [[False, False, False, True]]  # each step 0.004 <= eta
    # |0.008 - 0| > eta closes at 1; then |0.012 - 0.008| <= eta
    assert anchor.tolist() == [[False, True, False, True]]
    # a change of exactly eta does not close a chunk (strictly greater)
    u = torch.tensor([[0.0, 0.5, 1.0]])
    assert P.trace_endpoints(u, 0.5, "consecutive").tolist() == [[False, False, True]]
    assert P.trace_endpoints(u, 0.5, "anchor").tolist() == [[False, True, True]]


def test_terminal_endpoint_removes_the_zero_tail():
    # qa example: rows 1 and 2 end in a one-token zero tail at position 3; with v1's terminal
    # endpoint that token becomes a chunk of its own, worth a[i, 3] / 1^k
    fused = hand_fused(gamma=1 / 3)
    out = pass_advantage(*example(), **dict(PRESETS["qa"], terminal_endpoint=True))
    assert abs(out[1, 3].item() - fused[1][3]) < 1e-9
    assert abs(out[2, 3].item() - fused[2][3]) < 1e-9
    # rows without a tail are unchanged
    assert_close(out[[0, 3]], [EXPECTED["qa"][0], EXPECTED["qa"][3]], atol=1e-4)


def test_step_chunking_uses_each_responses_own_steps():
    ends = P.step_endpoints(torch.tensor([[0, 0, 1, 1, 1, 2]]), torch.ones(1, 6, dtype=torch.bool))
    assert ends.tolist() == [[False, True, False, False, True, True]]
    # two responses whose steps do not line up; a group of one each, so fused = z_p (batch scope)
    step_scores = torch.tensor([[0.9, 0.2, 0.6], [0.1, 0.8, 0.0]], dtype=torch.float64)
    step_ids = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, -1, -1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    s = P.broadcast_step_scores(step_scores, step_ids, mask)
    assert s.tolist() == [[0.9, 0.9, 0.2, 0.2, 0.2, 0.6], [0.1, 0.8, 0.8, 0.8, 0.0, 0.0]]
    one = torch.ones(2, dtype=torch.float64)
    out = pass_advantage(s, mask, one, one, torch.tensor([0, 1]), step_ids=step_ids,
                         **dict(PRESETS["v1"], norm_scope="batch"))
    V = [0.9, 0.9, 0.2, 0.2, 0.2, 0.6, 0.1, 0.8, 0.8, 0.8]
    mean, std = statistics.mean(V), statistics.stdev(V)
    z = lambda x: (x - mean) / (std + 1e-4)  # noqa: E731
    row0 = [(z(.9) + z(.2) + z(.6)) / 3] * 2 + [(z(.2) + z(.6)) / 2] * 3 + [z(.6)]
    row1 = [(z(.1) + z(.8)) / 2] + [z(.8)] * 3 + [0.0, 0.0]
    assert_close(out, [row0, row1])


# --------------------------------------------------------------------------- the controls (Table 11)


def test_control_recipes_match_their_definitions():
    s, mask, outcome, fmt, gid = example()
    z_p, z_o, z_f = hand_channels()
    run = lambda recipe: pass_advantage(s, mask, outcome, fmt, gid, recipe=recipe)  # noqa: E731

    assert_close(run("process_only"), z_p)
    assert_close(run("af_only"), hand_fused())
    # outcome-only: w_p = 0 and W = 2 (so the violator gets 2 z_f, not 3 z_f)
    outcome_only = [[(z_o[i] + z_f[i] if R_FMT[i] > 0 else 2 * z_f[i]) if MASK[i][t] else 0.0
                     for t in range(6)] for i in range(4)]
    assert_close(run("outcome_only"), outcome_only)
    # GR3-style: q_i = 1 / (1 + 0.33 L_i / (mean_g L + eps)) times the fused score
    lengths, group_mean = [6, 4, 4, 3], [5.0, 5.0, 3.5, 3.5]
    q = [1 / (1 + 0.33 * lengths[i] / (group_mean[i] + 1e-4)) for i in range(4)]
    fused = hand_fused()
    assert_close(run("gr3"), [[q[i] * x for x in fused[i]] for i in range(4)])
    # without CV: every valid token its own chunk, k = 1 -> mean of the fused scores from t on
    no_cv = [[statistics.mean(fused[i][t:sum(MASK[i])]) if MASK[i][t] else 0.0 for t in range(6)]
             for i in range(4)]
    assert_close(run("no_cv"), no_cv)
    # without DL: PASS with k = 0
    assert_close(run("no_dl"), pass_advantage(s, mask, outcome, fmt, gid, k=0.0), atol=0)
    assert (run("no_dl") - run("pass")).abs().max() > 0.1


# --------------------------------------------------------------------------- a plain-loop PASS


def reference_pass(s, mask, outcome, fmt, gids, *, weights=(1.0, 1.0, 1.0), W=None, gamma=1.0, eta=1e-8,
                   k=1.0, normalizer="masked_norm", eps=1e-4, norm_scope="batch", compare="consecutive",
                   recipe="pass", alpha=0.33, trace_scope="batch", terminal_endpoint=False,
                   chunking="trace", step_ids=None):
    """PASS written from docs/pass.md's text with per-response, per-token Python loops on lists."""
    B, T = len(s), len(s[0])
    members = {}
    for i, g in enumerate(gids):
        members.setdefault(g, []).append(i)
    scopes = lambda scope: [list(range(B))] if scope == "batch" else list(members.values())  # noqa: E731

    def zscore(xs):
        n = len(xs)
        mean = sum(xs) / n if n else 0.0
        std = (sum((x - mean) ** 2 for x in xs) / (n - 1)) ** 0.5 if n > 1 else 0.0  # ** 0.5: autograd follows it
        return [(x - mean) / (std + eps) for x in xs]

    # 1. AF: process channel over its scope, outcome and format within each group
    z_p = [[0.0] * T for _ in range(B)]
    for rows in scopes(norm_scope):
        cells = [(i, t) for i in rows for t in range(T) if mask[i][t]]
        if normalizer == "masked_norm":
            for (i, t), z in zip(cells, zscore([s[i][t] for i, t in cells])):
                z_p[i][t] = z
        else:
            scale = max([abs(s[i][t]) for i, t in cells], default=0.0)
            for i, t in cells:
                z_p[i][t] = s[i][t] / (scale + eps)
    if recipe == "process_only":
        return z_p
    z_o, z_f = [0.0] * B, [0.0] * B
    for rows in members.values():
        for i, zo, zf in zip(rows, zscore([outcome[i] for i in rows]), zscore([fmt[i] for i in rows])):
            z_o[i], z_f[i] = zo, zf
    w_p, w_o, w_f = weights
    if recipe == "outcome_only":
        w_p = 0.0
    WW = w_p + w_o + w_f if W is None else W
    a = [[0.0] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if mask[i][t] and fmt[i] > 0:
                a[i][t] = gamma * (w_p * z_p[i][t] + w_o * z_o[i] + w_f * z_f[i])
            elif mask[i][t]:
                a[i][t] = gamma * WW * z_f[i]
    if recipe in ("outcome_only", "af_only"):
        return a
    if recipe == "gr3":
        out = [[0.0] * T for _ in range(B)]
        for rows in members.values():
            mean_len = sum(sum(mask[i]) for i in rows) / len(rows)
            for i in rows:
                q = 1.0 / (1.0 + alpha * sum(mask[i]) / (mean_len + eps))
                out[i] = [q * x for x in a[i]]
        return out

    # 2. CV: endpoints per response
    ends = [[] for _ in range(B)]
    for i in range(B):
        if recipe == "no_cv":
            ends[i] = [t for t in range(T) if mask[i][t]]
        elif chunking == "steps":
            ends[i] = [t for t in range(T) if mask[i][t] and (t == T - 1 or not mask[i][t + 1]
                                                             or step_ids[i][t + 1] != step_ids[i][t])]
    if recipe != "no_cv" and chunking == "trace":
        for rows in scopes(trace_scope):
            u = []
            for t in range(T):
                num = sum(a[i][t] for i in rows if mask[i][t])
                cnt = sum(1 for i in rows if mask[i][t])
                u.append(num / max(1, cnt))
            shared = []
            if compare == "consecutive":
                shared = [t for t in range(T) if t == T - 1 or abs(u[t + 1] - u[t]) > eta]
            else:
                anchor = u[0]
                for t in range(T - 1):
                    if abs(u[t + 1] - anchor) > eta:
                        shared.append(t)
                        anchor = u[t + 1]
                shared.append(T - 1)
            for i in rows:
                ends[i] = [b for b in shared if mask[i][b]]
                valid = [t for t in range(T) if mask[i][t]]
                if terminal_endpoint and valid and valid[-1] not in ends[i]:
                    ends[i].append(valid[-1])

    # 3. + 4. RTG, DL, broadcast
    kk = 0.0 if recipe == "no_dl" else k
    out = [[0.0] * T for _ in range(B)]
    for i in range(B):
        K = len(ends[i])
        values = [a[i][b] for b in ends[i]]
        previous = -1
        for j in range(K):  # the paper's j is j + 1 here
            adv = sum(values[j:]) / (K - j) ** kk
            for t in range(previous + 1, ends[i][j] + 1):
                if mask[i][t]:
                    out[i][t] = adv
            previous = ends[i][j]
    return out


def random_batch(seed, blocky=True, B=14, T=12):
    """Ragged lengths (an empty and a full response, most ending at 4, 8 or 12), several shuffled
    groups, format violators. blocky: signals constant over aligned blocks of 4 tokens, plus (odd
    seeds) a slow drift shared by all rows, so the trace has flat or slowly drifting runs: CV merges
    tokens, and the consecutive and anchor comparisons disagree for a large enough eta.
    Otherwise token-level noise."""
    rng = random.Random(seed)
    sizes = [4, 3, 4, 3]
    gids = [g for g, n in zip([7, 2, 9, 5], sizes) for _ in range(n)]
    rng.shuffle(gids)
    lengths = [rng.choice([4, 8, 12]) if rng.random() < 0.7 else rng.randint(1, T) for _ in range(B)]
    lengths[0], lengths[1] = 0, T
    mask = [[1 if t < lengths[i] else 0 for t in range(T)] for i in range(B)]
    if blocky:
        blocks = [[rng.gauss(0, 1) for _ in range(T // 4 + 1)] for _ in range(B)]
        drift = 0.03 * (seed % 2)
        s = [[blocks[i][t // 4] + drift * t for t in range(T)] for i in range(B)]
    else:
        s = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    outcome = [float(rng.random() < 0.5) for _ in range(B)]
    fmt = [float(rng.random() < 0.7) for _ in range(B)]
    step_ids = [sorted(rng.randint(0, 3) for _ in range(T)) for _ in range(B)]
    return s, mask, outcome, fmt, gids, step_ids


def vectorised(s, mask, outcome, fmt, gids, step_ids, **kwargs):
    f64 = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    if kwargs.get("chunking") == "steps":
        kwargs["step_ids"] = torch.tensor(step_ids)
    return pass_advantage(f64(s), torch.tensor(mask), f64(outcome), f64(fmt), torch.tensor(gids),
                          **kwargs)


@pytest.mark.parametrize("normalizer", P.NORMALIZERS)
@pytest.mark.parametrize("norm_scope", P.SCOPES)
@pytest.mark.parametrize("trace_scope", P.SCOPES)
@pytest.mark.parametrize("compare", P.COMPARES)
def test_vectorised_matches_plain_loops(normalizer, norm_scope, trace_scope, compare):
    for seed in range(4):
        for blocky in (True, False):
            batch = random_batch(seed, blocky)
            for extra in (dict(eta=1e-8, k=1.0), dict(eta=0.05, k=0.7, gamma=1 / 3),
                          dict(eta=0.3, k=0.5, terminal_endpoint=True, weights=(0.5, 1.0, 2.0))):
                kwargs = dict(normalizer=normalizer, norm_scope=norm_scope, trace_scope=trace_scope,
                              compare=compare, **extra)
                ours = vectorised(*batch, **kwargs)
                ref = reference_pass(*batch[:5], **kwargs)
                assert_close(ours, ref)


@pytest.mark.parametrize("recipe", P.RECIPES)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_vectorised_matches_plain_loops_for_each_recipe_and_preset(recipe, preset):
    for seed in range(4):
        batch = random_batch(seed)
        kwargs = dict(PRESETS[preset], recipe=recipe)
        ref_kwargs = dict(kwargs, step_ids=batch[5])
        assert_close(vectorised(*batch, **kwargs), reference_pass(*batch[:5], **ref_kwargs))


def test_random_batches_exercise_every_option():
    """Guards the two tests above: on these batches each option changes the result somewhere."""
    changed = {name: False for name in ("compare", "norm_scope", "trace_scope", "terminal_endpoint",
                                        "normalizer", "zero_tail", "merged_chunk")}
    for seed in range(3):
        for eta in (1e-8, 0.05, 0.3):
            batch = random_batch(seed)
            base = vectorised(*batch, eta=eta)
            for name, value in (("compare", "anchor"), ("norm_scope", "group"), ("trace_scope", "group"),
                                ("terminal_endpoint", True), ("normalizer", "abs_max")):
                other = vectorised(*batch, eta=eta, **{name: value})
                changed[name] |= bool((other - base).abs().max() > 1e-6)
            valid = torch.tensor(batch[1]).bool()
            changed["zero_tail"] |= bool(((base == 0) & valid).any())
            changed["merged_chunk"] |= bool(((base[:, 1:] == base[:, :-1]) & valid[:, 1:]).any())
    assert all(changed.values()), changed


def test_float32_agrees_with_float64_on_a_larger_batch():
    g = torch.Generator().manual_seed(0)
    B, T = 64, 300
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths[:, None]).long()
    s = torch.randn(B, T, generator=g, dtype=torch.float64)
    outcome = torch.randint(0, 2, (B,), generator=g).double()
    fmt = (torch.rand(B, generator=g) < 0.8).double()
    gid = torch.arange(B) // 8
    for preset in ("math", "qa"):
        hi = pass_advantage(s, mask, outcome, fmt, gid, **PRESETS[preset])
        lo = pass_advantage(s.float(), mask, outcome.float(), fmt.float(), gid, **PRESETS[preset])
        assert torch.allclose(lo.double(), hi, atol=1e-4)


# --------------------------------------------------------------------------- process signals


def test_opd_and_gopd_signals_by_hand():
    l_t = torch.tensor([[-1.0, -0.5]])
    l_b = torch.tensor([[-2.0, -0.5]])
    l_s = torch.tensor([[-3.0, -1.5]])
    assert P.opd_signal(l_t, l_s).tolist() == [[2.0, 1.0]]
    # 1.25 (l_T - l_B) - (l_theta - l_B): 1.25 * 1 - (-1) = 2.25 and 1.25 * 0 - (-1) = 1
    assert P.gopd_signal(l_t, l_b, l_s).tolist() == [[2.25, 1.0]]
    assert P.gopd_signal(l_t, l_b, l_s, lam=2.0).tolist() == [[3.0, 1.0]]
    g = torch.Generator().manual_seed(0)
    l_t, l_b, l_s = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    assert torch.allclose(P.gopd_signal(l_t, l_b, l_s, lam=1.0), P.opd_signal(l_t, l_s), atol=1e-12)


def test_broadcast_step_scores_by_hand():
    scores = torch.tensor([[0.9, 0.2]], dtype=torch.float64)
    ids = torch.tensor([[0, 0, 1, 1, -1, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    assert P.broadcast_step_scores(scores, ids, mask).tolist() == [[0.9, 0.9, 0.2, 0.2, 0.0, 0.0]]


# --------------------------------------------------------------------------- errors a user can cause


@pytest.mark.parametrize("name", ["normalizer", "norm_scope", "trace_scope", "compare", "chunking",
                                  "recipe"])
def test_unknown_option_raises_naming_the_argument(name):
    with pytest.raises(ValueError, match=name):
        pass_advantage(*example(), **{name: "nope"})


def test_bad_shapes_and_missing_step_ids_raise_naming_the_argument():
    s, mask, outcome, fmt, gid = example()
    with pytest.raises(ValueError, match="mask"):
        pass_advantage(s, mask[:, :5], outcome, fmt, gid)
    with pytest.raises(ValueError, match="group_ids"):
        pass_advantage(s, mask, outcome, fmt, gid[:3])
    with pytest.raises(ValueError, match="step_ids"):
        pass_advantage(s, mask, outcome, fmt, gid, **PRESETS["v1"])
    for recipe in ("pass", "no_dl"):  # the two recipes that chunk by steps
        with pytest.raises(ValueError, match=r"step_ids \(needed by chunking='steps'\)"):
            pass_advantage(s, mask, outcome, fmt, gid, chunking="steps", recipe=recipe)
    with pytest.raises(ValueError, match="weights"):
        pass_advantage(s, mask, outcome, fmt, gid, weights=(1.0, 1.0))


def test_benchmark_script_runs_on_a_tiny_batch(capsys):
    path = Path(__file__).resolve().parents[1] / "bench" / "bench_pass.py"
    spec = importlib.util.spec_from_file_location("bench_pass", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--rows", "32", "--length", "64", "--group", "8", "--repeats", "1"])
    printed = capsys.readouterr().out
    assert "v1 preset, step chunks" in printed and " ms" in printed


def test_outcome_only_keeps_the_users_outcome_and_format_weights():
    # outcome_only sets w_p = 0 and keeps w_o, w_f; W defaults to w_o + w_f (here 2.5 + 0.5 = 3)
    s, mask, outcome, fmt, gids, step_ids = random_batch(seed=5)
    for weights, W in (((0.7, 2.5, 0.5), None), ((1.0, 0.3, 2.0), 4.0)):
        got = vectorised(s, mask, outcome, fmt, gids, step_ids, recipe="outcome_only", weights=weights, W=W)
        want = reference_pass(s, mask, outcome, fmt, gids, recipe="outcome_only", weights=weights, W=W)
        assert_close(got, want, atol=1e-9)
    unit = vectorised(s, mask, outcome, fmt, gids, step_ids, recipe="outcome_only")
    assert (got - unit).abs().max() > 0.1  # the weights change the result


def test_more_shape_errors_name_the_argument_and_what_was_given():
    s, mask, outcome, fmt, gid = example()
    with pytest.raises(ValueError, match="process_signal must be a \\(B, T\\) tensor"):
        pass_advantage(s[None], mask, outcome, fmt, gid)  # (1, B, T)
    with pytest.raises(ValueError, match=r"outcome must be a tensor of shape \(4,\), got \(3,\)"):
        pass_advantage(s, mask, outcome[:3], fmt, gid)
    with pytest.raises(ValueError, match=r"fmt must be a tensor of shape \(4,\), got list"):
        pass_advantage(s, mask, outcome, fmt.tolist(), gid)


def test_empty_batch_and_integer_signal():
    T = 5
    empty = pass_advantage(torch.zeros(0, T), torch.zeros(0, T), torch.zeros(0), torch.zeros(0),
                           torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0, T)
    # an integer signal is read as float: the same advantages as its float copy
    s, mask, outcome, fmt, gid = example()
    ints = (s * 10).round().long()
    assert_close(pass_advantage(ints, mask, outcome, fmt, gid), pass_advantage(ints.double(), mask, outcome, fmt, gid),
                 atol=1e-6)
