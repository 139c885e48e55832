"""The embedded default: a tiny Qwen2 model and a multi-step arithmetic task, built in code.

PRIME's pipeline is base model -> SFT warmup -> RL, with policy, PRM and reference all starting from
the SFT checkpoint. This module reproduces the first two stages at laptop scale, with nothing to
download, so that `python train.py` runs the whole algorithm on any CPU:

- Task: a chain of `ops` = 3-6 operations (`--toy-ops`) on small integers, written with explicit
  brackets, e.g. `((7+5)*3)-4`. The answer is written as steps, one line per operation, then the
  boxed result:
      7+5=12
      12*3=36
      36-4=32
      \\boxed{32}
  The true intermediate results stay in [0, 99] so that a character-level model can learn the
  arithmetic. Graded by verify.py's math path against the TRUE result, like any real benchmark.
- A noisy demonstrator writes the SFT solutions (`--toy-slip`, 0.15): at each step, with
  probability `slip`, it writes a wrong result (a different value within +-9 of the right one, kept
  in [0, 99]) and carries on from its own wrong value, as a person who slips would; the box holds its
  last written value. The SFT model learns the slips with the arithmetic: its greedy answer is
  mostly right, its samples slip on some steps. That is what RL can fix, and what a process reward
  can localise: `check_steps` marks exactly the slipped line.
- Tokenizer: one token per character (`tokenizers` BPE with no merges) wrapped in a
  `PreTrainedTokenizerFast`, so every code path is the one used for real models.
- Model: a ~0.8M-parameter Qwen2 (`Qwen2Config`, head_dim 64, which vLLM's CPU kernels accept).
- SFT warmup: teacher-forced cross-entropy on the demonstrator's solutions, a fixed recipe (3000
  steps of 64, warmup then cosine, float32) long enough that the model has learned the arithmetic
  and only the slips remain. The recipe's checkpoint of every setting the README and the study use
  ships in checkpoints/ (checked by hash): every machine starts RL from the same bytes. Another
  setting is trained once and cached. `python toy_task.py --ops 3-6 --slip 0.15` rebuilds one.
"""

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from runlog import replace_folder, write_atomic

OPS = "+-*"
CHARS = "0123456789+-*()=\n\\{}boxed"
PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


DEFAULT_OPS = (3, 6)   # operations per chain, inclusive (--toy-ops 3-6)
DEFAULT_SLIP = 0.15    # the demonstrator's chance of a wrong result at each step (--toy-slip)


@dataclass
class Problem:
    prompt: str   # the question text, e.g. "((7+5)*3)-4\n"
    answer: str   # the gold final answer (the TRUE result), e.g. "32"
    solution: str  # the correct worked steps ending in \boxed{answer}
    first: int = 0  # the chain's first number, e.g. 7
    ops: tuple = ()  # the chain's operations, e.g. (("+", 5), ("*", 3), ("-", 4))


def apply(op: str, a: int, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def make_problem(rng: random.Random, min_ops: int = DEFAULT_OPS[0], max_ops: int = DEFAULT_OPS[1]) -> Problem:
    """One random problem; all true intermediate values stay in [0, 99]."""
    value = rng.randint(1, 9)
    first, expr, ops = value, str(value), []
    for _ in range(rng.randint(min_ops, max_ops)):
        while True:
            op, operand = rng.choice(OPS), rng.randint(1, 9)
            result = apply(op, value, operand)
            if 0 <= result <= 99:
                break
        expr = f"({expr}){op}{operand}" if ops else f"{expr}{op}{operand}"
        ops.append((op, operand))
        value = result
    problem = Problem(prompt=expr + "\n", answer=str(value), solution="", first=first, ops=tuple(ops))
    problem.solution = demonstrate(problem, rng, 0.0)  # the demonstrator who never slips (draws nothing)
    return problem


def demonstrate(problem: Problem, rng: random.Random, slip: float) -> str:
    """The noisy demonstrator's solution: each step slips with probability `slip`.

    A slip writes a different value within +-9 of the step's right result (given the line before),
    kept in [0, 99] (unless an earlier slip carried the chain out of that range); the next step starts from the written value, and the box holds the last one.
    demonstrate(problem of "(7+5)*3", rng, 0.0) -> "7+5=12\n12*3=36\n\\boxed{36}"; a slip on step 1
    might give "7+5=13\n13*3=39\n\\boxed{39}" (graded wrong: the gold answer is 36).
    """
    value, lines = problem.first, []
    for op, b in problem.ops:
        result = apply(op, value, b)
        if slip and rng.random() < slip:  # slip 0 draws nothing: the clean stream of earlier versions
            near = [v for v in range(result - 9, result + 10) if v != result]
            # kept in [0, 99]; a chain already carried out of range by an earlier slip slips anywhere near
            result = rng.choice([v for v in near if 0 <= v <= 99] or near)
        lines.append(f"{value}{op}{b}={result}")
        value = result
    return "\n".join(lines) + f"\n\\boxed{{{value}}}"


def make_problems(n: int, seed: int, min_ops: int = DEFAULT_OPS[0], max_ops: int = DEFAULT_OPS[1]) -> list[Problem]:
    rng = random.Random(seed)
    return [make_problem(rng, min_ops, max_ops) for _ in range(n)]


def parse_ops(text: str) -> tuple[int, int]:
    """--toy-ops "3-6" -> (3, 6); "4" -> (4, 4). Raises ValueError with what is allowed."""
    parts = text.split("-")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 1 <= low <= high <= 12:
        raise ValueError(f"{text!r}: expected MIN-MAX with 1 <= MIN <= MAX <= 12, e.g. 3-6")
    return low, high


STEP = re.compile(r"(\d+)([+*-])(\d+)=(-?\d+)")
OPERATION = re.compile(r"([+*-])(\d+)")  # a problem's operations: "(7+5)*3" -> ("+", "5"), ("*", "3")
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
    ops = OPERATION.findall(prompt)
    scores, prev = [], first
    for k, line in enumerate(steps):
        line = line.strip()
        step, boxed = STEP.fullmatch(line), BOXED.fullmatch(line)
        if k < len(ops) and step:
            a, op, b, c = int(step[1]), step[2], int(step[3]), int(step[4])
            right = (a == prev and (op, str(b)) == ops[k]
                     and c == apply(op, a, b))
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
        v = apply(op, v, int(b))
        values.append(v)
    return values


# Held-out problems use a seed far from any training seed, and training never draws them by chance
# matters little: the space is large (about 10^5 distinct chains) and the test set is 200 problems.
HELDOUT_SEED = 10_000_019


def heldout_problems(n: int = 200, ops: tuple[int, int] = DEFAULT_OPS) -> list[Problem]:
    return make_problems(n, HELDOUT_SEED, *ops)


def build_tokenizer():
    """Character-level tokenizer: pad=0, eos=1, unk=2, then one id per character of CHARS."""
    # Byte-level symbols (newline is "Ċ"), as Qwen2's tokenizer uses: AutoTokenizer reloads a saved
    # Qwen2 checkpoint's tokenizer as Qwen2Tokenizer, which byte-maps the text; with a plain "\n"
    # in the vocabulary the reloaded tokenizer silently dropped every newline.
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in CHARS.replace("\n", "Ċ"):
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=UNK))  # no merges: one char a token
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, padding_side="left")


def build_model(tokenizer, seed: int = 0):
    """A ~0.8M-parameter Qwen2; head_dim 64 because vLLM's CPU attention needs it."""
    config = Qwen2Config(
        vocab_size=64, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
        tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32")
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def sft_batch(tokenizer, examples: list[tuple[str, str]]):
    """Teacher-forcing batch of (prompt, solution): prompt + solution + EOS, loss only on the
    solution and EOS."""
    pairs = [(tokenizer(prompt)["input_ids"], tokenizer(solution)["input_ids"] + [tokenizer.eos_token_id])
             for prompt, solution in examples]
    return sft_batch_of_ids(pairs, tokenizer.pad_token_id)


def sft_batch_of_ids(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """(input ids, attention mask, labels) of (prompt ids, target ids) pairs, right-padded with `pad_id`:
    each row prompt + target, the labels -100 except on the target."""
    rows = [prompt + target for prompt, target in examples]
    labels = [[-100] * len(prompt) + target for prompt, target in examples]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id)
    label_ids = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labels)):  # right padding: positions start at 0 anyway
        input_ids[i, :len(r)] = torch.tensor(r)
        label_ids[i, :len(lab)] = torch.tensor(lab)
        attention[i, :len(r)] = 1
    return input_ids, attention, label_ids


# The SFT recipe: a fixed number of steps, warmup then cosine to 10%, float32 throughout. Every
# setting's start is this recipe's checkpoint, shipped in checkpoints/ (bit-identical on every
# machine, checked by hash) or, for a setting not shipped, built once into the cache. An earlier
# recipe stopped when a noisy held-out loss stopped improving; where that rule fired, and how well
# the model had learned the arithmetic by then, depended on float round-off (threads, bf16 autocast,
# the CPU's kernels): one 2-core AVX2 machine started RL from greedy 0.53 where ours had 0.99.
# A fixed length does not make a build bit-identical: the thread count alone changes the bits (30
# steps of the sparser setting at 1 and at 2 threads give different weights), and over 3000 steps that
# is another start (sparser's held-out loss: 0.1725 in the build the study recorded, 0.1804 and 0.1738
# in two later builds on this machine). That is why the starts RL runs from are shipped.
SFT_STEPS = 3000          # the recipe's length (`--sft-steps 0`); a fixed length, not a stopping rule
TEACHER_SFT_STEPS = 1500  # the clean demonstrator's student, the embedded OPD/G-OPD teacher
SFT_BATCH, SFT_LR = 64, 3e-3
SHIPPED = Path(__file__).resolve().parent / "checkpoints"  # the recipe's checkpoints and SHA256SUMS


def run_sft(out_dir: Path, steps: int = SFT_STEPS, batch_size: int = SFT_BATCH, lr: float = SFT_LR, seed: int = 0,
            ops: tuple[int, int] = DEFAULT_OPS, slip: float = DEFAULT_SLIP, log=print):
    """Train the tiny model on the demonstrator's solutions for `steps` steps and save it (model +
    tokenizer + extra.json with the recipe and the held-out loss). Warmup 50 steps, then cosine to
    10%; float32 (no autocast), so the only difference between machines is round-off.
    Returns (model, tokenizer, info)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    held_rng = random.Random(seed + 7919)
    held = sft_batch(tokenizer, [(p.prompt, demonstrate(p, held_rng, slip))
                                 for p in make_problems(512, seed + 104729, *ops)])

    def held_loss() -> float:
        model.eval()
        with torch.no_grad():
            loss = model(input_ids=held[0], attention_mask=held[1], labels=held[2]).loss.item()
        model.train()
        return loss

    # eager attention is ~20% faster than SDPA at this size on 2 cores
    default_attention = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    start = time.time()
    model.train()
    for step in range(steps):
        scale = min(1.0, (step + 1) / 50) * (0.55 + 0.45 * math.cos(step / steps * math.pi))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        problems = [make_problem(rng, *ops) for _ in range(batch_size)]
        input_ids, attention, labels = sft_batch(tokenizer, [(p.prompt, demonstrate(p, rng, slip)) for p in problems])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 250 == 0 or step + 1 == steps:
            log(f"sft step {step + 1:5d}/{steps} train loss {loss.item():.3f} held-out loss {held_loss():.4f} "
                f"({time.time() - start:.0f}s)")
    info = {"steps": steps, "ops": list(ops), "slip": slip, "seed": seed, "batch_size": batch_size, "lr": lr,
            "held_out_loss": round(held_loss(), 6), "seconds": round(time.time() - start, 1)}
    log(f"sft done: {steps} steps, held-out loss {info['held_out_loss']:.4f}, {info['seconds']:.0f}s")
    model.config._attn_implementation = default_attention  # the checkpoint loads with the library's default
    save_pretrained_atomic(model, tokenizer, out_dir, extra={"sft": info})
    return model, tokenizer, info


def save_pretrained_atomic(model, tokenizer, out_dir: Path, extra: dict | None = None) -> None:
    """save_pretrained into a temporary folder, then rename: a crash never leaves half a model."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if extra:
        (tmp / "extra.json").write_text(json.dumps(extra, indent=2))
    replace_folder(tmp, out_dir)


def checkpoint_name(steps: int, seed: int, ops: tuple[int, int], slip: float) -> str:
    return f"toy-sft-v4-ops{ops[0]}-{ops[1]}-slip{slip:g}-steps{steps}-seed{seed}"


def folder_hash(path: Path) -> str:
    """sha256 over the folder's files (names and bytes, sorted by name): what SHA256SUMS records.
    eval.py's report (eval.json, written beside a model it evaluates) is not part of the model."""
    digest = hashlib.sha256()
    for f in sorted(p for p in Path(path).iterdir() if p.is_file() and p.name != "eval.json"):
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


def shipped_hashes() -> dict[str, str]:
    """checkpoints/SHA256SUMS as {folder name: hash}."""
    sums = SHIPPED / "SHA256SUMS"
    if not sums.exists():
        return {}
    return {name: digest for digest, name in (line.split() for line in sums.read_text().splitlines() if line.strip())}


def sft_checkpoint(cache_dir: Path, steps: int = 0, seed: int = 0, log=print, ops: tuple[int, int] = DEFAULT_OPS,
                   slip: float = DEFAULT_SLIP) -> Path:
    """The SFT checkpoint for (task, steps, seed); steps = 0 means the recipe's SFT_STEPS.

    A checkpoint shipped in checkpoints/ is used as it is, after its hash is checked (a changed file
    is an error, not a silent retrain); any other is trained on first use and cached in cache_dir."""
    name = checkpoint_name(steps or SFT_STEPS, seed, ops, slip)
    expected = shipped_hashes().get(name)
    if expected:
        path = SHIPPED / name
        if not path.is_dir() or folder_hash(path) != expected:
            raise SystemExit(f"{path}: the shipped SFT checkpoint does not match checkpoints/SHA256SUMS; "
                             f"restore it (git checkout -- checkpoints) or rebuild it with "
                             f"`python toy_task.py --ops {ops[0]}-{ops[1]} --slip {slip:g} --steps {steps or SFT_STEPS}`")
        return path
    path = Path(cache_dir) / name
    if not (path / "config.json").exists():
        log(f"no shipped or cached SFT checkpoint {name}: training it ({steps or SFT_STEPS} steps) into {path}")
        run_sft(path, steps or SFT_STEPS, seed=seed, ops=ops, slip=slip, log=log)
    return path


def build_shipped(ops: tuple[int, int], slip: float, steps: int = SFT_STEPS, seed: int = 0) -> dict:
    """Rebuild one shipped checkpoint with the recipe and record its hash in SHA256SUMS. Its held-out
    accuracy: `python eval.py --model checkpoints/NAME --greedy` (and without --greedy, sampled)."""
    name = checkpoint_name(steps, seed, ops, slip)
    _, _, info = run_sft(SHIPPED / name, steps, seed=seed, ops=ops, slip=slip)
    sums = {**shipped_hashes(), name: folder_hash(SHIPPED / name)}
    write_atomic(SHIPPED / "SHA256SUMS", "".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))
    report = {"name": name, "sha256": sums[name], **info}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Rebuild a shipped SFT checkpoint (checkpoints/) with the recipe.")
    parser.add_argument("--ops", default="3-6", help="operations per chain, MIN-MAX")
    parser.add_argument("--slip", type=float, default=DEFAULT_SLIP, help="the demonstrator's slip rate")
    parser.add_argument("--steps", type=int, default=SFT_STEPS, help="SFT steps (the teacher: 1500 at slip 0)")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    build_shipped(parse_ops(opts.ops), opts.slip, opts.steps, opts.seed)
