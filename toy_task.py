"""The embedded default: a tiny Qwen2 model and a multi-step arithmetic task, built in code.

PRIME's pipeline is base model -> SFT warmup -> RL, with policy, PRM and reference all starting from
the SFT checkpoint. This module reproduces the first two stages at laptop scale, with nothing to
download, so that `python train.py` runs the whole algorithm on any CPU:

- Task: a chain of 2-4 operations on small integers, written with explicit brackets, e.g.
  `((7+5)*3)-4`. The answer is written as steps, one line per operation, then the boxed result:
      7+5=12
      12*3=36
      36-4=32
      \\boxed{32}
  Intermediate results stay in [0, 99] so that a character-level model can learn the arithmetic.
  Graded by verify.py's math path, like any real benchmark.
- Tokenizer: one token per character (`tokenizers` BPE with no merges) wrapped in a
  `PreTrainedTokenizerFast`, so every code path is the one used for real models.
- Model: a ~0.8M-parameter Qwen2 (`Qwen2Config`, head_dim 64, which vLLM's CPU kernels accept).
- SFT warmup: teacher-forced cross-entropy on generated solutions, stopped early (a few minutes on
  2 cores) so the starting policy solves only part of the held-out problems and RL has room to
  improve. The result is cached on disk and reused.
"""

import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

OPS = "+-*"
CHARS = "0123456789+-*()=\n\\{}boxed"
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


@dataclass
class Problem:
    prompt: str   # the question text, e.g. "((7+5)*3)-4\n"
    answer: str   # the gold final answer, e.g. "32"
    solution: str  # the worked steps ending in \boxed{answer}, used only by SFT


def make_problem(rng: random.Random, min_ops: int = 2, max_ops: int = 4) -> Problem:
    """One random problem; all intermediate values stay in [0, 99]."""
    value = rng.randint(1, 9)
    expr, steps = str(value), []
    for _ in range(rng.randint(min_ops, max_ops)):
        while True:
            op, operand = rng.choice(OPS), rng.randint(1, 9)
            result = {"+": value + operand, "-": value - operand, "*": value * operand}[op]
            if 0 <= result <= 99:
                break
        steps.append(f"{value}{op}{operand}={result}")
        expr = f"({expr}){op}{operand}" if steps[1:] else f"{expr}{op}{operand}"
        value = result
    solution = "\n".join(steps) + f"\n\\boxed{{{value}}}"
    return Problem(prompt=expr + "\n", answer=str(value), solution=solution)


def make_problems(n: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(n)]


STEP = re.compile(r"(\d+)([+*-])(\d+)=(-?\d+)")
BOXED = re.compile(r"\\boxed\{(-?\d+)\}")


def check_steps(prompt: str, steps: list[str]) -> list[float]:
    """The exact step checker: 1.0 for each correct step of a response, 0.0 for each wrong one.

    It stands in for a perfect step-level PRM at laptop scale (issue 8; the PASS paper used
    Qwen2.5-Math-PRM-7B). `steps` are the response's lines. Line k (k < number of operations) is
    correct when it reads `a op b = c` with a = the previous line's written result (the problem's
    first number for k = 0), (op, b) = the problem's k-th operation, and c = a op b: each step is
    judged locally, given what the response wrote before it, as a step PRM judges it. The line after
    the last operation is correct when it is `\\boxed{v}` with v = the previous line's result.
    Any other line (an extra step, a box too early, text that does not parse) is wrong.
    Example: prompt "(7+5)*3\n", steps ["7+5=12", "12*3=35", "\\boxed{35}"] -> [1.0, 0.0, 1.0].
    """
    first = int(re.match(r"[(]*(\d+)", prompt).group(1))
    ops = re.findall(r"([+*-])(\d+)", prompt)
    scores, prev = [], first
    for k, line in enumerate(steps):
        line = line.strip()
        step, boxed = STEP.fullmatch(line), BOXED.fullmatch(line)
        if k < len(ops) and step:
            a, op, b, c = int(step[1]), step[2], int(step[3]), int(step[4])
            right = (a == prev and (op, str(b)) == ops[k]
                     and c == {"+": a + b, "-": a - b, "*": a * b}[op])
            scores.append(float(right))
            prev = c
        elif k == len(ops) and boxed:
            scores.append(float(int(boxed[1]) == prev))
        else:
            scores.append(0.0)
            if k < len(ops):  # an unreadable step: judge the next one against the true chain
                prev = gold_values(first, ops)[k]
    return scores


def gold_values(first: int, ops: list[tuple[str, str]]) -> list[int]:
    """The true intermediate results of a chain: gold_values(7, [("+", "5"), ("*", "3")]) -> [12, 36]."""
    values, v = [], first
    for op, b in ops:
        v = {"+": v + int(b), "-": v - int(b), "*": v * int(b)}[op]
        values.append(v)
    return values


# Held-out problems use a seed far from any training seed, and training never draws them by chance
# matters little: the space is large (about 10^5 distinct chains) and the test set is 200 problems.
HELDOUT_SEED = 10_000_019


def heldout_problems(n: int = 200) -> list[Problem]:
    return make_problems(n, HELDOUT_SEED)


def build_tokenizer():
    """Character-level tokenizer: pad=0, eos=1, unk=2, then one id per character of CHARS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte-level symbols (newline is "Ċ"), as Qwen2's tokenizer uses: AutoTokenizer reloads a saved
    # Qwen2 checkpoint's tokenizer as Qwen2Tokenizer, which byte-maps the text; with a plain "\n"
    # in the vocabulary the reloaded tokenizer silently dropped every newline.
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in CHARS.replace("\n", "Ċ"):
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))  # no merges: one char a token
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, padding_side="left")


def build_model(tokenizer, seed: int = 0):
    """A ~0.8M-parameter Qwen2; head_dim 64 because vLLM's CPU attention needs it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=64, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
        tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def sft_batch(tokenizer, problems: list[Problem]):
    """Teacher-forcing batch: prompt + solution + EOS, loss only on the solution and EOS."""
    rows, labels = [], []
    for p in problems:
        prompt_ids = tokenizer(p.prompt)["input_ids"]
        answer_ids = tokenizer(p.solution)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    label_ids = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labels)):  # right padding: positions start at 0 anyway
        input_ids[i, :len(r)] = torch.tensor(r)
        label_ids[i, :len(lab)] = torch.tensor(lab)
        attention[i, :len(r)] = 1
    return input_ids, attention, label_ids


def run_sft(out_dir: Path, steps: int, batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
            log=print):
    """Train the tiny model on worked solutions and save it (model + tokenizer) to out_dir."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    start = time.time()
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:  # linear warmup then cosine decay to 10%
            warm = min(1.0, (step + 1) / 50)
            cosine = 0.55 + 0.45 * torch.cos(torch.tensor(step / max(steps, 1) * 3.14159)).item()
            group["lr"] = lr * warm * cosine
        input_ids, attention, labels = sft_batch(tokenizer, [make_problem(rng) for _ in range(batch_size)])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"sft step {step:5d}/{steps} loss {loss.item():.3f} ({time.time() - start:.0f}s)")
    save_pretrained_atomic(model, tokenizer, out_dir)
    return model, tokenizer


def save_pretrained_atomic(model, tokenizer, out_dir: Path, extra: dict | None = None) -> None:
    """save_pretrained into a temporary folder, then rename: a crash never leaves half a model."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if extra:
        (tmp / "extra.json").write_text(json.dumps(extra, indent=2))
    old = out_dir.with_name(out_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)


def sft_checkpoint(cache_dir: Path, steps: int, seed: int = 0, log=print) -> Path:
    """The cached SFT checkpoint for (steps, seed), trained on first use."""
    path = Path(cache_dir) / f"toy-sft-v2-steps{steps}-seed{seed}"
    if not (path / "config.json").exists():
        log(f"no cached SFT checkpoint at {path}: running the SFT warmup ({steps} steps)")
        run_sft(path, steps, seed=seed, log=log)
    return path
