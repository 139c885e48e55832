"""--lora-rank: the policy and the implicit PRM as two LoRA adapters (PEFT) on one frozen base that, with
the adapters off, is the reference (models.with_adapters, models.Adapter). Each property a test that
fails when it breaks: the step-1 reward exactly 0, each update touching its own adapter alone, the base
bit-identical through a run, the LoRA forward and gradients equal to a hand-written W + (alpha/r) B A,
an exact kill-and-resume from a checkpoint of adapters only. (One rank against two: tests/
test_distributed.py; vLLM getting the adapter: tests/test_rollout_vllm.py.)"""

import hashlib
import json
import socket
import sys
from pathlib import Path

import pytest
import torch

import config
import ddp
import microbatch
import models as models_module
import train
from conftest import SFT_STEPS
from rollout import Rollout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_precision import DEVICES, batch_of  # noqa: E402
from test_train import kill_and_resume, metrics_of, train_here  # noqa: E402


def on_device(batch, d):
    """batch_of's batch with its outcome and mask on the run's device (the rollout moves per micro-batch)."""
    batch.outcome, batch.mask = batch.outcome.to(d.device), batch.mask.to(d.device)
    return batch


def lora_args(cache_dir, *flags):
    return config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--rollout", "hf",
                              "--lora-rank", "4", *flags])


def digest(tensors) -> str:
    """sha256 of the tensors' bytes, in order: equal only if every bit is."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def base_of(models) -> list[torch.Tensor]:
    """The frozen base's tensors (every parameter and buffer of the shared model but the adapters')."""
    shared = ddp.unwrap(models.policy).shared
    return [t for k, t in [*shared.named_parameters(), *shared.named_buffers()] if ".lora_" not in k]


def adapter_of(model) -> list[torch.Tensor]:
    return list(ddp.unwrap(model).parameters())


def test_one_base_holds_policy_prm_and_reference_with_only_the_adapters_trainable(cache_dir):
    args = lora_args(cache_dir)
    models = models_module.build_models(args, ddp.Dist())
    shared = models.policy.shared
    assert models.prm.shared is shared and models.reference.shared is shared  # no second or third copy
    assert list(models.reference.parameters()) == []
    names = [k for k, p in shared.named_parameters() if p.requires_grad]
    assert names and all(".lora_" in k for k in names)  # the base is frozen
    adapted = {k.split(".lora_")[0].rsplit(".", 1)[1] for k in names}
    assert adapted == set(models_module.LORA_TARGETS)  # every linear layer of the blocks, and nothing else
    assert not any("embed" in k or "lm_head" in k for k in names)
    assert {id(p) for p in models.policy.parameters()}.isdisjoint({id(p) for p in models.prm.parameters()})
    assert [id(p) for g in models.policy_opt.param_groups for p in g["params"]] == \
        [id(p) for p in models.policy.parameters()]  # each optimizer holds its own adapter alone


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_step_one_reward_is_exactly_zero_through_ddp_with_gradient_checkpointing(precision, temperature, device,
                                                                                 cache_dir):
    """At step 1 both adapters are B = 0, so pi_phi = pi_ref bit for bit on the first mini-batch: the PRM's
    forward (with its graph, through DDP, recomputed in the backward) and the reference's (the base with
    the adapters off) agree exactly, in fp32 and in bf16 (the base then held in bf16), at the sampling
    temperature 1 and 0.7 (the reference pass is at 1, as the PRM's); on CPU, and on a GPU in CUDA's own
    kernels over NCCL (bench/run_gpu_checks.sh). The second mini-batch follows the PRM's first update, so
    its rewards move: the check is not vacuous."""
    import torch.distributed as dist
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.TCPStore("127.0.0.1", port, 1, True),
                            rank=0, world_size=1)
    try:
        args = lora_args(cache_dir, "--precision", precision, "--mini-batches", "2", "--gradient-checkpointing",
                         "--max-tokens-per-micro-batch", "160", "--temperature", str(temperature))
        d = ddp.Dist(device=torch.device(device))
        models = models_module.build_models(args, d)
        assert isinstance(models.prm, torch.nn.parallel.DistributedDataParallel)
        base_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
        assert all(t.dtype == base_dtype and t.device.type == device
                   for t in base_of(models) if t.is_floating_point() and t.dim() == 2)
        assert all(p.dtype == torch.float32 for p in models.prm.parameters())  # fp32 adapters
        b = on_device(batch_of(models), d)
        b = train.with_plans(b, args, d)
        logp_old = microbatch.logprobs_no_grad(ddp.unwrap(models.policy), b.rollout, args, args.temperature, b.plan)
        logp_ref = train.reference_logprobs(args, models, b, logp_old)
        reward, _ = train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d)
        first = torch.cat([mb.rows for mb in b.prm_plan[0]])
        later = torch.cat([mb.rows for mb in b.prm_plan[1]])
        assert reward[first].abs().max().item() == 0.0
        assert reward[later].abs().max().item() > 0
    finally:
        import gc
        del models
        gc.collect()  # no DDP model may outlive the group (pytorch#56297)
        dist.destroy_process_group()


@pytest.mark.parametrize("device", DEVICES)
def test_each_update_moves_its_own_adapter_and_leaves_the_other_and_the_base_bit_identical(device, cache_dir):
    """On CPU in fp32; on a GPU (bench/run_gpu_checks.sh) in CUDA bf16, the base then held in bf16."""
    args = lora_args(cache_dir, "--policy-lr", "1e-2", "--prm-lr", "1e-2", "--precision",
                     "bf16" if device == "cuda" else "fp32")
    d = ddp.Dist(device=torch.device(device))
    models = models_module.build_models(args, d)
    b = train.with_plans(on_device(batch_of(models), d), args, d)
    base, policy, prm = digest(base_of(models)), digest(adapter_of(models.policy)), digest(adapter_of(models.prm))
    adv = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(1)).to(d.device) * b.mask
    train.update_policy(args, models, b, None, adv, None, d)
    assert digest(adapter_of(models.policy)) != policy
    assert digest(adapter_of(models.prm)) == prm and digest(base_of(models)) == base
    policy = digest(adapter_of(models.policy))
    logp_ref = microbatch.logprobs_no_grad(models.reference, b.rollout, args, plan=b.prm_plan)
    if device == "cpu":  # the reference is the SFT model, to the bit (fp32)
        from transformers import AutoModelForCausalLM
        sft = AutoModelForCausalLM.from_pretrained(models.path, dtype=torch.float32)
        assert torch.equal(logp_ref, microbatch.logprobs_no_grad(sft, b.rollout, args, plan=b.prm_plan))
    train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d)
    assert digest(adapter_of(models.prm)) != prm
    assert digest(adapter_of(models.policy)) == policy and digest(base_of(models)) == base


def test_the_base_at_the_end_of_a_run_is_bit_identical_to_its_start(cache_dir, tmp_path, monkeypatch):
    """A whole run (sampling, the PRM and policy updates, the held-out evaluation, checkpoints, the final
    save): the shared model's base ends with the bytes of the SFT checkpoint it was loaded from."""
    built = []
    monkeypatch.setattr(train, "build_models", lambda a, d: built.append(models_module.build_models(a, d)) or built[-1])
    threads = torch.get_num_threads()
    try:
        train_here(["--steps", "3", "--save-every", "2", "--lora-rank", "4", "--policy-lr", "1e-2", "--prm-lr",
                    "1e-2", "--run-name", "lora", "--rollout", "hf"], cache_dir, tmp_path)
    finally:
        torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM
    start = AutoModelForCausalLM.from_pretrained(built[0].path, dtype=torch.float32)
    names = [k for k, _ in [*start.named_parameters(), *start.named_buffers()]]
    ended = dict([*built[0].policy.shared.get_base_model().named_parameters(),
                  *built[0].policy.shared.get_base_model().named_buffers()])
    ended = {k.replace(".base_layer", ""): v for k, v in ended.items() if ".lora_" not in k}
    assert sorted(ended) == sorted(names)
    assert digest(ended[k] for k in names) == digest(t for _, t in [*start.named_parameters(), *start.named_buffers()])
    moved = digest(adapter_of(built[0].policy))
    assert moved != digest(torch.zeros_like(p) for p in adapter_of(built[0].policy))  # it did train
    # final/ is the policy's adapter on its base: eval.py loads it unmerged, with the trained numbers
    import eval as evaluation
    final = tmp_path / "lora" / "final"
    assert Path(evaluation.adapter_base(str(final))) == Path(built[0].path).resolve()  # absolute: loads from anywhere
    loaded = {k.replace(".default.", ".policy."): v for k, v in evaluation.load_model(str(final)).named_parameters()
              if ".lora_" in k}
    trained = {k: v for k, v in built[0].policy.shared.named_parameters() if ".lora_" in k and ".policy." in k}
    assert loaded.keys() == trained.keys() and all(torch.equal(loaded[k], trained[k]) for k in trained)


def tiny_lm(dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config_ = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          tie_word_embeddings=False)
    return Qwen2ForCausalLM(config_).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name, checkpointing", [("policy", False), ("prm", True)])
def test_a_lora_step_equals_a_hand_written_w_plus_scaled_ba(name, checkpointing, dtype):
    """The loss (a weighted sum of response log-probs) and its gradients with respect to every A and B,
    through models.Adapter, against a plain forward of the same model whose every target weight is
    W + (alpha / r) B A (torch.func.functional_call), with both adapters' A and B random (B is 0 at the
    start, where A's gradient would be 0 too). The PRM's adapter with gradient checkpointing: its layers
    recompute their forward in the backward, which must see the PRM's adapter, not the policy's. The
    two sides differ in where a sum is split (x W^T + s (x A^T) B^T against x (W + s B A)^T): fp32
    round-off of sums over 48 terms, and fp64's."""
    args = config.Args(lora_rank=4, lora_alpha=8.0, process="implicit")
    plain = tiny_lm(dtype)
    shared = models_module.with_adapters(tiny_lm(dtype), args)
    if checkpointing:
        shared.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = models_module.Adapter(shared, name)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in [p for k, p in shared.named_parameters() if ".lora_" in k]:
            p.copy_(0.2 * torch.randn(p.shape, generator=generator, dtype=torch.float64))
    assert all(p.dtype == dtype for p in policy.parameters())
    ids = torch.randint(0, 40, (3, 12), generator=generator)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # a left-padded prompt
    response_mask = torch.ones(3, 8, dtype=torch.long)
    response_mask[2, 5:] = 0  # a short response
    ro = Rollout(ids[:, :4] * mask[:, :4], mask[:, :4], ids[:, 4:] * response_mask, response_mask,
                 torch.zeros(3, dtype=torch.bool))
    weights = torch.randn(3, 8, generator=generator, dtype=torch.float64).to(dtype)

    loss = (microbatch.response_logprobs(policy, ro).to(dtype) * weights).sum()
    loss.backward()

    scale = args.lora_alpha / args.lora_rank
    leaves, effective = {}, {}
    for k, p in policy.shared.named_parameters():
        if f".lora_A.{name}." in k:
            module = k.split(".lora_A.")[0].replace("base_model.model.", "", 1).replace(".base_layer", "")
            a = p.detach().clone().requires_grad_(True)
            b = dict(policy.shared.named_parameters())[k.replace("lora_A", "lora_B")].detach().clone().requires_grad_(True)
            leaves[k], leaves[k.replace("lora_A", "lora_B")] = a, b
            effective[module + ".weight"] = dict(plain.named_parameters())[module + ".weight"] + scale * b @ a
    assert len(effective) == 2 * len(models_module.LORA_TARGETS)

    class HandWritten(torch.nn.Module):
        device = torch.device("cpu")

        def forward(self, **kwargs):
            return torch.func.functional_call(plain, effective, args=(), kwargs=kwargs)

    expected = (microbatch.response_logprobs(HandWritten(), ro).to(dtype) * weights).sum()
    expected.backward()
    eps = torch.finfo(dtype).eps
    tol = 48 * eps * 16  # sums over 48 terms, through two layers, a softmax and a log
    assert abs(loss.item() - expected.item()) <= tol * abs(expected.item())
    named = dict(policy.shared.named_parameters())
    for k, leaf in leaves.items():
        torch.testing.assert_close(named[k].grad, leaf.grad, rtol=tol, atol=tol * leaf.grad.abs().max().item())
    assert max(leaf.grad.abs().max().item() for leaf in leaves.values()) > 1e-3  # real gradients
    others = [p for k, p in shared.named_parameters() if ".lora_" in k and f".{name}." not in k]
    assert others and all(p.grad is None for p in others)  # the other adapter took no part


def test_kill_and_resume_is_exact_from_a_checkpoint_of_adapters_only(cache_dir, tmp_path, capsys, monkeypatch):
    args = ["--steps", "4", "--save-every", "2", "--lora-rank", "4", "--policy-lr", "5e-4", "--prm-lr", "3e-3",
            "--rollout", "hf"]
    out = kill_and_resume(args, cache_dir, tmp_path, capsys, monkeypatch)
    saved = torch.load(tmp_path / "full" / "checkpoint" / "state.pt", weights_only=False)
    for model in ("policy", "prm"):
        assert saved[model] and all(":lora_" in k for k in saved[model]), model  # adapters, no base weight
        assert len(saved[f"{model}_opt"]["state"]) == len(saved[model])  # AdamW's moments of those alone
    size = (tmp_path / "full" / "checkpoint" / "state.pt").stat().st_size
    adapter_numel = sum(t.numel() for m in ("policy", "prm") for t in saved[m].values())
    print(f"checkpoint state.pt: {size / 1e6:.2f} MB for 2 x {adapter_numel // 2} adapter parameters "
          f"(weights and AdamW's two moments, fp32)")
    assert size < 3 * 4 * adapter_numel + 200_000  # no base weights (the toy base alone is 3.2 MB)
    assert "resumed" in out and "MB of models and optimizers)" in out  # the run prints its checkpoint's size
    assert metrics_of(tmp_path / "killed") == metrics_of(tmp_path / "full")


@pytest.mark.parametrize("flags, message", [
    (["--estimator", "ppo"], "--lora-rank 4 with --estimator ppo"),
    (["--prm-init", "teacher"], "--lora-rank 4 with --prm-init teacher"),
    (["--lora-rank", "-1"], "--lora-rank -1: must be >= 0"),
    (["--lora-alpha", "0"], "--lora-alpha 0.0: must be > 0"),
])
def test_what_lora_cannot_do_is_refused_before_any_weight_loads(flags, message, capsys):
    with pytest.raises(SystemExit):
        config.parse_args(["--lora-rank", "4", *flags])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("process", ["gopd", "step"])
def test_a_teacher_and_a_step_scorer_run_beside_the_adapters(process, cache_dir, tmp_path):
    """G-OPD's teacher is a model of its own (frozen, loaded whole), its base the shared base with the
    adapters off; a step scorer is its own too: each run trains and ends."""
    threads = torch.get_num_threads()
    try:
        run = train_here(["--steps", "2", "--lora-rank", "4", "--process", process, "--run-name", process,
                          "--rollout", "hf"], cache_dir, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(metrics_of(run)) == 2


def test_the_prm_adapter_learns_to_tell_right_from_wrong(cache_dir):
    """The PRM adapter learns: after a few CE updates on one batch, its implicit reward of the right
    responses exceeds that of the wrong ones (the same batch, the loss going down)."""
    args = lora_args(cache_dir, "--prm-lr", "3e-3")
    d = ddp.Dist()
    models = models_module.build_models(args, d)
    b = train.with_plans(batch_of(models), args, d)
    logp_ref = microbatch.logprobs_no_grad(models.reference, b.rollout, args, plan=b.prm_plan)
    losses = [train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d)[1][0] for _ in range(6)]
    reward, _ = train.implicit_prm_step(models.prm, models.prm_opt, b, logp_ref, args, d, update=False)
    score = (reward * b.mask).sum(1)  # Eq. 3's sequence score, up to beta
    assert losses[-1] < losses[0]
    assert score[b.outcome == 1].mean() > score[b.outcome == 0].mean()


def test_the_gpu_check_script_leaves_two_files_and_a_json_of_every_check(tmp_path, cache_dir):
    """bench/run_gpu_checks.sh on CPU: with no budget every check is skipped and listed; with the toy loop
    alone (1 step), its step-time split reaches the JSON. Either way $OUT holds the log and the JSON
    and nothing else (the checks' own files stay in a work folder that goes with the script)."""
    import json
    import subprocess
    repo = Path(__file__).resolve().parents[1]

    def run(out, **env):
        proc = subprocess.run(["bash", str(repo / "bench" / "run_gpu_checks.sh")], capture_output=True, text=True,
                              timeout=600, env={**__import__("os").environ, "OUT": str(out),
                                                "PRIME_TEST_CACHE": str(cache_dir), **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert sorted(p.name for p in out.iterdir()) == ["checks.log", "gpu_checks.json"]
        return json.loads((out / "gpu_checks.json").read_text()), (out / "checks.log").read_text()

    report, log = run(tmp_path / "none", BUDGET_S="0")
    assert list(report["checks"]) == ["lora7b", "tests", "preset", "microbatch", "toy"]
    assert all(c["exit"] == "skipped" for c in report["checks"].values()) and "== toy: skipped" in log
    report, log = run(tmp_path / "toy", CHECKS="toy", TOY_STEPS="1", BUDGET_S="400")
    toy = report["checks"]["toy"]
    assert list(report["checks"]) == ["toy"] and toy["exit"] == 0, log[-3000:]
    assert toy["summary"]["steps"] == 1 and set(toy["summary"]["step_seconds"]) >= {"rollout", "prm", "policy"}
    assert toy["memory"] is None  # a CPU run prints no GPU memory line
    assert "== toy (at most" in log and "== toy: exit 0" in log and report["device"]


def test_the_gpu_check_of_a_7b_lora_update_runs_its_code_on_a_small_shape(tmp_path):
    """bench/bench_lora.py (the GPU check of the 7b preset's update) end to end on CPU at a tiny shape,
    so that the script the GPU machine runs is the code the tests run: every stage written, every pass
    timed, the estimate beside it."""
    import json
    import subprocess
    out = tmp_path / "lora.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "bench_lora.py"),
                           "--shape", "tiny", "--rows", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["stage"] == "memory" and report["lora_rank"] == 64
    for k in ("reference", "prm_update", "policy_update"):
        assert report[k]["seconds"] > 0 and report[k]["tokens_per_second"] > 0
    assert report["estimated_state_plus_update_gb"] > 0


def test_resume_refuses_other_adapter_settings_naming_the_flag_before_any_weight_loads(cache_dir, tmp_path,
                                                                                     monkeypatch):
    """A checkpoint's adapters fit the rank, alpha, target modules and base they were built with: --resume
    with another value stops at the run folder, naming the flag and both values, before a weight loads
    (another alpha would rescale the adapters silently, another rank fail on a tensor shape)."""
    threads = torch.get_num_threads()
    try:
        train_here(["--steps", "1", "--lora-rank", "4", "--run-name", "lora", "--rollout", "hf", "--eval-every", "0"],
                   cache_dir, tmp_path)
        monkeypatch.setattr(models_module, "load_model_and_tokenizer",
                            lambda *a: pytest.fail("a weight was loaded before the check"))
        for flags, message in ((["--lora-alpha", "16"], "--lora-alpha 32.0, this command gives 16.0"),
                               (["--lora-rank", "8"], "--lora-rank 4, this command gives 8"),
                               (["--lora-rank", "0"], "--lora-rank 4, this command gives 0")):
            with pytest.raises(SystemExit, match="--resume: the checkpoint's adapters were built with " + message):
                train_here(["--steps", "2", "--lora-rank", "4", "--run-name", "lora", "--rollout", "hf", "--resume",
                            *flags], cache_dir, tmp_path)
    finally:
        torch.set_num_threads(threads)
    saved = json.loads((tmp_path / "lora" / "config.json").read_text())
    assert saved["lora_targets"] == list(models_module.LORA_TARGETS)
    same = config.parse_args(["--lora-rank", "4", "--resume", "--run-name", "lora", "--rollout", "hf", "--out-dir",
                              str(tmp_path)])
    models_module.check_same_adapters({**saved, "model": ""}, same)  # the same settings: passes
    with pytest.raises(SystemExit, match="--lora-targets"):
        models_module.check_same_adapters({**saved, "model": "", "lora_targets": ["q_proj"]}, same)


def test_a_rank_vllm_cannot_hold_is_refused_at_the_command_line():
    import rollout
    assert config.VLLM_MAX_LORA_RANK == max(rollout.LORA_SLOT_RANKS)
    with pytest.raises(config.ConfigError, match="--lora-rank 1024: vLLM 0.32 holds adapters of rank 512 at most"):
        config.check_args(config.Args(lora_rank=1024, rollout="vllm"))
    config.check_args(config.Args(lora_rank=1024, rollout="hf"))  # HF generate has no such limit


def test_final_records_an_absolute_base_so_it_loads_from_any_folder(tmp_path, monkeypatch):
    """A relative --model (here "base", from the folder the run started in) is written into final/'s
    adapter config as an absolute path: eval.py --model runs/NAME/final then works from anywhere."""
    import eval as evaluation
    from transformers import AutoModelForCausalLM
    tiny_lm(torch.float32).save_pretrained(tmp_path / "base")
    monkeypatch.chdir(tmp_path)
    base = AutoModelForCausalLM.from_pretrained("base")
    adapter = models_module.Adapter(models_module.with_adapters(base, config.Args(lora_rank=2, process="none")), "policy")
    adapter.save_pretrained(tmp_path / "final")
    recorded = json.loads((tmp_path / "final" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str((tmp_path / "base").resolve())
    monkeypatch.chdir("/")
    assert evaluation.adapter_base(str(tmp_path / "final")) == recorded
    assert any(".lora_" in k for k, _ in evaluation.load_model(str(tmp_path / "final")).named_parameters())
