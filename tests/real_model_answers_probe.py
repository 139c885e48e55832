"""Do a real-model run's answers hold the sum, or restate "a + b"? (issue 43's reward hack)

    python tests/real_model_answers_probe.py start prime-s1 rloo-s1 prime-s2 rloo-s2

Each name is runs/real/<name>/final ("start": the converted SmolLM2 folder in .cache). Greedy decoding
of the 40 held-out prompts of runs/real/sums2.jsonl (train.py's held-out rows), scored by verify.py as
training scores them. Prints, per model: the answers scored right and how many of them write the gold
sum, and the answers refused as arithmetic on plain numbers (reason `unevaluated`: "86 + 87", which
math-verify alone reads as 173). Not a test: a probe of finished runs (docs/REPRODUCTION.md, section 3).
"""

import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data  # noqa: E402
import verify  # noqa: E402
from reproduce import train_config  # noqa: E402
from rollout import HFRollout  # noqa: E402

torch.set_num_threads(1)
args = train_config(["--model", ".cache/smollm2-135m-instruct", "--data", "runs/real/sums2.jsonl", "--prompt-key",
                     "question", "--eval-problems", "40", "--max-response-len", "96"])
for run in sys.argv[1:]:
    path = ".cache/smollm2-135m-instruct" if run == "start" else f"runs/real/{run}/final"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    _, tasks = data.load_tasks(args, tokenizer)
    sampler = HFRollout(model, tokenizer, args.max_response_len, 1.0, 1.0)
    texts = sampler.decode(sampler.generate([t.prompt_ids for t in tasks], n=1, greedy=True))
    scores = verify.score_batch(texts, [t.answer for t in tasks], ["math"] * len(tasks))
    right = [(t, x) for t, x, s in zip(tasks, texts, scores) if s.reward == 1]
    with_sum = [x for t, x in right if re.search(rf"(?<!\d){t.answer}(?!\d)", x)]
    restated = [x for x, s in zip(texts, scores) if s.reason == "unevaluated"]
    print(f"{run}: right {len(right)}/{len(tasks)}, of which write the sum {len(with_sum)}; refused as unevaluated "
          f"arithmetic {len(restated)} (e.g. {restated[:2]}); right e.g. {[x for _, x in right[:2]]}", flush=True)
