"""Data: reading rows, building prompts, gold answers. One module for train.py and eval.py.

    read_rows(path)                  rows of a .jsonl, .parquet or column-oriented .json file
    row_to_task(row, i, args, tok)   a training row (veRL's schema or flat fields) -> Task(prompt ids, answer, kind)
    load_tasks(args, tok)            train.py's (training tasks, held-out tasks): --data, or the embedded task
    build_prompt(tok, question)      a benchmark question's prompt: the same template and suffix
    (benchmark.py holds the benchmarks: files, golds, grading)

A prompt is the same wherever it is built: the question plus the task's suffix as the user message
(after an optional system message), through the tokenizer's chat template with the generation
prompt, or the plain text for a tokenizer without one (a base model, the embedded toy model).
"""

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

import toy_task
import verify

# The paper's user suffix (PRIME's official prompt, for training and evaluation alike) and PASS's
# multi-hop QA instruction (seed Sec. 5.1: reason from the context only, one step per line, end with
# "Final Answer: [Entity]").
MATH_SUFFIX = "\n\nPresent the answer in LaTex format: \\boxed{Your answer}"
QA_SUFFIX = ("\n\nAnswer using only the context above. Write one reasoning step per line, then end "
             "with a line of the form: Final Answer: [Entity]")


# ---------------------------------------------------------------------------------------------------
# Rows and prompts
# ---------------------------------------------------------------------------------------------------


def read_rows(path: str | Path, flag: str = "--data") -> list[dict]:
    """Rows of a .jsonl file, a .parquet file (veRL's schema: nested fields come back as dicts and
    lists), or a pandas column-oriented .json (PRIME's MATH-500 copy). Errors name `flag` and the file."""
    p = Path(path)
    if not p.exists():
        raise SystemExit(f"{flag} {path}: file not found" + (" (benchmarks/SOURCES.md lists the files)"
                                                             if flag == "--data-dir" else ""))
    if p.suffix == ".jsonl":
        rows = []
        with open(p, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise SystemExit(f"{flag} {path}: line {n} is not JSON ({e})") from None
        return rows
    if p.suffix == ".parquet":
        return pq.read_table(p).to_pylist()
    if p.suffix == ".json":  # {"problem": {"0": ..., "1": ...}, "expected_answer": {...}, ...}
        columns = json.loads(p.read_text(encoding="utf-8"))
        keys = next(iter(columns.values()))
        return [{name: columns[name].get(key) for name in columns} for key in keys]
    raise SystemExit(f"{flag} {path}: expected a .jsonl, .parquet or .json file")


def encode_messages(tokenizer, messages: list[dict]) -> tuple[list[int], str]:
    """(token ids, text) of a prompt: the chat template with the generation prompt, or, for a
    tokenizer without a template, the messages' contents joined by blank lines."""
    if getattr(tokenizer, "chat_template", None):
        # rendered once, then tokenised as apply_chat_template(tokenize=True) does: no special tokens
        # added (the template writes its own)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), text
    text = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"]), text


def build_prompt(tokenizer, question: str, templated: bool = True, system_prompt: str = ""
                 ) -> tuple[list[int], str]:
    """(prompt token ids, prompt text) of a benchmark question, exactly as row_to_task builds a
    training prompt from a plain row (both go through encode_messages).

    The model must see at evaluation the prompt it was trained on: question + the paper's suffix
    as the user message, through the chat template with the generation prompt; a tokenizer without
    a template (a base model, the toy model) gets the plain text. templated=False: the raw question.
    """
    if not templated:
        return list(tokenizer(question)["input_ids"]), question
    messages = [{"role": "user", "content": question + MATH_SUFFIX}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return encode_messages(tokenizer, messages)


# ---------------------------------------------------------------------------------------------------
# Training data: rows -> prompts (Task) and gold answers
# ---------------------------------------------------------------------------------------------------


@dataclass
class Task:
    prompt_ids: list[int]  # the tokenised prompt (chat template and suffix applied)
    answer: str | list     # gold answer (math/qa; qa may list aliases) or a JSON string of tests (code)
    kind: str              # "math", "code" or "qa": which verifier scores it
    text: str = ""         # the prompt as text, for logs


def qa_context(context) -> str:
    """A multi-hop question's context as PASS's prompts give it: labelled paragraphs and sentences, one
    paragraph a line. Takes a string (as is); HotpotQA's and 2Wiki's [[title, [sentences]], ...]; the
    Hugging Face copy's {"title": [...], "sentences": [[...], ...]}; MuSiQue's [{"title",
    "paragraph_text"}, ...] (its paragraphs are not split into sentences: one [S1] each).

        [["France", ["Paris is big.", " It is old."]]] -> "[P1] France: [S1] Paris is big. [S2] It is old."
    """
    if isinstance(context, str):
        return context
    if isinstance(context, dict):
        context = list(zip(context.get("title", []), context.get("sentences", [])))
    paragraphs = [(p["title"], [p["paragraph_text"]]) if isinstance(p, dict) else p for p in context]
    return "\n".join(f"[P{i}] {title}: " + " ".join(f"[S{j}] {sentence.strip()}" for j, sentence in
                                                   enumerate(sentences, 1))
                     for i, (title, sentences) in enumerate(paragraphs, 1))


def row_to_task(row: dict, index: int, args, tokenizer) -> Task:
    """One data row -> Task; understands veRL's schema (prompt = chat messages, reward_model.ground_truth)."""
    if isinstance(row.get("prompt"), list) and isinstance(row.get("reward_model"), dict):  # veRL schema
        messages = [dict(m) for m in row["prompt"]]
        answer = row["reward_model"].get("ground_truth")
        kind = {"math": "math", "code": "code", "coding": "code", "qa": "qa"}.get(str(row.get("ability", "math")), "math")
        if answer is None:
            raise SystemExit(f"--data row {index}: reward_model.ground_truth is missing")
    else:
        for key in (args.prompt_key, args.answer_key):
            if key not in row:
                raise SystemExit(f"--data row {index}: no field {key!r} (fields: {sorted(row)}); "
                                 f"set --prompt-key / --answer-key")
        question, kind = str(row[args.prompt_key]), args.task
        if kind == "qa" and row.get(args.context_key):
            question = f"Context:\n{qa_context(row[args.context_key])}\n\nQuestion: {question}"
        suffix = (QA_SUFFIX if kind == "qa" else MATH_SUFFIX) if args.user_suffix == "default" else args.user_suffix
        messages = [{"role": "user", "content": question + suffix}]
        if args.system_prompt:
            messages.insert(0, {"role": "system", "content": args.system_prompt})
        answer = row[args.answer_key]
    if kind == "qa" and isinstance(answer, (list, tuple)):  # QA aliases: verify.py takes the best match
        answer = [str(a) for a in answer]
    elif isinstance(answer, (list, tuple)):  # e.g. OlympiadBench's final_answer lists
        answer = ", ".join(str(a) for a in answer)
    if not isinstance(answer, (str, list)):
        answer = json.dumps(answer) if kind == "code" else str(answer)
    ids, _ = encode_messages(tokenizer, messages)
    return Task(ids, answer, kind, messages[-1]["content"])


def check_golds(tasks: list[Task], path: str, math_grader: str = "math-verify") -> None:
    """Every math gold answer must verify against itself, or every reward for it would be 0."""
    math_tasks = [t for t in tasks if t.kind == "math"][:256]
    scores = verify.score_batch([f"\\boxed{{{t.answer}}}" for t in math_tasks], [t.answer for t in math_tasks],
                                ["math"] * len(math_tasks), math_grader=math_grader)
    bad = [t.answer for t, s in zip(math_tasks, scores) if s.reward < 1.0]
    if bad:
        raise SystemExit(f"--data {path}: {len(bad)} gold answers do not verify against themselves "
                         f"(e.g. {bad[0]!r}); check --answer-key")


def read_tasks(args, tokenizer) -> list[Task]:
    """Every row of --data as a Task (prompt through the chat template), its math golds checked."""
    tasks = [row_to_task(r, i, args, tokenizer) for i, r in enumerate(read_rows(args.data))]
    check_golds(tasks, args.data, args.math_grader)
    return tasks


def load_tasks(args, tokenizer) -> tuple[list[Task], list[Task]]:
    """(training tasks, held-out tasks)."""
    if not args.data:
        def toy(p):
            return Task(tokenizer(p.prompt)["input_ids"], p.answer, "math", p.prompt)
        # Training prompts are drawn fresh each step (see toy_prompts); only held-out ones are listed.
        return [], [toy(p) for p in toy_task.heldout_problems(args.eval_problems, toy_task.parse_ops(args.toy_ops))]
    tasks = read_tasks(args, tokenizer)
    n_eval = min(args.eval_problems, len(tasks) // 10)  # the first rows are held out, at most a tenth
    if n_eval == 0:  # an accuracy of no problems is no accuracy
        raise SystemExit(f"--data {args.data}: {len(tasks)} rows leave no held-out problem (a tenth of the rows, "
                         f"at most --eval-problems {args.eval_problems}, is held out): give at least 10 rows")
    return within_length(tasks[n_eval:], args, "training"), within_length(tasks[:n_eval], args, "held-out")


def within_length(tasks: list[Task], args, part: str) -> list[Task]:
    """The tasks whose prompt fits --max-prompt-len, counted aloud; dropping more than half is an error."""
    kept = [t for t in tasks if len(t.prompt_ids) <= args.max_prompt_len]
    longest = max((len(t.prompt_ids) for t in tasks), default=0)
    if len(kept) < len(tasks):
        print(f"--data {args.data}: {len(tasks) - len(kept)} of {len(tasks)} {part} prompts are longer than "
              f"--max-prompt-len {args.max_prompt_len} tokens (the longest has {longest}): dropped", flush=True)
    if 2 * len(kept) < len(tasks):
        raise SystemExit(f"--max-prompt-len {args.max_prompt_len}: it drops {len(tasks) - len(kept)} of the "
                         f"{len(tasks)} {part} prompts of --data {args.data} (the longest has {longest} tokens, chat "
                         "template and suffix included): raise --max-prompt-len")
    return kept


# ---------------------------------------------------------------------------------------------------
# A real-language task for a small real model (docs/real-model.md)
# ---------------------------------------------------------------------------------------------------


def sums_rows(rows: int, digits: int, seed: int = 0) -> list[dict]:
    """`rows` distinct "What is a + b?" questions, a and b of `digits` digits each, in a seeded order;
    gold a + b. SmolLM2-135M-Instruct starts at 16% sampled accuracy on two-digit sums at temperature
    0.7 (48 problems x 8, 96 tokens; 31% on one-digit-plus ones): low enough to learn, high enough
    that most groups are mixed. train.py holds out the first rows (a tenth, at most --eval-problems)."""
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10 ** digits - 1
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    if rows > len(pairs):
        raise SystemExit(f"--rows {rows}: there are only {len(pairs)} pairs of {digits}-digit numbers")
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in rng.sample(pairs, rows)]


# Sums worked left to right, one line a step: the answer depends on every step, and each step can be
# checked exactly, so a process signal has steps to tell apart (issue 53).
_CHAIN_QUESTION = re.compile(r"What is (\d+(?: \+ \d+)+)\?")
# "x + y = z", numbered ("2. ") or not, a sentence's full stop after z allowed ("43 + 45 = 88.")
_CHAIN_LINE = re.compile(r"^\s*(?:\d+\.\s*)?(-?\d+)\s*\+\s*(-?\d+)\s*=\s*(-?\d+)\s*\.?\s*$")


def is_chain_question(question: str) -> bool:
    """A `data.py chains` (or `sums`) question, "What is a + b + ...?" (train.py's boxed suffix may follow),
    whose steps ChainStepChecker checks."""
    return _CHAIN_QUESTION.match(question.strip()) is not None


def chain_rows(rows: int, terms: int = 3, digits: int = 1, seed: int = 0, solution_slip: float | None = None,
               exclude: set[str] = frozenset()) -> list[dict]:
    """`rows` distinct "What is a + b + c?" questions of `terms` numbers of `digits` digits each (1-9 for
    one digit), in a seeded order, none of the questions in `exclude`; gold their total. With
    `solution_slip` (a probability), each row also gets the worked solution of a demonstrator who slips
    at each step with that probability (chain_solution): SFT data, written apart from the RL file's
    questions (--exclude), so that no held-out question is a demonstration."""
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1) if digits > 1 else 1, 10 ** digits - 1
    if rows + len(exclude) > (high - low + 1) ** terms:
        raise SystemExit(f"--rows {rows}: there are only {(high - low + 1) ** terms} questions of {terms} "
                         f"{digits}-digit numbers, {len(exclude)} of them excluded")
    seen, out = set(), []
    while len(out) < rows:
        numbers = tuple(rng.randint(low, high) for _ in range(terms))
        question = "What is " + " + ".join(map(str, numbers)) + "?"
        if numbers in seen or question in exclude:
            continue
        seen.add(numbers)
        row = {"question": question, "answer": str(sum(numbers))}
        if solution_slip is not None:
            row["solution"] = chain_solution(numbers, rng, solution_slip)
        out.append(row)
    return out


def chain_solution(numbers, rng: random.Random, slip: float = 0.0) -> str:
    """The worked solution, one line a step, left to right, then the boxed total:
        (7, 5, 8) -> "7 + 5 = 12\n12 + 8 = 20\nThe answer is $\\boxed{20}$."
    With probability `slip` a step's result is off by 1 to 3 and the next steps carry on from it, as a
    person who slips would: the box then holds the wrong total."""
    lines, total = [], numbers[0]
    for n in numbers[1:]:
        result = total + n + (rng.choice((-3, -2, -1, 1, 2, 3)) if rng.random() < slip else 0)
        lines.append(f"{total} + {n} = {result}")
        total = result
    return "\n".join(lines) + f"\nThe answer is $\\boxed{{{total}}}$."


def chain_steps(question: str, response: str) -> list[float]:
    """The exact checker of a chain: 1.0 or 0.0 for each "x + y = z" line of `response`, in order. A line
    is right when x is the running total as the response has it (the first number, then the previous
    line's z), y the question's next number and z = x + y; so after a slip the lines that carry on from
    it correctly are right, and the first wrong line is where the response went wrong.
        ("What is 7 + 5 + 8?", "7 + 5 = 13\n13 + 8 = 21") -> [0.0, 1.0]"""
    match = _CHAIN_QUESTION.search(question)
    if not match:
        raise ValueError(f"not a chain question: {question!r}")
    numbers = [int(n) for n in match.group(1).split(" + ")]
    scores, total, k = [], numbers[0], 1
    for line in response.splitlines():
        step = _CHAIN_LINE.match(line)
        if not step:
            continue
        x, y, z = (int(v) for v in step.groups())
        right = k < len(numbers) and x == total and y == numbers[k] and z == x + y
        scores.append(1.0 if right else 0.0)
        total, k = z, k + 1
    return scores


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Write a task file: python data.py sums --digits 2 --out sums.jsonl; "
                                     "python data.py chains --terms 3 --digits 1 --out chains.jsonl [--slip 0.1]")
    parser.add_argument("task", choices=["sums", "chains"])
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--terms", type=int, default=3, help="chains: numbers a question adds")
    parser.add_argument("--slip", type=float, default=None,
                        help="chains: write worked solutions (SFT data) whose steps slip with this probability")
    parser.add_argument("--exclude", default=None, help="chains: a task file whose questions to leave out")
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    cli = parser.parse_args()
    rows = sums_rows(cli.rows, cli.digits, cli.seed) if cli.task == "sums" else \
        chain_rows(cli.rows, cli.terms, cli.digits, cli.seed, cli.slip, {json.loads(line)["question"] for line in
                   Path(cli.exclude).read_text().splitlines() if line.strip()} if cli.exclude else frozenset())
    Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
    Path(cli.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{cli.out}: {cli.rows} questions")
