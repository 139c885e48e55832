#!/bin/bash
# Every GPU check in one command, sized for the machine this project can borrow: one H100 or H200 with
# torch, transformers and peft but no vLLM and no math-verify, no network, 15 minutes of GPU time in all,
# start-up included. So the whole script ends within BUDGET_S seconds (default 540: with 2-3 minutes of
# start-up, 12 minutes in all): each check runs under `timeout -k 10` with at most what the budget has
# left, less the 10 s grace, and one that would start with under 30 s left is skipped. The checks run
# most important first, and $OUT holds two files, rewritten as each check ends, so a run cut short still
# returns what it measured:
#   checks.log        every check's command, output and exit status, in order
#   gpu_checks.json   every figure (bench/gpu_report.py gathers them from the checks' own files)
# The checks (CHECKS picks some; TOY_STEPS shortens the last):
#   lora7b      bench_lora.py: one update of the 7b preset (two rank-64 adapters on a frozen bf16 base) on
#               random weights of Qwen2.5-Math-7B's shape: the measured peak against the estimate, tokens/s
#               and MFU of the reference pass and of the PRM and policy updates,
#   tests       the GPU-only tests (tests/test_gpu.py: also --offload-optimizer's moments on the CPU) and the
#               exact pairings on CUDA: tests/test_precision.py (the first mini-batch's implicit reward
#               exactly 0 and ratio exactly 1, bf16 and fp32, through DDP over NCCL with checkpointing, and
#               with --reference policy at T = 0.7) and tests/test_lora.py's (LoRA's step-1 reward exactly 0
#               in CUDA bf16 through DDP; an update of one adapter leaving the other and the base
#               bit-identical), on the toy model's small shape,
#   preset      bench_preset.py: two steps of --preset 1.5b at full lengths on random weights of the untied
#               DeepSeek-R1-Distill-Qwen-1.5B shape (1.78B) on an emulated 80 GB GPU (HF rollouts),
#   microbatch  bench_microbatch.py at Qwen2.5-1.5B shapes in bf16: each pass's time, the policy update's
#               TFLOP/s and MFU, and the memory estimate next to torch.cuda.max_memory_allocated,
#   toy         the embedded default loop on CUDA (its step-time split, and the memory line after its first
#               step: the estimate beside the allocator's peaks and torch.cuda.mem_get_info's count).
# PRIME_TEST_CACHE: a folder holding the toy SFT checkpoint (optional; the shipped one is used otherwise).
#     OUT=gpu_out bash bench/run_gpu_checks.sh
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
CACHE=${PRIME_TEST_CACHE:-.cache}
BUDGET_S=${BUDGET_S:-540}
CHECKS=${CHECKS:-lora7b tests preset microbatch toy}
TOY_STEPS=${TOY_STEPS:-20}
GRACE_S=10
mkdir -p "$OUT"
WORK=$(mktemp -d)  # the checks' own files: gpu_report.py reads them, and they go when the script ends
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT/checks.log"
: > "$LOG"
export PYTHONUNBUFFERED=1
START=$SECONDS

report() {
    python3 bench/gpu_report.py "$WORK" "$OUT/gpu_checks.json" >> "$LOG" 2>&1
}

# check NAME LIMIT_S COMMAND...: runs COMMAND (if CHECKS names it) with at most LIMIT_S seconds, fewer if
# the budget has fewer left; its output into the log as it comes, and its exit status and seconds into
# $WORK/status.tsv; then the JSON is written again
check() {
    local name=$1 limit=$2
    shift 2
    case " $CHECKS " in *" $name "*) ;; *) return ;; esac
    local left=$((BUDGET_S - (SECONDS - START) - GRACE_S))
    if [ "$left" -lt 30 ]; then
        echo "== $name: skipped, ${left}s of the budget left" >> "$LOG"
        printf '%s\tskipped\t0\t0\n' "$name" >> "$WORK/status.tsv"
        report
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (at most ${limit}s): $*" >> "$LOG"
    local began=$SECONDS
    timeout -k "$GRACE_S" "$limit" "$@" 2>&1 | grep --line-buffered -v "it/s\]" | tee "$WORK/$name.log" >> "$LOG"
    local status=${PIPESTATUS[0]}
    echo "== $name: exit $status after $((SECONDS - began))s" >> "$LOG"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - began))" "$limit" >> "$WORK/status.tsv"
    report
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -c "import peft; print('peft', peft.__version__)" 2>&1 | tail -1; } > "$WORK/gpu.txt"
cat "$WORK/gpu.txt" >> "$LOG"
check lora7b 240 python3 bench/bench_lora.py --out "$WORK/lora7b.json"
check tests 200 env PRIME_TEST_CACHE="$CACHE" python3 -m pytest -q -s -p no:cacheprovider --junitxml="$WORK/tests.xml" \
    tests/test_gpu.py tests/test_precision.py \
    tests/test_lora.py::test_step_one_reward_is_exactly_zero_through_ddp_with_gradient_checkpointing \
    tests/test_lora.py::test_each_update_moves_its_own_adapter_and_leaves_the_other_and_the_base_bit_identical
check preset 150 python3 bench/bench_preset.py --gpu-gb 80 --steps 2 --untied --out "$WORK/preset"
check microbatch 100 python3 bench/bench_microbatch.py --case qwen1.5b --gradient-checkpointing --precision bf16 \
    --micro-batch-size 1 --budget 8192 --rows 8 --out "$WORK/microbatch.json"
check toy 120 python3 train.py --steps "$TOY_STEPS" --rollout hf --cache-dir "$CACHE" --out-dir "$WORK/runs" \
    --run-name gpu-toy
echo "all checks: $((SECONDS - START))s of ${BUDGET_S}s" >> "$LOG"
report
