"""Benchmark evaluation with the PRIME and PASS papers' protocols: load, generate, grade, report.

    python eval.py --model runs/<name>/final                    # embedded toy model: toy benchmark
    python eval.py --model runs/<name>/final --greedy --limit 50
    python eval.py --model PATH --panel prime --benchmark-file livecodebench=test.jsonl   # PRIME's Table 2
    python eval.py --model PATH --panel pass-math               # PASS's Table 1 (pass@1) and Table 5 (pass@8)
    python eval.py --model PATH --panel pass-qa --benchmark-file hotpotqa=hotpot_dev_distractor_v1.json \\
        --benchmark-file 2wiki=dev.json --benchmark-file musique=musique_ans_v1.0_dev.jsonl   # PASS's Table 3
    python eval.py --model PATH --benchmarks aime24,amc23 --n 16 --temperature 0.6 --top-p 0.95
    python eval.py --responses generations.jsonl --panel prime  # grade saved generations: no model
    python eval.py --plot runs/A runs/B --plot-out compare.png  # curves of several runs (plots.py)
    python eval.py --compare hf.json vllm.json                  # two evaluations, paired by problem

What one evaluation does, per benchmark (benchmark.py holds what differs between benchmarks):
    1. load the problems and golds: shipped files in benchmarks/ (benchmarks/SOURCES.md), or the
       release file a benchmark's authors publish (--benchmark-file NAME=PATH: LiveCodeBench, HotpotQA,
       2WikiMultihopQA, MuSiQue);
    2. build prompts the way train.py builds them: the question and the benchmark's suffix (math:
       "Present the answer in LaTex format: \\boxed{Your answer}") as the user message, after an
       optional system message, through the model's chat template (plain text without one);
    3. generate n responses per problem with the rollout backend used in training (rollout.py), or read
       them from --responses (generations made anywhere: a vLLM server, another framework);
    4. grade every response with verify.py, the grader train.py uses: math answers by math-verify
       (`--math-grader official`: the last box only, as PRIME's grader); code in train.py's sandbox
       with the benchmark's own harness (a response passes only if every test passes); QA by
       SQuAD-normalised exact match and F1, the best over the answer's aliases;
    5. report pass@1, pass@k (unbiased estimator, k = 1, 2, 4, ... <= n), avg@n, QA's F1, mean
       response length, and a problem-level bootstrap 95% interval of pass@1, as a table on the
       terminal (a panel in its paper's order, with the equally weighted average) and as JSON (written
       atomically, default `<model>/eval.json`), with every problem's extracted answers.

Protocols. `--panel` sets each paper's own per benchmark (benchmark.PANELS; any flag given overrides
it for every member): `prime` greedy with PRIME's system prompt, LiveCodeBench at n = 10, T = 0.2,
top-p 0.95; `pass-math` n = 32 at T = 1.0, top-p 0.95, 2048 tokens; `pass-qa` n = 16 at T = 1.0,
top-p 0.9. Without a panel: n = 16 samples at T = 0.6, top-p 0.95, the benchmark's cap (3072 tokens,
the paper's training response length; 96 for the toy task). Default benchmarks: `toy` when the
tokenizer has no chat template (the embedded model), otherwise the six math benchmarks. `--limit N`
keeps the first N problems of each (quick checks).

Simplifications relative to the papers' evaluation code (docs/evaluation.md lists every benchmark's):
    1. One math grader, verify.py (math-verify), for every math benchmark; PRIME's official grader
       compares numbers at 1e-4 relative tolerance, math-verify rounds to 6 decimals.
    2. OlympiadBench's several answers (is_multiple_answer) are one comma-joined gold, compared as a
       whole by math-verify; its `unit` field is not appended to the prompt.
    3. Code runs in the sandbox with the standard library only: LeetCode's harness also imports numpy.
    4. Generation on one device, HF `generate` or a vLLM engine (`--rollout vllm`, tensor parallel 1),
       in chunks of --batch-size responses.
"""

import argparse
import importlib.util
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import transformers
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import benchmark
import plots
import verify
from benchmark import BENCHMARKS, MATH_BENCHMARKS, PANELS, Item, Protocol, check_benchmark_names, load_benchmark
from data import Task, encode_messages
from ddp import Dist, all_reduce
from rollout import HFRollout, VLLMRollout
from runlog import portable, read_run, write_json

BOOTSTRAP_RESAMPLES = 2000  # as PASS's Table 6: 2000 resamples of whole problems
BOOTSTRAP_SEED = 0


# ---------------------------------------------------------------------------------------------------
# Pass@k and the bootstrap interval
# ---------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples with c correct (Chen et al. 2021; PASS App. G):

        pass@k = 1 - C(n - c, k) / C(n, k)

    The ratio of binomials is computed as a product, never with factorials, so n = 1000 or 10^6
    neither overflows nor loses precision:  C(n-c, k) / C(n, k) = prod_{j=n-c+1..n} (1 - k / j).
    pass_at_k(5, 2, 2) -> 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7;  pass_at_k(n, c, 1) = c / n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every set of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / j for j in range(n - c + 1, n + 1))


def ks_for(n: int) -> list[int]:
    """The k of the reported pass@k: powers of two up to n.  ks_for(16) -> [1, 2, 4, 8, 16]."""
    return [2 ** i for i in range(int(math.log2(n)) + 1)]


def bootstrap_interval(values, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
                       ) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of mean(values), resampling whole problems (PASS Table 6).

    `values` holds one number per problem (its pass@1 = c/n), so each resample carries a problem's
    full response set. It says how much the score depends on which problems the benchmark happens
    to contain (30 AIME problems at 27% greedy: about +-16 points), not how two checkpoints differ.
    """
    values = np.asarray(values, dtype=np.float64)  # (P,)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(1)  # (resamples,)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


# ---------------------------------------------------------------------------------------------------
# Prompts, model, generation backend
# ---------------------------------------------------------------------------------------------------


def load_tokenizer(path: str):
    if not Path(path).exists() and "/" not in path:
        raise SystemExit(f"--model {path}: no such local path (and not a hub name like org/model)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as error:
        raise SystemExit(f"--model {path}: cannot load its tokenizer ({error})") from None
    if tokenizer.pad_token is None:  # left padding needs a pad id; EOS is the usual stand-in
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def adapter_config(path: str) -> dict | None:
    """The adapter_config.json of a LoRA adapter folder (train.py --lora-rank's final/, PEFT's format:
    its base in "base_model_name_or_path", its rank in "r"), or None for a whole model."""
    config = Path(path) / "adapter_config.json"
    return json.loads(config.read_text()) if config.exists() else None


def adapter_base(path: str) -> str | None:
    """The base model of a LoRA adapter folder, or None for a whole model."""
    config = adapter_config(path)
    return config["base_model_name_or_path"] if config else None


def load_model(path: str):
    """The policy in bf16 on a GPU (what vLLM would run) or fp32 on CPU (bf16 matmuls are slow there); a
    LoRA adapter folder on its base, unmerged (the same computation as in training)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = adapter_base(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(base or path, dtype=dtype)
        if base:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, path)
    except OSError as error:
        raise SystemExit(f"--model {path}: cannot load it ({error})") from None
    return model.to(device).eval()


def make_sampler(args, tokenizer, max_new_tokens: int):
    """The generation backend, model loading included, behind train.py's sampler interface:
    generate(prompt_token_ids, n, greedy) -> Rollout and decode(rollout) -> list[str] (rollout.py).
    hf: HF generate on the model (bf16 on a GPU, fp32 on CPU). vllm: a vLLM engine that loads the
    weights itself (bf16 on a GPU, fp32 on CPU), seeded once with --seed: a rerun of the same command
    draws the same samples, but a benchmark's samples depend on the benchmarks evaluated before it
    (HF reseeds before each one)."""
    if args.rollout == "hf":
        return HFRollout(load_model(args.model), tokenizer, max_new_tokens)  # evaluate sets T and top-p
    on_gpu = torch.cuda.is_available()
    adapter = adapter_config(args.model)  # a LoRA adapter: the engine loads its base and takes the adapter
    base, rank = (adapter["base_model_name_or_path"], adapter["r"]) if adapter else (None, 0)
    engine = VLLMRollout(base or args.model, tokenizer, max_new_tokens,
                         max_model_len=AutoConfig.from_pretrained(base or args.model).max_position_embeddings,
                         seed=args.seed, dtype="bfloat16" if on_gpu else "float32",
                         gpu_memory_utilization=args.gpu_memory_utilization, lora_rank=rank)
    if base:
        engine.use_adapter(args.model)
    return engine


# ---------------------------------------------------------------------------------------------------
# Evaluation of one benchmark
# ---------------------------------------------------------------------------------------------------


def sample_and_score(sampler, prompt_ids: list[list[int]], answers: list[str], kinds: list[str], n: int = 1,
                     greedy: bool = False, math_grader: str = "math-verify", questions: list[str] | None = None):
    """n responses per prompt (greedy: one), each scored against its problem's answer (and, given its
    `questions`, refused where it only restates one: verify.restated) by verify.py:
    (rollout, texts, scores), the n samples of a prompt in consecutive rows: train.py's held-out accuracy
    (`heldout_accuracy`); the benchmarks grade with benchmark.grade (`evaluate`)."""
    rollout = sampler.generate(prompt_ids, n=n, greedy=greedy)
    texts = sampler.decode(rollout)
    scores = verify.score_batch(texts, [a for a in answers for _ in range(n)], [k for k in kinds for _ in range(n)],
                                questions=[q for q in questions for _ in range(n)] if questions else None,
                                math_grader=math_grader)
    return rollout, texts, scores


def heldout_accuracy(sampler, tasks: list[Task], args, d: Dist, samples: int = 0) -> float:
    """train.py's held-out accuracy, each rank scoring its share with the run's own sampler (HF
    generate on the policy, or the run's vLLM engine): greedy (samples = 0), or the mean reward of
    `samples` responses per problem at the training temperature and top-p (`args` is train.py's
    config.Args).

    Where the model's mode is right and its slips live in the sampling distribution (the embedded
    noisy demonstrator), the sampled accuracy is the one RL moves. HF sampling draws from a forked
    torch RNG with a fixed seed: evaluating never shifts the training's random stream, and every
    evaluation of a run (and every run of a seed) uses the same random numbers. (A vLLM engine draws
    from its own generator, seeded once when it was built.)"""
    mine, n = tasks[d.rank::d.world], max(samples, 1)
    correct = 0.0
    if mine:
        with torch.random.fork_rng(devices=[d.device] if d.device.type == "cuda" else []):
            torch.manual_seed(args.seed * 7919 + d.rank)
            _, _, scores = sample_and_score(sampler, [t.prompt_ids for t in mine], [t.answer for t in mine],
                                            [t.kind for t in mine], n, greedy=not samples,
                                            math_grader=args.math_grader, questions=[t.text for t in mine])
        correct = sum(s.reward for s in scores) / n
    total, count = all_reduce([correct, len(mine)], d)
    return total / max(count, 1)


def heldout_metrics(sampler, tasks: list[Task], args, d: Dist) -> dict:
    """{"greedy": accuracy, "sampled": mean accuracy of --eval-samples responses per problem}."""
    return {"greedy": heldout_accuracy(sampler, tasks, args, d),
            "sampled": heldout_accuracy(sampler, tasks, args, d, args.eval_samples)}


def start_accuracy(args, run_dir: Path, sampler, eval_tasks: list[Task], d: Dist) -> tuple[dict, float]:
    """The starting checkpoint's held-out accuracy ({"greedy", "sampled"}), written to summary.json
    (read back from it on --resume), and the seconds it took (every evaluation of a launch is timed)."""
    saved = read_run(run_dir)["summary"] if args.resume else {}
    if "start_accuracy" in saved:
        return {"greedy": saved["start_accuracy"], "sampled": saved["start_sampled_accuracy"]}, 0.0
    t = time.time()
    if d.master:  # the first thing a run does after loading: say what it is waiting for
        print(f"held-out evaluation of the starting checkpoint: {len(eval_tasks)} problems, greedy and "
              f"{args.eval_samples} samples each ...", flush=True)
    start = heldout_metrics(sampler, eval_tasks, args, d)
    if d.master:
        write_json(run_dir / "summary.json", {"start_accuracy": start["greedy"],
                                                     "start_sampled_accuracy": start["sampled"]})
    return start, time.time() - t


def prompt_of(tokenizer, name: str, item: Item, system_prompt: str = "") -> tuple[list[int], str]:
    """(token ids, text) of a problem's prompt, as train.py builds one (benchmark.messages)."""
    messages = benchmark.messages(name, item, system_prompt)
    if isinstance(messages, str):  # the toy task: the raw problem text
        return list(tokenizer(messages)["input_ids"]), messages
    return encode_messages(tokenizer, messages)


def evaluate(name: str, items: list[Item], sampler, tokenizer, protocol: Protocol, batch_size: int = 256,
             system_prompt: str = "", seed: int = 0, math_grader: str = "math-verify") -> dict:
    """Generate protocol.n responses per problem (greedy: one) at its temperature, top-p and cap,
    grade them (benchmark.grade), return the benchmark's metrics and details (summarize), with the
    mean response length in tokens, the share cut at the cap (no EOS), the seconds and the first
    prompt as the model saw it."""
    prompts = [prompt_of(tokenizer, name, item, system_prompt) for item in items]
    n = protocol.n
    sampler.max_new_tokens = protocol.max_new_tokens or BENCHMARKS[name].max_new_tokens
    sampler.temperature, sampler.top_p = protocol.temperature, protocol.top_p
    torch.manual_seed(seed)  # each benchmark's samples do not depend on which benchmarks ran before
    per_call = max(1, batch_size // n)  # prompts per generate call; a prompt's n samples stay together
    graded, lengths, truncated, right = [], [], [], 0
    start = time.time()
    with tqdm(total=len(items), desc=name, unit="problem", dynamic_ncols=True) as bar:
        for first in range(0, len(items), per_call):
            chunk = items[first:first + per_call]
            rollout = sampler.generate([ids for ids, _ in prompts[first:first + per_call]], n=n, greedy=protocol.greedy)
            texts = sampler.decode(rollout)
            verdicts = benchmark.grade(name, [item for item in chunk for _ in range(n)], texts, math_grader)
            chunk_lengths = rollout.response_mask.sum(-1).tolist()
            for j in range(len(chunk)):  # rows j*n .. j*n+n-1 are this problem's samples
                rows = slice(j * n, (j + 1) * n)
                graded.append(list(zip(texts[rows], verdicts[rows])))
                lengths.append(chunk_lengths[rows])
                truncated.append(rollout.truncated[rows].tolist())
            right += sum(v.correct for v in verdicts)
            bar.update(len(chunk))
            bar.set_postfix(pass1=f"{right / (n * len(graded)):.3f}")
    result = summarize(name, items, graded, lengths, truncated)
    result["seconds"] = time.time() - start
    result["example_prompt"] = prompts[0][1]
    return result


def summarize(name: str, items: list[Item], graded: list[list[tuple[str, benchmark.Graded]]],
              lengths: list[list[int]] | None = None, truncated: list[list[bool]] | None = None) -> dict:
    """A benchmark's metrics from each problem's (response, verdict) pairs (graded[i] answers items[i];
    problems may have different numbers of responses, as a --responses file may give them).

    Metrics (all in [0, 1] except the length):
      pass@k   mean over problems of pass_at_k(n_i, c_i, k), c_i = responses that pass, for every
               k <= n = the fewest responses any problem has; pass@1 = mean c_i/n_i (greedy: accuracy)
      avg@n    the share of all responses that pass (equal to pass@1 when every problem has n)
      pass@1_ci95  problem-level bootstrap interval of pass@1
      format   share of responses in the expected form (verify.py's format channel)
      f1       QA: mean SQuAD token F1 (best alias) over responses
      response_length  mean tokens per response, EOS included; truncated: no EOS within the cap
               (both only when this process generated the responses)
    Details for reading the results, per problem: its index and id, its gold (math, QA), the number of
    right responses, each response's answer as read (math: the last box; QA: the final answer; code:
    the grader's reason), and the first response in full."""
    kind = BENCHMARKS[name].kind
    counts = [len(g) for g in graded]
    correct = [sum(v.correct for _, v in g) for g in graded]
    verdicts = [v for g in graded for _, v in g]
    n = min(counts)
    result = {"problems": len(items), "n": n}
    if len(set(counts)) > 1:
        result["responses"] = sum(counts)
    for k in ks_for(n):
        result[f"pass@{k}"] = float(np.mean([pass_at_k(m, c, k) for m, c in zip(counts, correct)]))
    result["pass@1_ci95"] = list(bootstrap_interval([c / m for m, c in zip(counts, correct)]))
    result["avg@n"] = sum(correct) / sum(counts)
    result["format"] = float(np.mean([v.format for v in verdicts]))
    if kind == "qa":
        result["f1"] = float(np.mean([v.f1 for v in verdicts]))
    if lengths is not None:
        result["response_length"] = float(np.mean([x for row in lengths for x in row]))
        result["truncated"] = float(np.mean([x for row in truncated for x in row]))
    details = []
    for i, (item, g) in enumerate(zip(items, graded)):
        problem = {"index": item.index, "id": item.id, "correct": correct[i], "n": counts[i],
                   "boxed": sum(v.format == 1 for _, v in g)}  # the format count, named for --compare
        if kind != "code":
            problem["gold"] = item.gold
        if lengths is not None:
            problem["truncated"] = int(sum(truncated[i]))
            problem["length"] = float(np.mean(lengths[i]))
        problem["answers"] = [v.reason if kind == "code" else v.answer for _, v in g]
        problem["response"] = g[0][0]
        details.append(problem)
    result["per_problem"] = details
    return result


# --compare: two evaluations of the same problems (e.g. --rollout hf and --rollout vllm, or two seeds)
# agree within sampling error when each per-problem rate differs by no more than its noise allows.
COMPARED = {"pass@1": "correct", "boxed": "boxed", "truncated": "truncated", "length": "length"}


def compare_evaluations(a: dict, b: dict) -> dict[str, dict[str, dict]]:
    """{benchmark: {metric: stats}} of two eval.py reports, paired by problem. Per problem i the
    difference d_i = a_i - b_i of a rate (correct, boxed or truncated responses over n) or of the
    mean response length; stats: its mean over the P shared problems, the paired standard error
    sd(d) / sqrt(P), a normal 95% interval (mean +- 1.96 SE, fine for P of 30 or more), and `agree`
    (the interval holds 0). Problems are matched by their index; a metric that either report lacks
    (files from before it was recorded) is left out."""
    out = {}
    for name in a["benchmarks"].keys() & b["benchmarks"].keys():
        ra, rb = a["benchmarks"][name], b["benchmarks"][name]
        pa = {p["index"]: p for p in ra["per_problem"]}
        pb = {p["index"]: p for p in rb["per_problem"]}
        shared = sorted(pa.keys() & pb.keys())
        if len(shared) < 2:
            raise SystemExit(f"--compare: {name} has {len(shared)} problems in both files; 2 or more are needed")
        out[name] = {}
        for metric, key in COMPARED.items():
            if any(key not in pa[i] or key not in pb[i] for i in shared):
                continue
            def rate(problem, report):  # a count over the problem's responses; a length as it is
                return problem[key] if metric == "length" else problem[key] / problem.get("n", report["n"])
            d = np.array([rate(pa[i], ra) - rate(pb[i], rb) for i in shared], dtype=float)
            mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))
            out[name][metric] = {"a": float(np.mean([rate(pa[i], ra) for i in shared])),
                                 "b": float(np.mean([rate(pb[i], rb) for i in shared])),
                                 "difference": mean, "se": se, "ci95": [mean - 1.96 * se, mean + 1.96 * se],
                                 "problems": len(shared), "agree": abs(mean) <= 1.96 * se}
    return out


def format_comparison(stats: dict[str, dict[str, dict]], a_name: str, b_name: str) -> str:
    """The terminal table of compare_evaluations: rates in percent, lengths in tokens."""
    lines = [f"A = {a_name}\nB = {b_name}\n",
             f"{'benchmark':<12}{'metric':<11}{'A':>8}{'B':>8}{'A - B':>8}{'SE':>7}{'95% CI':>18}  agree"]
    for name, metrics in stats.items():
        for metric, r in metrics.items():
            k = 1 if metric == "length" else 100
            low, high = r["ci95"]
            lines.append(f"{name:<12}{metric:<11}{k * r['a']:>8.1f}{k * r['b']:>8.1f}{k * r['difference']:>8.1f}"
                         f"{k * r['se']:>7.1f}{f'[{k * low:.1f}, {k * high:.1f}]':>18}  "
                         f"{'yes' if r['agree'] else 'NO'} ({r['problems']} problems)")
    return "\n".join(lines)


def format_table(results: dict[str, dict], labels: dict[str, str] | None = None,
                 left_out: dict[str, str] | None = None) -> str:
    """The terminal table: one row per benchmark (percent; `labels` give a panel's column names, in its
    order), a row for each benchmark `left_out` (its reason), then the unweighted average of pass@1
    over the benchmarks that ran (how both papers average: every benchmark weighs the same)."""
    labels, left_out = labels or {}, left_out or {}
    ks = ks_for(max(r["n"] for r in results.values())) if results else [1]
    qa = any("f1" in r for r in results.values())
    header = (f"{'benchmark':<16}{'problems':>9}{'n':>5}{'pass@1':>8}{'95% CI':>16}"
              + "".join(f"{f'pass@{k}':>9}" for k in ks[1:]) + f"{'avg@n':>8}" + (f"{'F1':>7}" if qa else "")
              + f"{'format':>8}{'length':>8}{'trunc':>7}{'time':>8}")
    lines = [header, "-" * len(header)]
    for name, r in results.items():
        low, high = r["pass@1_ci95"]
        timed = "response_length" in r  # generated here, not read from --responses
        lines.append(f"{labels.get(name, name):<16}{r['problems']:>9}{r['n']:>5}{100 * r['pass@1']:>8.1f}"
                     f"{f'[{100 * low:.1f}, {100 * high:.1f}]':>16}"
                     + "".join(f"{100 * r[f'pass@{k}']:>9.1f}" if f"pass@{k}" in r else f"{'':>9}" for k in ks[1:])
                     + f"{100 * r['avg@n']:>8.1f}" + (f"{100 * r['f1']:>7.1f}" if "f1" in r else f"{'':>7}" if qa else "")
                     + f"{100 * r['format']:>8.1f}"
                     + (f"{r['response_length']:>8.1f}{100 * r['truncated']:>7.1f}{r['seconds']:>7.0f}s" if timed
                        else f"{'-':>8}{'-':>7}{'-':>8}"))
    for name, why in left_out.items():
        lines.append(f"{labels.get(name, name):<16}  not run: {why}")
    if len(results) > 1 or left_out:
        average = np.mean([r["pass@1"] for r in results.values()]) if results else math.nan
        ran = f" ({len(results)} of {len(results) + len(left_out)})" if left_out else ""
        lines.append(f"{'average' + ran:<30}{100 * average:>8.1f}")
    return "\n".join(lines)


def format_panel(results: dict[str, dict], panel: str) -> str:
    """A panel as its paper prints it: one column per benchmark in the paper's order, then the equally
    weighted average over the columns that ran; a row for pass@1 (and pass@8 where every column has
    n >= 8, as PASS's Table 5). A column that did not run shows "-"."""
    members = PANELS[panel].members
    widths = [max(len(label), 6) for _, label, _ in members]
    lines = [PANELS[panel].title, "".join(f"{label:>{w + 2}}" for (_, label, _), w in zip(members, widths)) + "    Avg."]
    for k in (1, 8):
        values = [results[name].get(f"pass@{k}") if name in results else None for name, _, _ in members]
        ran = [v for v in values if v is not None]
        if not ran:  # pass@8 where no column has 8 samples; a panel none of whose benchmarks ran
            continue
        lines.append("".join(f"{100 * v:>{w + 2}.1f}" if v is not None else f"{'-':>{w + 2}}"
                             for v, w in zip(values, widths))
                     + f"{100 * float(np.mean(ran)):>8.1f}" + f"   pass@{k}" + ("" if len(ran) == len(values) else
                                                                              f" ({len(ran)} of {len(values)})"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="a local model folder (runs/<name>/final) or a hub name")
    p.add_argument("--benchmarks", default="", help="comma-separated, from: " + ", ".join(BENCHMARKS)
                   + "; default: the panel's, else toy if the tokenizer has no chat template, else "
                   + ",".join(MATH_BENCHMARKS))
    p.add_argument("--panel", default="", choices=("", *PANELS),
                   help="a paper's table with its protocols: prime (PRIME Table 2), pass-math (PASS Tables 1 "
                        "and 5), pass-qa (PASS Table 3); a flag given beside it overrides the panel's value")
    p.add_argument("--benchmark-file", action="append", default=[], metavar="NAME=PATH",
                   help="a release file, repeatable: " + ", ".join(benchmark.RELEASE_FILES)
                        + " (livecodebench may name several files of its release)")
    p.add_argument("--lcb-dates", default=":".join(benchmark.LCB_V2), metavar="START:END",
                   help="LiveCodeBench's problems dated START to END inclusive (default: v2's, as PRIME's Table 2)")
    p.add_argument("--responses", default="", metavar="FILE",
                   help="instead of generating: grade these saved generations, JSON lines "
                        '{"benchmark": NAME, "index": I, "response": TEXT} (no model is loaded)')
    p.add_argument("--data-dir", default=str(benchmark.DATA_DIR), help="folder holding the shipped benchmark "
                   "files (default: benchmarks/ in this repository; benchmarks/SOURCES.md lists them)")
    p.add_argument("--n", type=int, default=None, help="responses per problem (default 16, or the panel's)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding, one response per problem (PRIME's tables)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 0.6, or the panel's)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default 0.95, or the panel's)")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="generation cap; 0 = the panel's, else the benchmark's (3072; code 4096 to 8192; 96 for toy)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems of each benchmark")
    p.add_argument("--batch-size", type=int, default=256, help="responses per generate call")
    p.add_argument("--system-prompt", default=None,
                   help="system message for the chat template, as in training (default none; PRIME's with --panel prime)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, reset before each benchmark")
    p.add_argument("--math-grader", default="math-verify", choices=verify.MATH_GRADERS,
                   help="who finds a response's answer: math-verify's own extraction, or 'official' "
                        "(the last \\boxed{} only, as PRIME's grader)")
    p.add_argument("--rollout", default="hf", choices=("hf", "vllm"),
                   help="generation backend: HF generate, or a vLLM engine (much faster for n > 1 and long answers)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="--rollout vllm: fraction of the GPU for vLLM (no training shares it here)")
    p.add_argument("--out", default="", help="results JSON; default <model>/eval.json (./eval.json for a hub name "
                                             "or --responses)")
    p.add_argument("--plot", nargs="+", default=None, metavar="RUN_DIR",
                   help="instead of evaluating: plot these train.py run folders side by side")
    p.add_argument("--plot-out", default="compare.png", help="where --plot writes its figure")
    p.add_argument("--compare", nargs=2, default=None, metavar=("A.json", "B.json"),
                   help="instead of evaluating: two eval.py results of the same problems (e.g. --rollout hf and "
                        "vllm), their per-problem differences with paired standard errors")
    p.add_argument("--episodes", default="", metavar="RUN_DIR",
                   help="instead of evaluating: draw RUN_DIR/episodes.png (tokens coloured by their process reward)")
    args = p.parse_args(argv)
    try:
        check_args(args)
    except SystemExit as e:  # every bad value: "eval.py: error: ...", exit code 2, no traceback
        p.exit(2, f"{p.prog}: error: {e}\n")
    return args


def check_args(args: argparse.Namespace) -> None:
    """Every flag's domain and every path, before any model or benchmark file is read."""
    if args.compare is not None:
        for path in args.compare:
            if not Path(path).is_file():
                raise SystemExit(f"--compare {path}: no such file (an eval.py results JSON)")
        return
    if args.episodes:
        if not (Path(args.episodes) / "episodes.jsonl").exists():
            raise SystemExit(f"--episodes {args.episodes}: no episodes.jsonl there (a train.py run folder?)")
        return
    if args.plot is not None:
        for run in args.plot:
            if not (Path(run) / "metrics.jsonl").exists():
                raise SystemExit(f"--plot {run}: no metrics.jsonl there (a train.py run folder?)")
        return
    if args.responses:
        if not Path(args.responses).is_file():
            raise SystemExit(f"--responses {args.responses}: no such file (JSON lines of benchmark, index, response)")
    elif not args.model:
        raise SystemExit("--model is required (or --responses FILE to grade saved generations, --plot RUN_DIR ... "
                         "to plot runs, --episodes RUN_DIR)")
    if args.greedy and args.n not in (None, 1):
        raise SystemExit(f"--greedy decodes one response per problem: drop --n {args.n}")
    for flag, value in (("--n", args.n), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise SystemExit(f"{flag} {value}: must be >= 1")
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
        if value < 0:
            raise SystemExit(f"{flag} {value}: must be >= 0")
    if not args.greedy and args.temperature is not None and not args.temperature > 0:
        raise SystemExit(f"--temperature {args.temperature}: must be > 0 (use --greedy for deterministic decoding)")
    if not args.greedy and args.top_p is not None and not 0 < args.top_p <= 1:
        raise SystemExit(f"--top-p {args.top_p}: must be in (0, 1]")
    args.files = defaultdict(list)  # --benchmark-file NAME=PATH, in the order given
    for spec in args.benchmark_file:
        name, _, path = spec.partition("=")
        if name not in benchmark.RELEASE_FILES or not path:
            raise SystemExit(f"--benchmark-file {spec}: expected NAME=PATH, NAME one of "
                             f"{', '.join(benchmark.RELEASE_FILES)} (the others ship in benchmarks/)")
        if not Path(path).is_file():
            raise SystemExit(f"--benchmark-file {spec}: no such file")
        args.files[name].append(path)
    args.dates = tuple(args.lcb_dates.split(":"))
    try:
        in_order = len(args.dates) == 2 and time.strptime(args.dates[0], "%Y-%m-%d") <= \
            time.strptime(args.dates[1], "%Y-%m-%d")
    except ValueError:
        in_order = False
    if not in_order:
        raise SystemExit(f"--lcb-dates {args.lcb_dates}: expected START:END, two dates YYYY-MM-DD in order")
    if args.benchmarks:
        names = check_benchmark_names(args.benchmarks)
        if any(BENCHMARKS[name].path for name in names) and not Path(args.data_dir).is_dir():
            raise SystemExit(f"--data-dir {args.data_dir}: no such folder (it holds the benchmark files)")
    if args.responses:
        return
    if not Path(args.model).exists() and "/" not in args.model:
        raise SystemExit(f"--model {args.model}: no such local path (and not a hub name like org/model)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise SystemExit(f"--gpu-memory-utilization {args.gpu_memory_utilization}: must be in (0, 1]")
    if args.rollout == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise SystemExit("--rollout vllm: vLLM is not installed (pip install -r requirements-vllm.txt), "
                             "or use --rollout hf")


def protocols(args, names: list[str]) -> dict[str, Protocol]:
    """Each benchmark's decoding: the panel's (else eval's defaults: n 16, T 0.6, top-p 0.95, the
    benchmark's cap), with every flag the command line gives put over it."""
    panel = {name: proto for name, _, proto in PANELS[args.panel].members} if args.panel else {}
    out = {}
    for name in names:
        base = panel.get(name, Protocol())
        sampling = args.n is not None or args.temperature is not None or args.top_p is not None
        greedy = args.greedy or (base.greedy and not sampling)
        out[name] = Protocol(n=1 if greedy else args.n or (16 if base.greedy else base.n), greedy=greedy,
                             temperature=base.temperature if args.temperature is None else args.temperature,
                             top_p=base.top_p if args.top_p is None else args.top_p,
                             max_new_tokens=args.max_new_tokens or base.max_new_tokens
                             or BENCHMARKS[name].max_new_tokens)
    return out


def read_responses(args) -> dict[str, tuple[list[Item], dict[int, list[str]]]]:
    """--responses: {benchmark: (its items, {index: the problem's responses in file order})}. A row names
    its benchmark, the problem's 0-based index as --limit counts it, and one response; several rows of
    one problem are its n samples. A bad row stops with its line number."""
    rows: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    items: dict[str, list[Item]] = {}
    with open(args.responses, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"--responses {args.responses} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise SystemExit(f"{where}: not JSON ({error})") from None
            if not isinstance(row, dict) or not {"benchmark", "index", "response"} <= row.keys():
                raise SystemExit(f"{where}: expected the fields benchmark, index and response")
            name, index, response = row["benchmark"], row["index"], row["response"]
            if name not in BENCHMARKS:
                raise SystemExit(f"{where}: unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
            if name not in items:
                if benchmark.missing_release(name, args.files):
                    raise SystemExit(f"{where}: " + benchmark.missing_release(name, args.files))
                items[name] = load_benchmark(name, args.data_dir, args.limit, args.files, args.dates)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(items[name]):
                raise SystemExit(f"{where}: index {index!r} is not a problem of {name} (0 to {len(items[name]) - 1})")
            if not isinstance(response, str):
                raise SystemExit(f"{where}: response must be a string, got {type(response).__name__}")
            rows[name][index].append(response)
    if not rows:
        raise SystemExit(f"--responses {args.responses}: no responses in it")
    return {name: (items[name], rows[name]) for name in rows}


def grade_responses(args, names: list[str] | None) -> dict[str, dict]:
    """Each benchmark of the --responses file (those of `names` only, when given): the problems it
    names, graded and summarised as a generated evaluation is."""
    results = {}
    for name, (items, responses) in read_responses(args).items():
        if names is not None and name not in names:
            continue
        start, chosen = time.time(), [items[i] for i in sorted(responses)]
        texts = [t for item in chosen for t in responses[item.index]]
        verdicts = iter(benchmark.grade(name, [item for item in chosen for _ in responses[item.index]], texts,
                                        args.math_grader))
        graded = [[(t, next(verdicts)) for t in responses[item.index]] for item in chosen]
        results[name] = summarize(name, chosen, graded)
        results[name]["seconds"] = time.time() - start
    return results


def main(argv=None) -> dict | Path:
    args = parse_args(argv)
    if args.compare is not None:
        a, b = (json.loads(Path(path).read_text()) for path in args.compare)
        stats = compare_evaluations(a, b)
        print(format_comparison(stats, *args.compare))
        return stats
    if args.episodes:
        out = plots.plot_episodes(args.episodes)
        print(f"wrote {out}" if out else f"{args.episodes}: no episodes to draw")
        return out
    if args.plot is not None:
        out = plots.plot_runs(args.plot, args.plot_out)
        print(f"wrote {out}")
        return out

    # 1. Which benchmarks, with which protocol; a panel member whose release file is missing is left out.
    names = check_benchmark_names(args.benchmarks) if args.benchmarks else None
    if names is None and args.panel:
        names = [name for name, _, _ in PANELS[args.panel].members]
    left_out = {name: benchmark.missing_release(name, args.files) for name in names or []
                if args.panel and benchmark.missing_release(name, args.files)}
    for name in left_out:
        print(f"left out: {left_out[name]}")
    system_prompt = args.system_prompt if args.system_prompt is not None else \
        PANELS[args.panel].system_prompt if args.panel else ""
    if args.responses:  # 2-4. graded from the file: no model
        results = grade_responses(args, [n for n in names if n not in left_out] if names else None)
        left_out.update({name: f"no rows in --responses {args.responses}" for name in names or []
                         if name not in results and name not in left_out})
        names = list(results)
    else:
        transformers.utils.logging.disable_progress_bar()  # one kind of progress bar: ours
        tokenizer = load_tokenizer(args.model)
        if names is None:
            names = list(MATH_BENCHMARKS) if getattr(tokenizer, "chat_template", None) else ["toy"]
        names = [name for name in names if name not in left_out]
        items = {name: load_benchmark(name, args.data_dir, args.limit, args.files, args.dates)
                 for name in names}  # fail fast
        chosen = protocols(args, names)
        sampler = make_sampler(args, tokenizer, max(p.max_new_tokens for p in chosen.values()))
        results = {name: evaluate(name, items[name], sampler, tokenizer, chosen[name], args.batch_size,
                                  system_prompt, args.seed, args.math_grader) for name in names}
        for name in names:
            results[name]["protocol"] = vars(chosen[name])
    if not results:
        raise SystemExit("no benchmark could run: " + "; ".join(left_out.values()))

    # 5. Report: the JSON, then the table
    shared = {json.dumps(r.get("protocol")) for r in results.values()}
    protocol = results[names[0]].get("protocol", {}) if len(shared) == 1 else {}
    report = {
        "model": args.model or None, "responses": args.responses or None,
        "settings": {"panel": args.panel or None, "n": protocol.get("n"), "greedy": protocol.get("greedy"),
                     "temperature": None if protocol.get("greedy", True) else protocol.get("temperature"),
                     "top_p": None if protocol.get("greedy", True) else protocol.get("top_p"),
                     "max_new_tokens": protocol.get("max_new_tokens"), "limit": args.limit, "seed": args.seed,
                     "rollout": None if args.responses else args.rollout, "math_grader": args.math_grader,
                     "system_prompt": system_prompt, "data_dir": portable(args.data_dir),
                     "benchmark_files": {k: [portable(p) for p in v] for k, v in args.files.items()},
                     "livecodebench_dates": list(args.dates), "bootstrap_resamples": BOOTSTRAP_RESAMPLES},
        "average_pass@1": float(np.mean([r["pass@1"] for r in results.values()])),
        "left_out": left_out,
        "benchmarks": results,
    }
    model_dir = Path(args.model) if args.model and Path(args.model).is_dir() else Path(".")
    out = Path(args.out) if args.out else model_dir / "eval.json"
    write_json(out, report, indent=1)
    labels = {name: label for name, label, _ in PANELS[args.panel].members} if args.panel else {}
    if "livecodebench" in results:
        labels["livecodebench"] = labels.get("livecodebench", "livecodebench") + " " + "..".join(args.dates)
    if args.responses:
        decoding = f"responses {args.responses}"
    elif protocol:
        decoding = (f"{args.model}: greedy" if protocol["greedy"] else
                    f"{args.model}: n={protocol['n']}, T={protocol['temperature']}, top-p={protocol['top_p']}")
        decoding += f", max {protocol['max_new_tokens']} new tokens"
    else:
        decoding = f"{args.model}: each benchmark's protocol (in the JSON)"
    print(f"\n{PANELS[args.panel].title + ': ' if args.panel else ''}{decoding} (percent)")
    print(format_table(results, labels, left_out))
    if args.panel and any(name in results for name, _, _ in PANELS[args.panel].members):
        print("\n" + format_panel(results, args.panel))
    print(f"results: {out}")
    return report


if __name__ == "__main__":
    main()
