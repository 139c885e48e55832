#!/bin/bash
# Every GPU check in one command, for a GPU session with a few minutes to spend (about 8 minutes on an
# H200; give it a 9-minute timeout and keep room for a rerun):
#   1. the GPU-only tests (tests/test_gpu.py: also --offload-optimizer's moments on the CPU, the same update)
#      and the precision tests on CUDA (tests/test_precision.py: the first mini-batch's implicit reward
#      exactly 0 and ratio exactly 1, bf16 and fp32, also through DDP (NCCL) with gradient checkpointing,
#      and with --reference policy at T = 0.7),
#   2. bench_microbatch.py at Qwen2.5-1.5B shapes in bf16 and fp32: each pass's time, the policy update's
#      TFLOP/s and MFU, and train.py's memory estimate next to torch.cuda.max_memory_allocated, in every mode,
#   3. bench_preset.py: two steps of --preset 1.5b at full lengths on random weights of the untied
#      DeepSeek-R1-Distill-Qwen-1.5B shape (1.78B) on an emulated 80 GB GPU (HF rollouts),
#   4. the embedded default loop on CUDA for 20 steps (its step-time split, and the memory line after its
#      first step: the estimate, beyond-tensor terms included, beside the allocator's peaks and the device's
#      own use from torch.cuda.mem_get_info),
#   5. bench_gpu.py: rollout tokens/s of HF generate at 0.5B shapes (vLLM too when it is installed).
# Logs go to $OUT (default gpu_out/). PRIME_TEST_CACHE / --cache-dir: a folder holding the toy SFT
# checkpoint (optional; the shipped one is used otherwise).
#     bash bench/run_gpu_checks.sh
set -o pipefail
OUT=${OUT:-gpu_out}
CACHE=${PRIME_TEST_CACHE:-.cache}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    | tee -a "$OUT/gpu.txt"
PRIME_TEST_CACHE=$CACHE timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu.py tests/test_precision.py \
    2>&1 | tee "$OUT/tests.log"
for precision in bf16 fp32; do
    timeout 150 python3 bench/bench_microbatch.py --case qwen1.5b --gradient-checkpointing --precision $precision \
        --micro-batch-size 1 --budget 8192 --rows 8 2>&1 | grep -v "it/s" | grep -v '^[][{} "]' | tee -a "$OUT/bench_microbatch.log"
done
timeout 200 python3 bench/bench_preset.py --gpu-gb 80 --steps 2 --untied 2>&1 | grep -v "it/s\]" \
    | grep -E "emulating|memory|peak|held-out|time per step|Error|error" | tee "$OUT/preset.log"
timeout 90 python3 train.py --steps 20 --rollout hf --cache-dir "$CACHE" --out-dir "$OUT/runs" \
    --run-name gpu-toy 2>&1 | grep -v "it/s\]" | grep -E "memory|held-out|time per step|training reward" \
    | tee "$OUT/toy.log"
timeout 100 python3 bench/bench_gpu.py --rollout hf --prompts 32 --n 4 --prompt-len 256 --response-len 512 \
    --steps 3 2>&1 | grep -v "it/s" | tee "$OUT/bench_hf.log"
if python3 -c "import vllm" 2>/dev/null; then
    timeout 200 python3 bench/bench_gpu.py --rollout vllm --prompts 32 --n 4 --prompt-len 256 --response-len 512 \
        --steps 3 2>&1 | tee "$OUT/bench_vllm.log"
fi
