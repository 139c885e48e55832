"""Step-level process rewards: split a response into steps, score each step, map scores to tokens.

PASS (seed Sec. 5.1) also ran with a learned step-level PRM instead of PRIME's implicit one: the
response is split into steps at blank lines, Qwen2.5-Math-PRM-7B reads the question and the steps
joined by its step marker `<extra_0>`, and the positive-class probability at each marker is that
step's score. The policy is trained on ITS tokens, so each score is then "mapped back to
actor-token segments": every policy token belongs to exactly one step.

    scorer = load_step_scorer("toy")                       # exact checker of the embedded task
    scorer = load_step_scorer("path/to/Qwen2.5-Math-PRM-7B", device="cuda")
    scores = scorer.score(questions, responses)            # list of lists, one score per step
    ids = token_step_ids(pieces, scorer.separator)         # the step of each policy token

Three scorers:
    ToyStepChecker  the exact, rule-based checker of the embedded arithmetic task (one step per line,
                    toy_task.check_steps): an exact step checker at laptop scale, nothing to download.
    ToyFirstStepChecker  the same checker telling only where a response first went wrong (that line
                    0, every other 1): what an outcome-trained PRM could at best learn, since outcome
                    labels give every wrong response the same value (issue 29, E3).
    HFStepPRM       any Hugging Face model with two labels per token read at a step marker: a
                    token-classification model (`AutoModelForTokenClassification`), or Qwen's
                    remote-code `Qwen2ForProcessRewardModel` (loaded with trust_remote_code).
"""

import bisect
import re

import torch
from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification, AutoTokenizer

import data
import toy_task
import verify


def step_spans(text: str, separator: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the steps of `text`; together they cover all of it.

    A step is its content plus the separators that follow it. A run of separators with no content
    before it (e.g. text that starts with a blank line) joins the next step, so no step is empty
    unless the whole text is blank (then it is one step).
    Example: step_spans("a\\n\\nb\\n\\n\\n\\nc", "\\n\\n") -> [(0, 3), (3, 8), (8, 9)].
    """
    spans, start = [], 0
    for m in re.finditer(f"(?:{re.escape(separator)})+", text):
        if text[start:m.start()].strip():
            spans.append((start, m.end()))
            start = m.end()
    if start < len(text) and (text[start:].strip() or not spans):
        spans.append((start, len(text)))
    elif spans:  # trailing separators or blanks belong to the last step
        spans[-1] = (spans[-1][0], len(text))
    return spans or [(0, len(text))]


def step_texts(text: str, separator: str) -> list[str]:
    """The steps' contents, without their separators: what a step PRM reads."""
    return [text[s:e].strip() for s, e in step_spans(text, separator)]


def token_step_ids(pieces: list[str], separator: str) -> list[int]:
    """The step of each token, from the tokens' decoded pieces (in order).

    A token belongs to the step holding its first character; so a token that straddles a step
    boundary (e.g. "2\\n1" in a byte-level BPE) belongs to the earlier step, and a token that
    decodes to nothing (EOS) to the step where it sits. Every token gets exactly one step.
    Example: pieces ["7", "+5=12\\n", "12*3", "=36"] with "\\n" -> [0, 0, 1, 1].
    """
    text = "".join(pieces)
    starts = [s for s, _ in step_spans(text, separator)]
    ids, pos = [], 0
    for piece in pieces:
        ids.append(max(bisect.bisect_right(starts, min(pos, max(len(text) - 1, 0))) - 1, 0))
        pos += len(piece)
    return ids


def response_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token decoded on its own (special tokens as ""), for token_step_ids. For an ASCII
    separator the pieces' separators are exactly the text's, even where a multi-byte character
    spans two tokens (each piece then decodes to a replacement character)."""
    return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=True,
                                  clean_up_tokenization_spaces=False)


class ToyStepChecker:
    """The embedded task's exact step checker, as a step scorer (one step per line)."""

    separator = "\n"

    def score(self, questions: list[str], responses: list[str]) -> list[list[float]]:
        return [toy_task.check_steps(q, step_texts(r, self.separator)) for q, r in zip(questions, responses)]


class ToyFirstStepChecker(ToyStepChecker):
    """The exact checker with the partial credit taken out: the first wrong line scores 0, every
    other line (later slips included) 1. Every wrong response then has the same summed score, as an
    outcome-trained PRM gives every wrong response the same value; what is left is the location.
    Example: the local checker's [1, 0, 1, 0, 1] -> [1, 0, 1, 1, 1]; [1, 1, 1] stays."""

    def score(self, questions: list[str], responses: list[str]) -> list[list[float]]:
        out = []
        for steps in super().score(questions, responses):
            first = next((k for k, s in enumerate(steps) if s < 1), None)
            out.append([0.0 if k == first else 1.0 for k in range(len(steps))])
        return out


def add_step_noise(step_scores: torch.Tensor, step_ids: torch.Tensor, sd: float, seed: int) -> torch.Tensor:
    """step_scores (B, S) + N(0, sd^2) noise on each response's own steps (its padded columns stay 0,
    so a response's mean score over its steps is unchanged in kind). The noise is a function of
    `seed` alone (a resumed run draws the same), from a generator of its own: the sampler's random
    stream is not touched. Issue 29's E4: the exact checker made as noisy as a learned PRM."""
    n_steps = step_ids.max(-1).values + 1  # (B,)
    real = torch.arange(step_scores.shape[1], device=step_scores.device)[None, :] < n_steps[:, None]
    noise = torch.randn(step_scores.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    return step_scores + sd * noise.to(step_scores) * real


class HFStepPRM:
    """A Hugging Face step PRM: question + steps joined by a step marker -> P(good) at each marker.

    Input, as Qwen2.5-Math-PRM's model card builds it: with a chat template,
        system: "Please reason step by step, and put your final answer within \\boxed{}."
        user: the question;  assistant: step_1 <extra_0> step_2 <extra_0> ... step_n <extra_0>
    (without a template: question, newline, then the joined steps). The model returns two logits per
    token; the score of step k is softmax(logits)[1] at the k-th marker. Steps are split at
    `separator` (blank lines for Qwen2.5-Math-PRM). Pieces are tokenised one by one and
    concatenated, so each marker's position is known exactly whatever the tokenizer.
    """

    SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

    def __init__(self, path: str, device="cpu", separator: str = "\n\n", step_token: str = "<extra_0>",
                 dtype=torch.float32, batch_size: int = 8):
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
            arch = (AutoConfig.from_pretrained(path, trust_remote_code=True).architectures or [""])[0]
            if arch.endswith("ForTokenClassification"):
                self.model = AutoModelForTokenClassification.from_pretrained(path, dtype=dtype)
            else:  # Qwen2.5-Math-PRM ships its own class (Qwen2ForProcessRewardModel)
                self.model = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=True)
        except OSError as e:
            raise SystemExit(f"--step-scorer {path}: cannot load a step PRM from it ({e})")
        self.model.to(device).eval().requires_grad_(False)
        marker = self.tokenizer(step_token, add_special_tokens=False)["input_ids"]
        if len(marker) != 1:
            raise SystemExit(f"--step-scorer {path}: the step marker {step_token!r} is not one token "
                             f"of its tokenizer (got {len(marker)} tokens)")
        self.marker_id, self.step_token = marker[0], step_token
        self.separator, self.device, self.batch_size = separator, device, batch_size

    def encode(self, question: str, steps: list[str]) -> tuple[list[int], list[int]]:
        """(input ids, the position of each step's marker)."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            body = self.step_token.join(steps) + self.step_token
            messages = [{"role": "system", "content": self.SYSTEM}, {"role": "user", "content": question},
                        {"role": "assistant", "content": body}]
            ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)
            positions = [i for i, t in enumerate(ids) if t == self.marker_id]
        else:
            ids = tok(question + "\n", add_special_tokens=False)["input_ids"]
            positions = []
            for step in steps:
                ids = ids + tok(step, add_special_tokens=False)["input_ids"] + [self.marker_id]
                positions.append(len(ids) - 1)
        if len(positions) != len(steps):
            raise ValueError(f"step PRM input has {len(positions)} markers for {len(steps)} steps "
                             f"(does a step contain {self.step_token!r}?)")
        return ids, positions

    @torch.no_grad()
    def score(self, questions: list[str], responses: list[str]) -> list[list[float]]:
        out = []
        encoded = [self.encode(q, step_texts(r, self.separator)) for q, r in zip(questions, responses)]
        for s in range(0, len(encoded), self.batch_size):
            chunk = encoded[s:s + self.batch_size]
            width = max(len(ids) for ids, _ in chunk)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            input_ids = torch.full((len(chunk), width), pad)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, (ids, _) in enumerate(chunk):  # right padding: positions count from 0 as usual
                input_ids[i, :len(ids)] = torch.tensor(ids)
                attention[i, :len(ids)] = 1
            result = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device))
            logits = result.logits if hasattr(result, "logits") else result[0]  # (b, T, 2)
            probs = logits.float().softmax(-1)[..., 1].cpu()
            out += [probs[i, positions].tolist() for i, (_, positions) in enumerate(chunk)]
        return out


TOY_SCORERS = ("toy", "toy-first")  # the embedded task's checkers; "chains" checks `data.py chains` files


class ChainStepChecker:
    """The exact step checker of a `data.py chains` task, as a step scorer (one step per line): a sum line
    "x + y = z" scores as data.chain_steps marks it (x the running total the response has, y the
    question's next number, z = x + y), the line that boxes the running total it reached 1, any other
    line 0. Example: "What is 7 + 5 + 8?", "7 + 5 = 13\\n13 + 8 = 21\\nSo \\\\boxed{21}" -> [0, 1, 1]."""

    separator = "\n"

    def score(self, questions: list[str], responses: list[str]) -> list[list[float]]:
        out = []
        for question, response in zip(questions, responses):
            lines = step_texts(response, self.separator)
            sums = iter(data.chain_steps(question, "\n".join(lines)))
            scores, total = [], None
            for line in lines:
                step = data._CHAIN_LINE.match(line)
                if step:
                    scores.append(next(sums))
                    total = int(step.group(3))
                else:
                    boxed = verify.extract_boxed(line)
                    scores.append(1.0 if boxed is not None and total is not None and boxed.strip() == str(total)
                                  else 0.0)
            out.append(scores)
        return out


def load_step_scorer(spec: str, device="cpu", separator: str = ""):
    """--step-scorer: 'toy' = the embedded task's exact checker, 'toy-first' = the same marking only
    the first wrong line, else a path of an HF step PRM."""
    if spec == "toy":
        return ToyStepChecker()
    if spec == "toy-first":
        return ToyFirstStepChecker()
    if spec == "chains":
        return ChainStepChecker()
    return HFStepPRM(spec, device, separator=separator or "\n\n")


def step_scores_and_ids(scorer, tokenizer, questions: list[str], responses: list[str],
                        response_ids: torch.Tensor, response_mask: torch.Tensor):
    """Batch tensors for pass_advantage / the estimators: step scores (B, S) padded with 0, and the
    step of every response token (B, T), -1 on padding."""
    scores = scorer.score(questions, responses)
    B, T = response_ids.shape
    n_steps = max(1, max(len(s) for s in scores))
    score_t = torch.zeros(B, n_steps)
    step_ids = torch.full((B, T), -1, dtype=torch.long)
    for i in range(B):
        n = int(response_mask[i].sum())
        ids = token_step_ids(response_pieces(tokenizer, response_ids[i, :n].tolist()), scorer.separator)
        # The scorer split the decoded text; the pieces give the same step count for ASCII separators.
        # If they ever disagree, extra tokens fall in the last scored step.
        last = max(len(scores[i]) - 1, 0)
        step_ids[i, :n] = torch.tensor([min(k, last) for k in ids], dtype=torch.long)
        if scores[i]:
            score_t[i, :len(scores[i])] = torch.tensor(scores[i])
    return score_t, step_ids


def step_end_rewards(token_signal: torch.Tensor, step_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A step-level score as a reward given once per step, on the step's last token (0 elsewhere).

    For the estimators' Eq. 5 (return-to-go of per-token rewards): a broadcast score would count a
    step once per token, so long steps would weigh more. (B, T) broadcast signal, (B, T) step ids
    (-1 = no step), (B, T) mask -> (B, T).
    Example: signal [[.9, .9, .2, .2, 0]], step_ids [[0, 0, 1, 1, -1]] -> [[0, .9, 0, .2, 0]].
    """
    valid = (step_ids >= 0) & (mask != 0)
    nxt = torch.cat([step_ids[:, 1:], torch.full_like(step_ids[:, :1], -1)], 1)
    nxt_valid = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], 1)
    last = valid & (~nxt_valid | (nxt != step_ids))
    return torch.where(last, token_signal, torch.zeros_like(token_signal))


def first_wrong_steps(step_scores: torch.Tensor, step_ids: torch.Tensor) -> torch.Tensor:
    """The first step a step checker marks wrong (score < 1), per response; -1 when every step is right.

    step_scores (B, S) padded with 0 past each response's own steps, step_ids (B, T) (-1 on padding)
    as `step_scores_and_ids` returns them -> (B,) long. Padded step columns never count.
    Example: scores [[1, 0, 1], [1, 1, 0]] with 3 and 2 steps -> [1, -1].
    """
    n_steps = step_ids.max(-1).values + 1  # (B,) steps of each response
    column = torch.arange(step_scores.shape[1], device=step_scores.device)
    wrong = (step_scores < 1) & (column[None, :] < n_steps[:, None])  # (B, S)
    first = torch.where(wrong, column[None, :], step_scores.shape[1]).min(-1).values
    return torch.where(first < step_scores.shape[1], first, torch.full_like(first, -1))


def checker_steps(tokenizer, questions: list[str], responses: list[str], ro, embedded: bool):
    """Where an exact checker knows the steps: the step of each response token (B, R) and the first step
    it marks wrong (B,), -1 if none; `ro` the responses' Rollout. The embedded task has ToyStepChecker;
    a `data.py chains` or `sums` file (every question "What is a + b + ...?") has ChainStepChecker;
    any other --data has none: (None, None), and the localisation and the episodes' steps are not drawn."""
    if embedded:
        checker = ToyStepChecker()
    elif questions and all(data.is_chain_question(q) for q in questions):
        checker = ChainStepChecker()
    else:
        return None, None
    scores, step_ids = step_scores_and_ids(checker, tokenizer, questions, responses, ro.response_ids, ro.response_mask)
    return step_ids, first_wrong_steps(scores, step_ids)


def right_with_wrong_step(outcome: torch.Tensor, first_wrong: torch.Tensor) -> tuple[int, int]:
    """Right answers reached through a wrong step: (right responses the checker marks a step wrong in,
    right responses). An outcome reward pays for these as for clean ones, e.g. "75 + 24 = 109 /
    109 + 44 = 143": two slips of 10 that cancel. A process reward is meant to tell them apart.
    Shapes: outcome (B,) in [0, 1] (right: 1), first_wrong (B,) int (-1: no wrong step), one device.
    Example: outcome [1, 1, 0, 1], first wrong [-1, 2, 0, 0] -> (2, 3)."""
    right = outcome >= 1
    return int((right & (first_wrong >= 0)).sum()), int(right.sum())


def checker_diagnostics(signal, step_ids, first_wrong, outcome: torch.Tensor, n_train: int):
    """train.py's two exact-checker diagnostics over a step's training rows (the first n_train):
    (localized, wrong, right_slipped, right) = step_localization of the process signal over the
    wrong responses, and right_with_wrong_step. step_ids and first_wrong come from checker_steps
    (None where no checker knows the questions: all four are 0); signal (B, T) is the per-token
    process reward, None for outcome-only (nothing to localise: the first two are 0)."""
    if first_wrong is None:
        return 0, 0, 0, 0
    device = outcome.device
    first_wrong = first_wrong[:n_train].to(device)
    right_slipped, n_right = right_with_wrong_step(outcome[:n_train], first_wrong)
    if signal is None:
        return 0, 0, right_slipped, n_right
    wrong_first = torch.where(outcome[:n_train] < 1, first_wrong, -1)  # right responses are not counted
    localized, n_wrong = step_localization(signal[:n_train], step_ids[:n_train].to(device), wrong_first)
    return localized, n_wrong, right_slipped, n_right


def step_localization(token_reward: torch.Tensor, step_ids: torch.Tensor, first_wrong: torch.Tensor):
    """Does the process reward blame the right step? (hits, count) over the responses that have a
    first wrong step (first_wrong >= 0).

    A hit: the step with the most negative summed reward, sum_{t in step k} r_t, is the first wrong
    step. Steps that hold no token never win; ties go to the earlier step. Neither paper has this
    diagnostic: the pairwise accuracy (Fig. 5) asks whether the PRM ranks whole responses right,
    this asks whether it finds where a wrong one went wrong.
    Shapes: token_reward (B, T), step_ids (B, T) int (-1 = no step), first_wrong (B,) -> two ints.
    Example: rewards [[0, -.5, 0, .1]], steps [[0, 1, 1, 2]], first wrong 1 -> sums [0, -.5, .1] -> (1, 1).
    """
    B = token_reward.shape[0]
    n_steps = int(step_ids.max()) + 1 if step_ids.numel() else 0
    if n_steps <= 0 or B == 0:
        return 0, 0
    valid = step_ids >= 0
    index = step_ids.clamp(min=0).long()
    sums = torch.zeros(B, n_steps, dtype=torch.float64, device=token_reward.device)
    sums.scatter_add_(1, index, torch.where(valid, token_reward.double(), torch.zeros_like(sums[:, :1])))
    tokens = torch.zeros(B, n_steps, dtype=torch.long, device=token_reward.device)
    has_token = tokens.scatter_add_(1, index, valid.long()) > 0  # (B, S)
    blamed = torch.where(has_token, sums, torch.full_like(sums, float("inf"))).argmin(-1)  # (B,)
    counted = first_wrong >= 0
    return int(((blamed == first_wrong) & counted).sum()), int(counted.sum())
