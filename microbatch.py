"""Every training pass one micro-batch at a time: log-probs and critic values of sampled responses,
and the optimizer steps of the policy, the PRM and the critic.

    logp = logprobs_no_grad(model, ro, args)                   # (B, R), no graph, micro-batch by micro-batch
    plan = plan_update(ro, n_rows, args, d)                    # which rows go into which micro-batch
    losses = run_update(model, opt, loss_fn, count, plan, args, d, grad_clip)   # one step per mini-batch

Each row's prompt and response go into the forward as ONE left-padded sequence (forward_sequences),
so a micro-batch is only as wide as its own longest row; with --max-tokens-per-micro-batch the rows
are sorted by length and cut into the fewest micro-batches of at most N padded tokens (pack_rows).
Whatever the split, each optimizer step minimises the token mean over its whole mini-batch on all
ranks (--loss-mean global), so the gradient is the same to round-off (tests/test_microbatch.py).

Precision (--precision bf16, the default on a GPU): every forward pass here runs under bf16 autocast
(`autocast`), while weights, gradients, AdamW's state and DDP's reduction stay fp32 and the output
layer computes in fp32 (models.keep_head_fp32). A no-grad pass that pairs with an update (the
reference with the PRM's, pi_old with the policy's) runs each row in the same micro-batch as that
update (`plan=`): the same rows, padding and precision give the same numbers, so on the first
mini-batch of a step the implicit reward is exactly 0 and the PPO ratio exactly 1.
"""

import contextlib
import dataclasses
import math

import torch

import prime
from config import Args
from ddp import Dist, all_reduce, all_reduce_max
from runlog import optimizer_state_to
from rollout import Rollout, position_ids_from_mask


def response_logprobs(model, ro: Rollout, temperature: float = 1.0, entropy: bool = False):
    """log pi(y_t | x, y_<t) for every response token, (B, R) float32, 0 on padding; with entropy=True
    also the entropy of the sampling distribution at each response position (B, R), no gradient.

    Each row's prompt and response go in as one sequence (forward_sequences); only the last
    positions, where the responses are, go through the LM head (`logits_to_keep`), and
    prime.token_logprobs and prime.token_entropy never build a full float32 log-softmax.
    """
    t = ro.trimmed()
    R, width = t.response_ids.shape[1], ro.response_ids.shape[1]
    out, input_ids = forward_sequences(model, t, logits_to_keep=R + 1)
    # (B, R + 1, V): position t predicts the row's last R tokens' t-th; the last position (what follows
    # the row) is read by no one, and token_logprobs skips it without copying the logits
    logp = widen(to_response_columns(prime.token_logprobs(out.logits, input_ids[:, -R:], temperature), t.response_mask),
                 width)
    if not entropy:
        return logp
    return logp, widen(to_response_columns(prime.token_entropy(out.logits[:, :R], temperature), t.response_mask), width)


def forward_sequences(model, ro: Rollout, **kwargs):
    """(model output, input ids) of each row's prompt + response on the model's device, as ONE
    left-padded sequence: the real tokens of prompt and response, contiguous, ending at the last
    column. A batch's padding is then what its longest sequence needs, whatever the spread of prompt
    and response lengths (prompts left-padded to the widest prompt and responses right-padded to the
    widest response would pad twice). Positions come from the attention mask, so left padding does
    not shift them, exactly as in HF generate. Response token t of a row with L response tokens sits
    L - t columns from the end; to_response_columns puts it back in column t."""
    device = model.device if hasattr(model, "device") else next(model.parameters()).device  # DDP: no .device
    ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    mask = torch.cat([ro.prompt_mask, ro.response_mask], 1)
    order = torch.argsort(mask, dim=1, stable=True)  # per row: padding first, then the real tokens in order
    width = int(mask.sum(1).max())
    ids, mask = ids.gather(1, order)[:, -width:].to(device), mask.gather(1, order)[:, -width:].to(device)
    return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                 use_cache=False, **kwargs), ids


def to_response_columns(last: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) values of the last R tokens of each forward_sequences row -> (B, R) with response
    token t in column t, 0 on padding. Row i's response (L_i tokens) fills the last L_i of the R
    columns, so its token t is at column R - L_i + t of `last`."""
    R = response_mask.shape[1]
    lengths = response_mask.sum(1).to(last.device)
    column = ((R - lengths)[:, None] + torch.arange(R, device=last.device)[None]).clamp(max=R - 1)
    return last.gather(1, column) * response_mask.to(last.device)


def widen(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, R') -> (B, width) with zeros on the right: back to the batch's response width."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def critic_values(critic, ro: Rollout) -> torch.Tensor:
    """--estimator ppo: V(x, y_<t) for every response token t, (B, R) float32, 0 on padding.

    The critic is the SFT model's backbone with a scalar head (AutoModelForTokenClassification, one
    label): its output at a position is the value of the sequence up to and including that position,
    so the state BEFORE response token t is read one position to the left, as the log-prob of token
    t is read from the logits one position to the left."""
    t = ro.trimmed()
    R = t.response_ids.shape[1]
    out, _ = forward_sequences(critic, t)
    values = out.logits[:, -R - 1:-1, 0].float()  # the state before each of the last R tokens
    return widen(to_response_columns(values, t.response_mask), ro.response_ids.shape[1])


@dataclasses.dataclass
class MicroBatch:
    """The rows of one forward/backward and the response columns they use.

    `rows` index the batch (any order: the token-budget plan groups rows by length); `width` is the
    widest response among them, so `of(x)` cuts a (B, R) tensor of the batch down to the micro-batch's
    (b, width) and `rollout(batch)` gives its rows trimmed of the padding they do not use. `weight`
    is 0 for a zero-weight repeat (see plan_update)."""
    rows: torch.Tensor
    width: int
    weight: float = 1.0

    def rows_of(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.rows.to(x.device), :self.width]

    def put(self, x: torch.Tensor, value: torch.Tensor) -> None:
        x[self.rows.to(x.device), :self.width] = value.to(x.dtype)

    def rollout(self, ro: Rollout) -> Rollout:
        return ro.select(self.rows).trimmed()


_told_long_rows = False  # a row over the token budget is reported once per process


def pack_rows(ro: Rollout, start: int, stop: int, args: Args, unit: int = 1) -> list[MicroBatch]:
    """Rows [start, stop) of `ro` as micro-batches, `unit` consecutive rows never split (a group, for
    the DPO loss, which compares responses within it).

    --max-tokens-per-micro-batch 0: `micro_batch_size` rows at a time, in order. Otherwise the units are
    sorted by length (prompt + response), longest first, and cut into runs whose padded size, rows x
    the run's longest sequence (forward_sequences pads each row to that), fits the budget: as FEW
    micro-batches as the budget allows and, among those cuts, the least padding (fewest computed
    tokens), found exactly by dynamic programming over the cut points. Rows of like length then share
    a micro-batch instead of each being padded to the longest row of the whole batch. A unit longer
    than the budget gets a micro-batch of its own."""
    global _told_long_rows
    prompt_len, response_len = ro.prompt_mask.sum(1).tolist(), ro.response_mask.sum(1).clamp(min=1).tolist()
    units = [list(range(s, min(s + unit, stop))) for s in range(start, stop, unit)]
    if not args.max_tokens_per_micro_batch:
        per = max(args.micro_batch_size // unit, 1)
        groups = [sum(units[i:i + per], []) for i in range(0, len(units), per)]
        return [MicroBatch(torch.tensor(g), max(response_len[r] for r in g)) for g in groups]
    budget = args.max_tokens_per_micro_batch
    longest_of = lambda u: max(prompt_len[r] + response_len[r] for r in u)  # noqa: E731
    units.sort(key=lambda u: -longest_of(u))
    longest = [longest_of(u) for u in units]
    # best[i] = (micro-batches, computed tokens, end of the first run) for units i..n-1
    n = len(units)
    best = [(0, 0, n)] * (n + 1)
    for i in range(n - 1, -1, -1):
        rows, choice = 0, None
        for j in range(i + 1, n + 1):  # the run i..j-1, padded to longest[i]
            rows += len(units[j - 1])
            size = rows * longest[i]
            if size > budget and j > i + 1:
                break
            if size > budget and not _told_long_rows:
                _told_long_rows = True
                print(f"--max-tokens-per-micro-batch {budget}: a row of {size} tokens (prompt + response"
                      f"{', its group' if unit > 1 else ''}) gets a micro-batch of its own", flush=True)
            option = (1 + best[j][0], size + best[j][1], j)
            if choice is None or option[:2] < choice[:2]:
                choice = option
        best[i] = choice
    batches, i = [], 0
    while i < n:
        rows = sum(units[i:best[i][2]], [])
        batches.append(MicroBatch(torch.tensor(rows), max(response_len[r] for r in rows)))
        i = best[i][2]
    return batches


def plan_update(ro: Rollout, n_rows: int, args: Args, d: Dist, unit: int = 1) -> list[list[MicroBatch]]:
    """This rank's micro-batches for each of the `args.mini_batches` optimizer steps over rows
    [0, n_rows): the rows are split into that many contiguous parts (at unit boundaries), each part
    packed by pack_rows.

    DDP all-reduces gradients at every backward of the sync step: every rank must run the same number
    of backwards or the job hangs. A rank with fewer micro-batches in a step repeats its first unit
    with weight 0 (a real forward/backward that contributes nothing); a rank whose filter kept
    nothing (n_rows = 0) uses the first rows of the placeholder group train.py keeps for this purpose."""
    n_units = math.ceil(n_rows / unit)
    M = args.mini_batches
    bounds = [min((k * n_units + M - 1) // M * unit, n_rows) for k in range(M + 1)]  # the first parts get any extra
    steps = [pack_rows(ro, a, b, args, unit) for a, b in zip(bounds, bounds[1:])]
    n_global = all_reduce_max([len(s) for s in steps], d)
    repeat = pack_rows(ro, 0, min(unit, len(ro)), args, unit)[0]
    return [s + [dataclasses.replace(repeat, weight=0.0)] * (int(n) - len(s)) for s, n in zip(steps, n_global)]


@torch.no_grad()
def batched_no_grad(fn, ro: Rollout, args: Args, plan=None) -> torch.Tensor:
    """fn(trimmed micro-batch Rollout) -> (b, width) for the whole batch, micro-batch by micro-batch
    (pack_rows; the paired_layout of an update's `plan`), under --precision's autocast, without a
    graph; (B, R) float32, 0 on padding."""
    out = torch.zeros(ro.response_ids.shape, dtype=torch.float32)
    layout = paired_layout(ro, args, plan) if plan is not None else pack_rows(ro, 0, len(ro), args)
    for mb in layout:
        with autocast(args):
            value = fn(mb.rollout(ro))
        out = out.to(value.device)
        mb.put(out, value.float())
    return out


def logprobs_no_grad(model, ro: Rollout, args: Args, temperature: float = 1.0, plan=None) -> torch.Tensor:
    """response_logprobs for a whole batch, one micro-batch at a time, without a graph; with the
    `plan` of the update it pairs with, in that update's micro-batches (paired_layout)."""
    return batched_no_grad(lambda r: response_logprobs(model, r, temperature), ro, args, plan)


def values_no_grad(critic, ro: Rollout, args: Args, plan=None) -> torch.Tensor:
    return batched_no_grad(lambda r: critic_values(critic, r), ro, args, plan)


def paired_layout(ro: Rollout, args: Args, plan: list[list[MicroBatch]]) -> list[MicroBatch]:
    """Every row of `ro` once, laid out as the update of `plan` (plan_update over rows [0, n)) lays
    them out: its real micro-batches first, then the rows [n, B) it does not train on, packed by
    pack_rows. Floating-point sums depend on what shares a micro-batch (padding, the attention
    kernel's blocks): a pass that will be compared with the update's own forward must run the same."""
    real = [mb for step in plan for mb in step if mb.weight]
    n = sum(len(mb.rows) for mb in real)
    return real + (pack_rows(ro, n, len(ro), args) if n < len(ro) else [])


def autocast(args: Args):
    """--precision bf16: the forward passes in bfloat16 autocast (matmuls in bf16; weights, gradients and
    optimizer state stay fp32) on the device train.py trains on (a GPU when there is one); fp32: a no-op."""
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=args.precision == "bf16")


def run_update(model, optimizer, loss_fn, count, plan: list[list[MicroBatch]], args: Args, d: Dist,
               grad_clip: float, grad_norms: list | None = None) -> list[float]:
    """One optimizer step per entry of `plan` (plan_update); loss_fn(micro-batch) -> its loss, a mean
    over `count(micro-batch)` units (tokens for the token-mean losses, responses for the PRM's).
    Returns each step's loss, the same on every rank; each step's gradient norm before clipping (the
    same on every rank: DDP's gradients are all-reduced) is appended to `grad_norms`.

    --loss-mean global (default): each step minimises the mean over ALL its units, on every rank and
    in every micro-batch, as Eq. 6's token mean over the mini-batch reads: micro-batch i's mean is
    weighted by n_i / N (N = the units of the step over all ranks) and multiplied by the world size,
    because DDP averages gradients over ranks. The split into micro-batches and ranks then changes
    nothing but round-off; zero-weight repeats add nothing and dilute nothing.
    --loss-mean micro: the official code's mean of micro-batch means (veRL's loss / gradient
    accumulation steps, then DDP's average over ranks), which the paper's runs used: a short
    micro-batch's tokens weigh more than a long one's, and a rank with fewer rows weighs as much as
    one with many."""
    n_step = all_reduce([sum(count(mb) for mb in step if mb.weight) for step in plan], d)
    if args.offload_optimizer:  # the moments come to the GPU for this update only, and go back after it
        optimizer_state_to(optimizer, d.device)
    losses = []
    for step, n in zip(plan, n_step):
        if not n:  # nothing kept on any rank: no update (an AdamW step on zero gradients would still move)
            continue
        n_real = sum(1 for mb in step if mb.weight)
        # zeroed in place, not freed: under DDP the gradients stay views into its buckets
        # (gradient_as_bucket_view); freed, each backward would allocate them anew beside the buckets
        optimizer.zero_grad(set_to_none=False)
        logged = 0.0
        for j, mb in enumerate(step):
            # DDP: all-reduce gradients only on the last micro-step of the optimizer step
            sync = j == len(step) - 1 or not hasattr(model, "no_sync")
            with (contextlib.nullcontext() if sync else model.no_sync()):
                with autocast(args):
                    loss = loss_fn(mb)
                if args.loss_mean == "global":
                    share = mb.weight * count(mb) / n  # of the step's global mean
                else:
                    share = mb.weight / max(n_real, 1) / d.world  # of the mean over ranks of micro-means
                (loss * share * d.world).backward()  # x world: DDP divides the summed gradients by it
            logged += loss.item() * share
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if grad_norms is not None:
            grad_norms.append(float(norm))
        optimizer.step()
        losses.append(logged)
    if args.offload_optimizer:
        optimizer_state_to(optimizer, "cpu")
    return all_reduce(losses, d)  # the global mean (global), the mean over ranks of micro-means (micro)


def needs_old_logprobs(args: Args, models, rollout: Rollout) -> bool:
    """Whether pi_old's log-probs need a forward pass of their own before the updates. With one
    optimizer step per batch (--mini-batches 1) the policy that takes the step IS the old policy: the
    update's own forward gives pi_old's log-probs (rho_t = 1 exactly in Eq. 6, the first PPO epoch).
    The pass is needed with several mini-batches (from the second on, the model is no longer pi_old),
    where pi_old is the PRM's reference (--reference policy at T = 1) or OPD's student, and where
    another engine sampled (vLLM: the rollout correction compares the two engines' log-probs)."""
    return (args.mini_batches > 1 or rollout.sampler_logprobs is not None or (args.temperature == 1.0 and (
        args.process in ("opd", "gopd") or (args.process == "implicit" and models.reference is None))))
