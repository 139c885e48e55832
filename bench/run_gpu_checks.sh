#!/bin/bash
# Every GPU check in one command, for a GPU session with a few minutes to spend:
#   1. the GPU-only tests (tests/test_gpu.py),
#   2. bench_gpu.py: per-phase time, tokens/s and peak memory of a 0.5B-shaped Qwen2 (HF rollouts;
#      vLLM too when it is installed),
#   3. the embedded default loop on CUDA for 20 steps (its step-time split, and the memory estimate
#      next to the measured peak after its first step),
#   4. bench_microbatch.py at Qwen2.5-1.5B shapes: fixed vs token-budget micro-batches, and
#      train.py's memory estimate next to torch.cuda.max_memory_allocated.
# Logs go to $OUT (default gpu_out/). PRIME_TEST_CACHE / --cache-dir: a folder holding the toy SFT
# checkpoint, to skip its CPU warm-up (optional).
#     bash bench/run_gpu_checks.sh
set -o pipefail
OUT=${OUT:-gpu_out}
CACHE=${PRIME_TEST_CACHE:-.cache}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee -a "$OUT/gpu.txt"
PRIME_TEST_CACHE=$CACHE timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/tests.log"
timeout 200 python3 bench/bench_gpu.py --rollout hf --prompts 32 --n 4 --prompt-len 256 --response-len 512 \
    --steps 3 2>&1 | grep -v "it/s" | tee "$OUT/bench_hf.log"
if python3 -c "import vllm" 2>/dev/null; then
    timeout 300 python3 bench/bench_gpu.py --rollout vllm --prompts 32 --n 4 --prompt-len 256 --response-len 512 \
        --steps 3 2>&1 | tee "$OUT/bench_vllm.log"
fi
timeout 150 python3 train.py --steps 20 --rollout hf --sft-steps 300 --cache-dir "$CACHE" --out-dir "$OUT/runs" \
    --run-name gpu-toy 2>&1 | grep -v "it/s\]" | grep -E "memory|held-out|time per step|training reward" \
    | tee "$OUT/toy.log"
timeout 240 python3 bench/bench_microbatch.py --case qwen1.5b 2>&1 | grep -v "it/s" | tee "$OUT/bench_microbatch.log"
