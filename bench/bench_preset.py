"""Two steps of `train.py --preset 1.5b` at full lengths on an emulated 80 GB GPU: does the preset fit?

    python bench/bench_preset.py                  # on a GPU with more than 80 GB (an H200: 141 GB)
    python bench/bench_preset.py --gpu-gb 80 --steps 2 --prompts 32

A Qwen2.5-1.5B-shaped model with random weights (so no response ends before --max-response-len 3072),
prompts of about 1000 tokens (the preset's 1024 at most), and one rank's share of the preset's batch
(--prompts 32 = 256 prompts / 8 GPUs). The GPU is capped at --gpu-gb (torch.cuda.set_per_process_memory_fraction).
vLLM does not run here (it does not travel to the benchmark machine): the rollouts are HF generate's,
whose KV cache for the step's 128 sequences (15 GB in bf16) stands in for vLLM's share (the preset's 0.25
x 80 = 20 GB) while sampling; the preset puts vLLM to sleep during the updates, so nothing is held aside then.
--hold-vllm-share holds a tensor the size of that share aside for the whole run instead (the preset
without --vllm-sleep, plus HF's cache: more than the preset needs). It prints train.py's own estimate
and what the first step used (train.py prints the allocator's peaks and the device's own use), and exits
non-zero if a step runs out of memory. Not run in CI (it needs a CUDA GPU).
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN25_15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="the GPU to emulate")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=32, help="prompts a step (one rank's share of 256 on 8)")
    parser.add_argument("--out", default=None, help="a folder for the run (default: a temporary one)")
    parser.add_argument("--hold-vllm-share", action="store_true", help="hold the preset's vLLM share of the GPU aside all run")
    parser.add_argument("--untied", action="store_true",
                        help="an output layer of its own, as DeepSeek-R1-Distill-Qwen-1.5B (1.78B parameters)")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_preset.py needs a CUDA GPU")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import config as config_module
    import toy_task
    import train

    work = Path(opts.out or tempfile.mkdtemp())
    model_dir, data = work / "qwen1.5b-random", work / "long_prompts.jsonl"
    config = Qwen2Config(**dict(QWEN25_15B, tie_word_embeddings=not opts.untied), bos_token_id=1, eos_token_id=1,
                         pad_token_id=0)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(model_dir)  # fp32 on disk, as an SFT checkpoint is loaded
    toy_task.build_tokenizer().save_pretrained(model_dir)  # one character a token: prompts of ~1000 tokens
    rows = [{"problem": " ".join(f"{i}+{i}" for i in range(j, j + 240))[:990], "answer": "2"} for j in range(400)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    total = torch.cuda.get_device_properties(0).total_memory / 1e9
    torch.cuda.set_per_process_memory_fraction(min(1.0, opts.gpu_gb / total))
    share = config_module.PRESETS["1.5b"]["vllm_gpu_memory_utilization"]
    aside = int(share * opts.gpu_gb * 1e9) if opts.hold_vllm_share else 0
    vllm_share = torch.empty(aside, dtype=torch.uint8, device="cuda")  # noqa: F841 (held, never read)
    print(f"emulating a {opts.gpu_gb:.0f} GB GPU on {total:.0f} GB; held aside for vLLM: {aside / 1e9:.0f} GB",
          flush=True)
    run_dir = train.main(["--model", str(model_dir), "--data", str(data), "--preset", "1.5b", "--rollout", "hf",
                          "--user-suffix", "", "--steps", str(opts.steps), "--prompts-per-step", str(opts.prompts),
                          "--eval-problems", "8", "--eval-samples", "1", "--eval-every", "0",
                          "--max-memory-gb", str(opts.gpu_gb), "--out-dir", str(work / "runs"),
                          "--run-name", "preset-1.5b", "--save-every", "1000"])
    print(f"peak allocated {torch.cuda.max_memory_allocated() / 1e9:.2f} GB; "
          f"run folder {run_dir}", flush=True)


if __name__ == "__main__":
    main()
