#!/bin/bash
# Every GPU check in one command, sized for the machine this project can borrow: one H100 or H200 with
# torch, transformers and peft but no vLLM and no math-verify, no network, 15 minutes of GPU time in all,
# start-up included. So the whole script stops within BUDGET_S seconds (default 540: with 2-3 minutes of
# start-up, 12 minutes in all), no command runs longer than 8 minutes, and the checks run most important
# first, each writing its figures into $OUT as it goes: a run cut short still returns what it measured.
# A check that would start with less than 30 s left is skipped and listed in $OUT/skipped.txt.
#   1. bench_lora.py: one update of the 7b preset (two rank-64 adapters on a frozen bf16 base) on random
#      weights of Qwen2.5-Math-7B's shape: the measured peak against the estimate, tokens/s and MFU of
#      the reference pass and of the PRM and policy updates (lora7b.json),
#   2. the GPU-only tests (tests/test_gpu.py: also --offload-optimizer's moments on the CPU, the same update)
#      and the precision tests on CUDA (tests/test_precision.py: the first mini-batch's implicit reward
#      exactly 0 and ratio exactly 1, bf16 and fp32, also through DDP (NCCL) with gradient checkpointing,
#      and with --reference policy at T = 0.7),
#   3. bench_preset.py: two steps of --preset 1.5b at full lengths on random weights of the untied
#      DeepSeek-R1-Distill-Qwen-1.5B shape (1.78B) on an emulated 80 GB GPU (HF rollouts),
#   4. bench_microbatch.py at Qwen2.5-1.5B shapes in bf16: each pass's time, the policy update's TFLOP/s
#      and MFU, and train.py's memory estimate next to torch.cuda.max_memory_allocated, in every mode,
#   5. the embedded default loop on CUDA for 20 steps (its step-time split, and the memory line after its
#      first step: the estimate, beyond-tensor terms included, beside the allocator's peaks and the device's
#      own use from torch.cuda.mem_get_info).
# PRIME_TEST_CACHE: a folder holding the toy SFT checkpoint (optional; the shipped one is used otherwise).
#     OUT=gpu_out bash bench/run_gpu_checks.sh
set -o pipefail
OUT=${OUT:-gpu_out}
CACHE=${PRIME_TEST_CACHE:-.cache}
BUDGET_S=${BUDGET_S:-540}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
START=$SECONDS

# check NAME LIMIT_S COMMAND...: runs COMMAND with at most LIMIT_S seconds (fewer if the budget has
# fewer left), its output into $OUT/NAME.log as it comes, and a line in $OUT/done.txt when it ends
check() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - START)))
    if [ "$left" -lt 30 ]; then
        echo "$name: skipped, ${left}s of the budget left" | tee -a "$OUT/skipped.txt"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local began=$SECONDS
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v "it/s\]" > "$OUT/$name.log"
    echo "$name: exit ${PIPESTATUS[0]} after $((SECONDS - began))s (limit ${limit}s)" | tee -a "$OUT/done.txt"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__,
'peft', peft.__version__)" | tee -a "$OUT/gpu.txt"
check lora7b 240 python3 bench/bench_lora.py --out "$OUT/lora7b.json"
check tests 200 env PRIME_TEST_CACHE="$CACHE" python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu.py \
    tests/test_precision.py
check preset 150 python3 bench/bench_preset.py --gpu-gb 80 --steps 2 --untied
check microbatch 100 python3 bench/bench_microbatch.py --case qwen1.5b --gradient-checkpointing --precision bf16 \
    --micro-batch-size 1 --budget 8192 --rows 8
check toy 60 python3 train.py --steps 20 --rollout hf --cache-dir "$CACHE" --out-dir "$OUT/runs" --run-name gpu-toy
echo "all checks: $((SECONDS - START))s of ${BUDGET_S}s" | tee -a "$OUT/done.txt"
