"""Benchmark evaluation and training-curve plots, with the PRIME and PASS papers' protocols.

    python eval.py --model runs/<name>/final                    # embedded toy model: toy benchmark
    python eval.py --model runs/<name>/final --greedy --limit 50
    python eval.py --model PATH --benchmarks math500,gsm8k,aime24,amc23,minerva,olympiad --greedy
    python eval.py --model PATH --benchmarks aime24,amc23 --n 16 --temperature 0.6 --top-p 0.95
    python eval.py --plot runs/A runs/B --plot-out compare.png  # curves of several runs
    python eval.py --compare hf.json vllm.json                  # two evaluations, paired by problem

What one evaluation does, per benchmark:
    1. load the problems and gold answers from benchmarks/ in this repository (each file names its
       gold differently: BENCHMARKS below, and benchmarks/SOURCES.md for where each file comes from);
    2. build prompts the way train.py builds them: the question plus the paper's suffix
       "Present the answer in LaTex format: \\boxed{Your answer}", through the model's chat template
       (plain text if the tokenizer has none); the toy benchmark uses the raw problem text;
    3. generate n responses per problem with the rollout backend used in training (rollout.py);
    4. score every response with verify.py (math-verify finds the answer and compares it;
       `--math-grader official`: the last \\boxed{} only, as PRIME's grader);
    5. report pass@1, pass@k (unbiased estimator, k = 1, 2, 4, ... <= n), avg@n, mean response length,
       and a problem-level bootstrap 95% interval of pass@1, as a table on the terminal and as JSON
       (written atomically, default `<model>/eval.json`), with every problem's extracted answers.

Protocols of the papers (pick the flags accordingly):
    - PRIME's tables (Table 1): greedy decoding, pass@1 (`--greedy`). The authors re-checked noisy
      AIME numbers at T = 0.3, top-p 0.95, avg@16 (`--n 16 --temperature 0.3 --top-p 0.95`).
    - PASS (Table 1 and 5, App. G): n samples per problem, pass@1 and pass@8 by the unbiased
      estimator averaged over problems, math_verify, the chat template, a 2048-token cap, 2000
      bootstrap resamples of whole problems (`--n 16 --max-new-tokens 2048`; the paper used n = 32
      to 128 at T = 1.0, top-p 0.95).
    - Default here: n = 16 samples at T = 0.6, top-p 0.95, and a 3072-token cap (the paper's training
      response length); 96 tokens for the toy task (train.py's --max-response-len).

Default benchmarks: `toy` when the tokenizer has no chat template (the embedded model), otherwise
the six math benchmarks. `--limit N` keeps the first N problems of each (quick checks).

Simplifications relative to the papers' evaluation code:
    1. One grader, verify.py (math-verify), for every benchmark; PRIME's official grader compares
       numbers at 1e-4 relative tolerance, math-verify rounds to 6 decimals.
    2. OlympiadBench's several answers (is_multiple_answer) are one comma-joined gold, compared as a
       whole by math-verify; its `unit` field is not appended to the prompt.
    3. Only math benchmarks; PRIME's code benchmarks (LeetCode, LiveCodeBench) are not included.
    4. Generation on one device, HF `generate` or a vLLM engine (`--rollout vllm`, tensor parallel 1),
       in chunks of --batch-size responses.
"""

import argparse
import importlib.util
import json
import math
import time
from pathlib import Path

import matplotlib
import numpy as np
import torch
import transformers
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

import verify  # noqa: E402
from data import (BENCHMARKS, DATA_DIR, MATH_BENCHMARKS, Item, Task, build_prompt,  # noqa: E402
                  check_benchmark_names, load_benchmark)
from ddp import Dist, all_reduce  # noqa: E402
from rollout import HFRollout, VLLMRollout  # noqa: E402
from runlog import fmt, machine, moving_average, nanmean, portable, read_jsonl, read_run, save_figure, write_json  # noqa: E402

BOOTSTRAP_RESAMPLES = 2000  # as PASS's Table 6: 2000 resamples of whole problems
BOOTSTRAP_SEED = 0
PHASES = ("rollout", "verify", "prm", "policy", "eval", "other")  # train.py's step-time split

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
        return HFRollout(load_model(args.model), tokenizer, max_new_tokens, args.temperature, args.top_p)
    on_gpu = torch.cuda.is_available()
    adapter = adapter_config(args.model)  # a LoRA adapter: the engine loads its base and takes the adapter
    base, rank = (adapter["base_model_name_or_path"], adapter["r"]) if adapter else (None, 0)
    engine = VLLMRollout(base or args.model, tokenizer, max_new_tokens, args.temperature, args.top_p,
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
    (rollout, texts, scores), the n samples of a prompt in consecutive rows. The one evaluator behind
    both the benchmarks (`evaluate`) and train.py's held-out accuracy (`heldout_accuracy`)."""
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
    start = heldout_metrics(sampler, eval_tasks, args, d)
    if d.master:
        write_json(run_dir / "summary.json", {"start_accuracy": start["greedy"],
                                                     "start_sampled_accuracy": start["sampled"]})
    return start, time.time() - t


def evaluate(name: str, items: list[Item], sampler, tokenizer, n: int, greedy: bool,
             batch_size: int = 256, system_prompt: str = "", seed: int = 0,
             math_grader: str = "math-verify") -> dict:
    """Generate n responses per problem, score them, return the benchmark's metrics and details.

    Metrics (all in [0, 1] except the length):
      pass@k   mean over problems of pass_at_k(n, c, k), c = responses with reward 1;
               pass@1 = mean c/n (with --greedy, plain accuracy)
      avg@n    mean reward over all n x P responses: equal to pass@1 for 0/1 math rewards (it
               would differ for partial rewards such as a code test pass fraction)
      pass@1_ci95  problem-level bootstrap interval of pass@1
      format   fraction of responses with exactly one closed \\boxed{} (verify.py's format channel)
      response_length  mean tokens per response, EOS included; truncated: no EOS within the cap
    Details for reading the results: example_prompt (the first prompt as the model saw it) and, per
    problem, its gold, its number of correct responses, every response's boxed answer, and the
    first response in full.
    """
    bench = BENCHMARKS[name]
    prompts = [build_prompt(tokenizer, item.question, bench.templated, system_prompt) for item in items]
    torch.manual_seed(seed)  # each benchmark's samples do not depend on which benchmarks ran before
    per_call = max(1, batch_size // n)  # prompts per generate call; a prompt's n samples stay together
    correct, rewards, formats, lengths, truncated, details = [], [], [], [], [], []
    start = time.time()
    with tqdm(total=len(items), desc=name, unit="problem", dynamic_ncols=True) as bar:
        for first in range(0, len(items), per_call):
            chunk = items[first:first + per_call]
            rollout, texts, scores = sample_and_score(sampler, [ids for ids, _ in prompts[first:first + per_call]],
                                                      [item.gold for item in chunk], ["math"] * len(chunk), n,
                                                      greedy, math_grader, [item.question for item in chunk])
            chunk_lengths = rollout.response_mask.sum(-1).tolist()
            for j, item in enumerate(chunk):  # rows j*n .. j*n+n-1 are this problem's samples
                rows = slice(j * n, (j + 1) * n)
                group = scores[rows]
                correct.append(sum(s.reward == 1.0 for s in group))
                details.append({"index": item.index, "gold": item.gold, "correct": correct[-1],
                                "boxed": sum(s.format == 1.0 for s in group),  # for --compare
                                "truncated": int(rollout.truncated[rows].sum()),
                                "length": float(np.mean(chunk_lengths[rows])),
                                "answers": [verify.extract_boxed(t) for t in texts[rows]],
                                "response": texts[j * n]})
            rewards += [s.reward for s in scores]
            formats += [s.format for s in scores]
            lengths += chunk_lengths
            truncated += rollout.truncated.tolist()
            bar.update(len(chunk))
            bar.set_postfix(pass1=f"{sum(correct) / (n * len(correct)):.3f}")

    per_problem_pass1 = [c / n for c in correct]
    result = {"problems": len(items), "n": n}
    for k in ks_for(n):
        result[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in correct]))
    result["pass@1_ci95"] = list(bootstrap_interval(per_problem_pass1))
    result["avg@n"] = float(np.mean(rewards))
    result["format"] = float(np.mean(formats))
    result["response_length"] = float(np.mean(lengths))
    result["truncated"] = float(np.mean(truncated))
    result["seconds"] = time.time() - start
    result["example_prompt"] = prompts[0][1]
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
            scale_a, scale_b = (1, 1) if metric == "length" else (ra["n"], rb["n"])
            d = np.array([pa[i][key] / scale_a - pb[i][key] / scale_b for i in shared], dtype=float)
            mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(len(d)))
            out[name][metric] = {"a": float(np.mean([pa[i][key] / scale_a for i in shared])),
                                 "b": float(np.mean([pb[i][key] / scale_b for i in shared])),
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


def format_table(results: dict[str, dict]) -> str:
    """The terminal table: one row per benchmark (percent), then the unweighted average of pass@1
    over benchmarks (how both papers average: every benchmark weighs the same)."""
    ks = ks_for(next(iter(results.values()))["n"])
    header = (f"{'benchmark':<14}{'problems':>9}{'n':>5}{'pass@1':>8}{'95% CI':>16}"
              + "".join(f"{f'pass@{k}':>9}" for k in ks[1:])
              + f"{'avg@n':>8}{'format':>8}{'length':>8}{'trunc':>7}{'time':>8}")
    lines = [header, "-" * len(header)]
    for name, r in results.items():
        low, high = r["pass@1_ci95"]
        lines.append(f"{name:<14}{r['problems']:>9}{r['n']:>5}{100 * r['pass@1']:>8.1f}"
                     f"{f'[{100 * low:.1f}, {100 * high:.1f}]':>16}"
                     + "".join(f"{100 * r[f'pass@{k}']:>9.1f}" for k in ks[1:])
                     + f"{100 * r['avg@n']:>8.1f}{100 * r['format']:>8.1f}"
                       f"{r['response_length']:>8.1f}{100 * r['truncated']:>7.1f}{r['seconds']:>7.0f}s")
    if len(results) > 1:
        average = np.mean([r["pass@1"] for r in results.values()])
        lines.append(f"{'average':<14}{'':>9}{'':>5}{100 * average:>8.1f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Plots: compare runs the way the papers' Figs. 3-5 do
# ---------------------------------------------------------------------------------------------------


def load_run(run_dir: str | Path) -> dict:
    """runlog.read_run for --plot: a run folder with at least one step."""
    run = read_run(run_dir)
    if not run["metrics"]:
        raise SystemExit(f"--plot {run_dir}: no steps in metrics.jsonl (is it a train.py run folder?)")
    return run


def _series(metrics: list[dict], key: str) -> list[float]:
    return [math.nan if m.get(key) is None else float(m[key]) for m in metrics]


def pick_episodes(episodes: list[dict], per_phase: tuple[int, int] = (2, 1)) -> list[dict]:
    """Episodes for the picture: from the first and the last 15% of the run's steps, up to
    `per_phase` = (wrong ones that have a first wrong step, right ones), earliest first."""
    if not episodes:
        return []
    last = max(e["step"] for e in episodes)
    cut = max(1, round(0.15 * last))
    chosen = []
    for phase in ([e for e in episodes if e["step"] <= cut], [e for e in episodes if e["step"] > last - cut]):
        wrong = [e for e in phase if e["outcome"] < 1 and e.get("first_wrong_step", -1) >= 0][:per_phase[0]]
        right = [e for e in phase if e["outcome"] >= 1][:per_phase[1]]
        chosen += sorted(wrong + right, key=lambda e: e["step"])
    return chosen


def plot_episodes(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """runs/<name>/episodes.png: a few responses, early and late in the run, each token's background
    coloured by its process reward (Eq. 3's r_phi for PRIME: blue credited, red blamed, the scale
    symmetric around 0 and set by the largest |r| shown), the steps' sums at the right, and the first
    step the exact checker marks wrong boxed. Read from episodes.jsonl; None if it has no episode."""
    run_dir = Path(run_dir)
    path = run_dir / "episodes.jsonl"
    if not path.exists():
        raise SystemExit(f"--episodes {run_dir}: no episodes.jsonl (is it a train.py run folder?)")
    episodes = pick_episodes(read_jsonl(path))
    if not episodes:
        return None
    vmax = max(max((abs(r) for r in e["reward"]), default=0.0) for e in episodes) or 1.0
    cmap = plt.get_cmap("coolwarm_r")  # negative (blamed) red, positive (credited) blue
    layout = []  # per episode: its lines, each a list of (char, reward, step)
    for e in episodes:
        lines, line = [], []
        steps = e.get("step_ids") or [0] * len(e["tokens"])
        for token, r, k in zip(e["tokens"], e["reward"], steps):
            text = {"Ċ": "\n", "<eos>": "⏎", "<|im_end|>": "⏎", "<|endoftext|>": "⏎", None: "·"}.get(token, token)
            text = text.replace("Ġ", " ") if text != "\n" else text  # a BPE token's leading space (byte-level)
            if text == "\n":
                line.append(("↵", r, k))
                lines.append(line)
                line = []
            else:
                line.append((text, r, k))
        lines.append(line)
        layout.append([l for l in lines if l])
    n_rows = sum(len(l) + 1.6 for l in layout)
    width = max(sum(len(ch) for ch, _, _ in l) for lines in layout for l in lines) + 16  # a token as wide as its text
    fig, ax = plt.subplots(figsize=(0.16 * width + 2, 0.27 * n_rows + 1.0))
    y = 0.0
    for e, lines in zip(episodes, layout):
        verdict = "right" if e["outcome"] >= 1 else "wrong"
        extra = f", first wrong step: line {e['first_wrong_step'] + 1}" if e.get("first_wrong_step", -1) >= 0 else ""
        ax.text(0, y, f"step {e['step']}: {verdict} (outcome {e['outcome']:g}{extra})", fontsize=9,
                fontweight="bold", va="center")
        y += 1.1
        for line in lines:
            x = 0
            for ch, r, _ in line:
                shade = max(-1, min(1, r / vmax))
                ax.add_patch(Rectangle((x, y - 0.45), len(ch), 0.9, color=cmap(0.5 + 0.5 * shade)))
                ax.text(x + len(ch) / 2, y, ch, fontsize=9, family="monospace", ha="center", va="center",
                        color="white" if abs(shade) > 0.6 else "black")  # readable on the darkest cells
                x += len(ch)
            step = line[0][2]
            total = sum(r for _, r, _ in line)
            wrong_line = e.get("first_wrong_step", -1) == step and e["outcome"] < 1
            if wrong_line:
                ax.add_patch(Rectangle((-0.1, y - 0.5), x + 0.2, 1.0, fill=False, lw=1.6, ec="black"))
            ax.text(x + 1, y, f"Σ {total:+.2f}" + ("  ← first wrong step" if wrong_line else ""),
                    fontsize=8, va="center", family="monospace")
            y += 1
        y += 0.5
    ax.set_xlim(-0.5, width)
    ax.set_ylim(y, -1)
    ax.axis("off")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-vmax, vmax))
    fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.01, label="process reward per token")
    ax.set_title(f"{run_dir.name}: per-token process rewards, early and late episodes", fontsize=10)
    out = save_figure(fig, Path(out) if out else run_dir / "episodes.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_runs(run_dirs: list[str], out: str | Path) -> Path:
    """One PNG, six panels, one colour per run (train.py draws a run's own curves.png with it):
      outcome training reward, raw and 10-step moving average                  (PRIME Fig. 3a, 4a)
      held-out accuracy, sampled (solid) and greedy (dashed): the start (step 0), every
        --eval-every steps, the end                                             (Fig. 3b)
      PRM pairwise classification accuracy                                      (Fig. 5)
      localisation: the most blamed step is the first wrong one (embedded task)
      response length (tokens)
      mean seconds per step, split into train.py's phases, as stacked bars     (Table 2)
    """
    runs = [load_run(d) for d in run_dirs]
    names = [r["dir"].name for r in runs]
    if len(set(names)) < len(names):  # runs/A and other/A: the full paths tell them apart
        names = [str(r["dir"]) for r in runs]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 3, figsize=(17, 8.5))
    curves = [(axes[0, 0], "reward", "outcome training reward"),
              (axes[0, 2], "prm_accuracy", "PRM pairwise accuracy"),
              (axes[1, 0], "prm_localization", "first wrong step = most blamed step"),
              (axes[1, 1], "response_length", "response length (tokens)")]
    for i, (run, name) in enumerate(zip(runs, names)):
        colour = colours[i % len(colours)]
        metrics, summary = run["metrics"], run["summary"]
        steps = [m["step"] for m in metrics]
        for ax, key, _ in curves:
            values = _series(metrics, key)
            ax.plot(steps, values, color=colour, alpha=0.3, linewidth=1)
            ax.plot(steps, moving_average(values), color=colour, label=f"{name} (10-step mean)")
        # held-out accuracy: the summary's start (step 0), the logged steps, the summary's end
        for kind, key, start, end, style in (("sampled", "heldout_sampled_accuracy", "start_sampled_accuracy",
                                              "end_sampled_accuracy", "o-"),
                                             ("greedy", "heldout_accuracy", "start_accuracy", "end_accuracy", "s--")):
            points = [(0, summary.get(start))] + [(m["step"], m.get(key)) for m in metrics] + \
                     [(steps[-1], summary.get(end))]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                axes[0, 1].plot(*zip(*points), style, color=colour, label=f"{name} ({kind})")
        # mean seconds per step, split into train.py's phases (PRIME Table 2)
        timed = [m["time"] for m in metrics if m.get("time")]
        left = 0.0
        for j, phase in enumerate(PHASES):
            seconds = float(np.mean([t.get(phase, 0.0) for t in timed])) if timed else 0.0
            axes[1, 2].barh(name, seconds, left=left, color=plt.get_cmap("Set2")(j),  # not a run colour
                            label=phase if i == 0 else None)
            left += seconds
    for ax, key, title in curves:
        ax.set_title(f"{title} (faint: per step)")
        if not any(np.isfinite(_series(run["metrics"], key)).any() for run in runs):  # e.g. --data: no step checker
            ax.text(0.5, 0.5, f"not logged by {'this run' if len(runs) == 1 else 'these runs'}",
                    ha="center", va="center", transform=ax.transAxes, color="grey")
    axes[0, 1].set_title("held-out accuracy")
    axes[1, 2].set_title("mean seconds per step, by phase")
    axes[1, 2].set_xlabel("seconds")
    for ax in axes.flat:
        if ax is not axes[1, 2]:
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = save_figure(fig, out, dpi=100)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def write_summary(run_dir: Path, args, start: dict, end: dict, timing: dict, eval_problems: int) -> None:
    """summary.json, curves.png and episodes.png, and the run's closing lines on the terminal."""
    metrics = read_run(run_dir)["metrics"]
    summary = {"start_accuracy": start["greedy"], "end_accuracy": end["greedy"],
               "start_sampled_accuracy": start["sampled"], "end_sampled_accuracy": end["sampled"],
               "steps": args.steps, "eval_problems": eval_problems, "wall_seconds": timing["wall_seconds"],
               "step_seconds": timing["step_seconds"], "eval_seconds": timing["eval_seconds"], "machine": machine(),
               "final_reward_10": float(np.mean([m["reward"] for m in metrics[-10:]])),
               "final_prm_accuracy_10": nanmean([m["prm_accuracy"] for m in metrics[-10:]]),
               "final_prm_localization_10": nanmean([m.get("prm_localization") for m in metrics[-10:]])}
    write_json(run_dir / "summary.json", summary)
    plot_runs([run_dir], run_dir / "curves.png")
    # the episode picture: which tokens the process signal blamed (none to draw with --episodes-per-step 0,
    # or when no step kept a group)
    if not args.data and (run_dir / "episodes.jsonl").exists():
        plot_episodes(run_dir)
    split = ", ".join(f"{k} {v:.2f}s" for k, v in summary["step_seconds"].items())
    print(f"\nheld-out accuracy ({eval_problems} problems): greedy {start['greedy']:.3f} -> {end['greedy']:.3f}; "
          f"sampled ({args.eval_samples} per problem) {start['sampled']:.3f} -> {end['sampled']:.3f}")
    print(f"training reward (last 10 steps): {summary['final_reward_10']:.3f}; "
          f"PRM pairwise accuracy (last 10): {fmt(summary['final_prm_accuracy_10'])}; "
          f"localisation (last 10): {fmt(summary['final_prm_localization_10'])}")
    print(f"time per step: {split}; wall {timing['wall_seconds']:.0f}s")
    state = Path(run_dir) / "checkpoint" / "state.pt"  # models and optimizers (with --lora-rank: adapters only)
    saved = f", checkpoint/ ({state.stat().st_size / 1e6:.1f} MB of models and optimizers)" if state.exists() else ""
    print(f"run folder: {run_dir} (metrics.jsonl, episodes.jsonl, curves.png, final/, summary.json{saved})", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="a local model folder (runs/<name>/final) or a hub name")
    p.add_argument("--benchmarks", default="", help="comma-separated, from: " + ", ".join(BENCHMARKS)
                   + "; default: toy if the tokenizer has no chat template, else " + ",".join(MATH_BENCHMARKS))
    p.add_argument("--data-dir", default=str(DATA_DIR), help="folder holding the benchmark files "
                   "(default: benchmarks/ in this repository; benchmarks/SOURCES.md lists them)")
    p.add_argument("--n", type=int, default=None, help="responses per problem (default 16; 1 with --greedy)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding, one response per problem (PRIME's tables)")
    p.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (ignored with --greedy)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling (ignored with --greedy)")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="generation cap; 0 = the benchmarks' default (3072; 96 for toy)")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems of each benchmark")
    p.add_argument("--batch-size", type=int, default=256, help="responses per generate call")
    p.add_argument("--system-prompt", default="", help="system message for the chat template, as in training")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, reset before each benchmark")
    p.add_argument("--math-grader", default="math-verify", choices=verify.MATH_GRADERS,
                   help="who finds a response's answer: math-verify's own extraction, or 'official' "
                        "(the last \\boxed{} only, as PRIME's grader)")
    p.add_argument("--rollout", default="hf", choices=("hf", "vllm"),
                   help="generation backend: HF generate, or a vLLM engine (much faster for n > 1 and long answers)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="--rollout vllm: fraction of the GPU for vLLM (no training shares it here)")
    p.add_argument("--out", default="", help="results JSON; default <model>/eval.json (./eval.json for a hub name)")
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
    if not args.model:
        raise SystemExit("--model is required (or --plot RUN_DIR ... to plot runs, --episodes RUN_DIR)")
    if args.greedy and args.n not in (None, 1):
        raise SystemExit(f"--greedy decodes one response per problem: drop --n {args.n}")
    args.n = 1 if args.greedy else (16 if args.n is None else args.n)
    for flag, value in (("--n", args.n), ("--batch-size", args.batch_size)):
        if value < 1:
            raise SystemExit(f"{flag} {value}: must be >= 1")
    for flag, value in (("--limit", args.limit), ("--max-new-tokens", args.max_new_tokens)):
        if value < 0:
            raise SystemExit(f"{flag} {value}: must be >= 0")
    if not args.greedy and not args.temperature > 0:
        raise SystemExit(f"--temperature {args.temperature}: must be > 0 (use --greedy for deterministic decoding)")
    if not args.greedy and not 0 < args.top_p <= 1:
        raise SystemExit(f"--top-p {args.top_p}: must be in (0, 1]")
    if args.benchmarks:
        names = check_benchmark_names(args.benchmarks)
        if any(name != "toy" for name in names) and not Path(args.data_dir).is_dir():
            raise SystemExit(f"--data-dir {args.data_dir}: no such folder (it holds the benchmark files)")
    if not Path(args.model).exists() and "/" not in args.model:
        raise SystemExit(f"--model {args.model}: no such local path (and not a hub name like org/model)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise SystemExit(f"--gpu-memory-utilization {args.gpu_memory_utilization}: must be in (0, 1]")
    if args.rollout == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise SystemExit("--rollout vllm: vLLM is not installed (pip install -r requirements-vllm.txt), "
                             "or use --rollout hf")


def main(argv=None) -> dict | Path:
    args = parse_args(argv)
    if args.compare is not None:
        a, b = (json.loads(Path(path).read_text()) for path in args.compare)
        stats = compare_evaluations(a, b)
        print(format_comparison(stats, *args.compare))
        return stats
    if args.episodes:
        out = plot_episodes(args.episodes)
        print(f"wrote {out}" if out else f"{args.episodes}: no episodes to draw")
        return out
    if args.plot is not None:
        out = plot_runs(args.plot, args.plot_out)
        print(f"wrote {out}")
        return out

    transformers.utils.logging.disable_progress_bar()  # one kind of progress bar: ours
    names = check_benchmark_names(args.benchmarks) if args.benchmarks else None
    tokenizer = load_tokenizer(args.model)
    if names is None:
        names = list(MATH_BENCHMARKS) if getattr(tokenizer, "chat_template", None) else ["toy"]
    items = {name: load_benchmark(name, args.data_dir, args.limit) for name in names}  # fail fast
    max_new_tokens = args.max_new_tokens or max(BENCHMARKS[name].max_new_tokens for name in names)
    sampler = make_sampler(args, tokenizer, max_new_tokens)

    results = {name: evaluate(name, items[name], sampler, tokenizer, args.n, args.greedy,
                              args.batch_size, args.system_prompt, args.seed, args.math_grader)
               for name in names}
    report = {
        "model": args.model,
        "settings": {"n": args.n, "greedy": args.greedy,
                     "temperature": None if args.greedy else args.temperature,
                     "top_p": None if args.greedy else args.top_p, "max_new_tokens": max_new_tokens,
                     "limit": args.limit, "seed": args.seed, "rollout": args.rollout,
                     "math_grader": args.math_grader,
                     "system_prompt": args.system_prompt, "data_dir": portable(args.data_dir),
                     "bootstrap_resamples": BOOTSTRAP_RESAMPLES},
        "average_pass@1": float(np.mean([r["pass@1"] for r in results.values()])),
        "benchmarks": results,
    }
    out = Path(args.out) if args.out else (Path(args.model) if Path(args.model).is_dir() else Path(".")) / "eval.json"
    write_json(out, report, indent=1)
    decoding = "greedy" if args.greedy else f"n={args.n}, T={args.temperature}, top-p={args.top_p}"
    print(f"\n{args.model} ({decoding}, max {max_new_tokens} new tokens; percent)")
    print(format_table(results))
    print(f"results: {out}")
    return report


if __name__ == "__main__":
    main()
