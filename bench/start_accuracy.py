"""Where does a model start on a task file? Held-out accuracy, greedy and sampled, and how its responses
write their steps: the measurement issue 53 asks for before RL (a start at 10-50% sampled accuracy that
writes its steps).

    python bench/start_accuracy.py --data chains.jsonl --model .cache/smollm2-135m-instruct .cache/smollm2-chains-sft

The first --problems questions of the file (what train.py holds out, as long as --problems is at most a
tenth of the file and --eval-problems), prompted as train.py prompts (data.build_prompt: the chat
template and the paper's boxed suffix), scored by verify.py with each question (a restated question
scores 0). For a `data.py chains` file it also counts the responses that write one line per step and the
share of lines the exact checker (data.chain_steps) marks right. Prints one JSON object per model;
--out keeps them, keyed by model folder and data file.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import data  # noqa: E402
import eval as evaluation  # noqa: E402
import runlog  # noqa: E402
from rollout import HFRollout  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", required=True)
    parser.add_argument("--data", required=True, help="jsonl rows with 'question' and 'answer'")
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = data.read_rows(opts.data)[:opts.problems]
    chains = all(data.is_chain_question(r["question"]) for r in rows)
    results = {}
    for path in opts.model:
        tokenizer = AutoTokenizer.from_pretrained(path)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        prompts = [data.build_prompt(tokenizer, r["question"]) for r in rows]
        result = {"data": opts.data, "problems": len(rows), "temperature": opts.temperature,
                  "max_new_tokens": opts.max_new_tokens}
        for label, n, greedy in (("greedy", 1, True), ("sampled", opts.samples, False)):
            torch.manual_seed(opts.seed)
            sampler = HFRollout(model, tokenizer, opts.max_new_tokens, temperature=opts.temperature, batch_size=256)
            _, texts, scores = evaluation.sample_and_score(sampler, [ids for ids, _ in prompts],
                                                           [r["answer"] for r in rows], ["math"] * len(rows), n,
                                                           greedy, questions=[text for _, text in prompts])
            result[label] = {"accuracy": sum(s.reward for s in scores) / len(scores), "first_response": texts[0]}
            if chains:
                questions = [r["question"] for r in rows for _ in range(n)]
                steps = [data.chain_steps(q, t) for q, t in zip(questions, texts)]
                want = [len(data._CHAIN_QUESTION.fullmatch(q).group(1).split(" + ")) - 1 for q in questions]
                result[label]["writes_every_step"] = sum(len(s) == w for s, w in zip(steps, want)) / len(steps)
                result[label]["lines_right"] = sum(map(sum, steps)) / max(1, sum(map(len, steps)))
        print(json.dumps({path: result}), flush=True)
        results[f"{Path(path).name} on {Path(opts.data).name}"] = result
    if opts.out:
        saved = json.loads(opts.out.read_text()) if opts.out.exists() else {}
        runlog.write_json(opts.out, {**saved, **results})


if __name__ == "__main__":
    main()
