"""What a node needs beyond one process: the same run whatever the number of ranks (the batch statistics
are the whole batch's), a checkpoint that survives a kill at any point of its save, and a process
group that is destroyed whenever one was made. Ranks are gloo processes on this CPU (torchrun)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ddp
import runlog
import toy_task
import verify
from conftest import SFT_STEPS, free_port
from models import Models
from rollout import HFRollout

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import world_size_worker  # noqa: E402


def assert_same(a, b, tol):
    """max |a - b| / max |b| over a list of tensors, below tol."""
    worst = max(((x - y).abs().max() / y.abs().max().clamp(min=1e-12)).item() for x, y in zip(a, b))
    assert worst < tol, worst


@pytest.fixture(scope="module")
def global_batch(cache_dir, tmp_path_factory):
    """16 real responses of the toy SFT model (4 prompts x 4, unequal lengths, some right, some wrong)
    with a float64 process signal: one global batch to split over 1 and 2 ranks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(4)
    problems = toy_task.make_problems(4, seed=21, min_ops=2, max_ops=7)
    sampler = HFRollout(model, tokenizer, max_new_tokens=64, temperature=1.0)
    ro = sampler.generate([tokenizer(p.prompt)["input_ids"] for p in problems], n=4)
    texts = sampler.decode(ro)
    scores = verify.score_batch(texts, [p.answer for p in problems for _ in range(4)], ["math"] * 16)
    outcome = torch.tensor([s.reward for s in scores], dtype=torch.float32)
    outcome[4:8] = torch.tensor([1.0, 0.0, 1.0, 0.0])  # rank 0's one group is a mixed one, whatever was sampled
    gen = torch.Generator().manual_seed(6)
    signal = torch.randn(ro.response_ids.shape, generator=gen, dtype=torch.float64) * ro.response_mask
    formats = torch.tensor([s.format for s in scores], dtype=torch.float32)
    lengths = ro.response_mask.sum(1)
    assert lengths[4:8].max() < lengths.max(), "rank 0's share (group 1) must be narrower than the batch"
    saved = dict(rollout=ro, outcome=outcome, signal=signal, formats=formats, model=str(path))
    file = tmp_path_factory.mktemp("world") / "batch.pt"
    torch.save(saved, file)
    return saved, file


def test_one_rank_and_two_unequal_ranks_give_the_same_advantages_and_update(global_batch, tmp_path):
    """The same global batch on one rank and split 4 rows / 12 rows over two gloo ranks, for every
    estimator that whitens or normalises over the batch: every row's advantage agrees to the
    round-off of the estimator's dtype, and the policy's (PPO's critic's, the LoRA adapter's) SGD step to the round-off of the float32
    log-probs (prime.token_logprobs). Before the statistics were summed over ranks, each rank whitened
    and normalised its own share: the advantages of a split batch differed by whole units."""
    saved, file = global_batch
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port",
                           str(free_port()), str(REPO / "tests" / "world_size_worker.py"), str(file), str(tmp_path / "rank")],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    whole = world_size_worker.run(saved, ddp.Dist())
    for name in world_size_worker.ESTIMATORS:
        one = whole[name]
        for part in ranks:
            mine = part[name]
            position = [one["rows"].tolist().index(r) for r in mine["rows"].tolist()]
            expected = one["adv"][position]
            width = mine["adv"].shape[1]
            assert (expected[:, width:] == 0).all()  # the columns past this rank's widest response
            # round-off only: the sums run over the same ~600 tokens in another order, in the estimator's
            # dtype (RLOO, GRPO, REINFORCE compute in float32, PASS in the signal's float64)
            tol = 64 * torch.finfo(mine["adv"].dtype).eps * expected.abs().max().item()
            torch.testing.assert_close(mine["adv"], expected[:, :width], rtol=0, atol=tol, msg=name)
            assert_same(mine["policy_delta"], one["policy_delta"], 1e-5)
            if one["critic_delta"]:
                assert_same(mine["critic_delta"], one["critic_delta"], 1e-5)
        assert one["adv"].abs().max() > 0.1, name  # a real advantage, not zeros compared with zeros
        # the update's health metrics (runlog.health_metrics) are the whole batch's on every rank
        for part in ranks:
            for key, value in one["health"].items():
                got = part[name]["health"][key]
                assert (got is None) == (value is None), (name, key)
                if value is not None:
                    assert got == pytest.approx(value, rel=1e-4, abs=1e-6), (name, key)
        assert one["health"]["actor/entropy"] > 0 and one["health"]["actor/grad_norm"] > 0, name
        assert one["health"]["response_length/max"] == saved["rollout"].response_mask.sum(1).max()


def test_whole_batch_statistics_by_hand_with_two_equal_shares():
    """Two ranks holding the same share: the whole batch is the share twice, so its mean is the
    share's and its unbiased variance sum_sq * 2 / (2n - 1); its largest return is the share's."""
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0]], dtype=torch.float64)
    twice = lambda t: 2 * t  # noqa: E731 (what Dist.sum returns when the other rank holds the same)
    import prime
    got = prime.whiten(x, mask, eps=0.0, sum_over_ranks=twice)
    mean, sq = 2.5, (1.5 ** 2 + 0.5 ** 2 + 0.5 ** 2 + 1.5 ** 2)
    expected = (x - mean) / (2 * sq / 7) ** 0.5 * mask
    torch.testing.assert_close(got, expected)
    alone = prime.whiten(x, mask, eps=0.0)
    torch.testing.assert_close(alone, (x - mean) / (sq / 3) ** 0.5 * mask)
    # the normaliser: returns-to-go of row 0 are 6, 5, 3; the largest over both ranks is still 6
    torch.testing.assert_close(prime.normalize_process_reward(x, mask, max_over_ranks=lambda t: t),
                               x * mask / (6 + 1e-6))
    torch.testing.assert_close(prime.normalize_process_reward(x, mask, max_over_ranks=lambda t: t * 0 + 12.0),
                               x * mask / (12 + 1e-6))


# --------------------------------------------------------------------------- a kill during a save


class Killed(Exception):
    """Raised where a kill would have stopped the save: what is on disk then is what a kill leaves."""


def tiny_models(seed: int) -> Models:
    """Real (small) models and optimisers with state, as Models holds them."""
    torch.manual_seed(seed)
    policy, prm = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    models = Models("", None, policy, torch.optim.AdamW(policy.parameters()), prm=prm,
                    prm_opt=torch.optim.AdamW(prm.parameters()))
    for model, opt in ((policy, models.policy_opt), (prm, models.prm_opt)):  # optimiser state exists
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    return models


def test_a_kill_at_each_point_of_a_save_leaves_a_complete_checkpoint(tmp_path, monkeypatch):
    """A save writes files, makes a link and renames it, removes the old folder: kill it before each of
    these in turn. Every time, --resume loads a whole checkpoint, the old step's or the new one's, and
    the next save leaves exactly one checkpoint folder."""
    run_dir, d = tmp_path / "run", ddp.Dist()
    run_dir.mkdir()
    old, new = tiny_models(1), tiny_models(2)
    runlog.save_checkpoint(run_dir, 10, old, d)
    operations = {"torch.save": (torch, "save"), "os.symlink": (os, "symlink"), "os.replace": (os, "replace"),
                  "shutil.rmtree": (shutil, "rmtree"), "Path.mkdir": (Path, "mkdir")}
    kill_at, seen = 0, []
    while True:
        calls = []
        with monkeypatch.context() as patch:
            for label, (owner, name) in operations.items():
                real = getattr(owner, name)

                def counted(*a, _real=real, _label=label, **k):
                    calls.append(_label)
                    if len(calls) > kill_at:
                        raise Killed(_label)
                    return _real(*a, **k)
                patch.setattr(owner, name, counted)
            try:
                runlog.save_checkpoint(run_dir, 20, new, d)
                finished = True
            except Killed:
                finished = False
        seen.append(calls[-1] if not finished else "done")
        loaded = tiny_models(3)
        step = runlog.load_checkpoint(run_dir, loaded, d)
        source = {10: old, 20: new}[step]
        for a, b in ((loaded.policy, source.policy), (loaded.prm, source.prm)):
            for x, y in zip(a.state_dict().values(), b.state_dict().values()):
                assert torch.equal(x, y)
        assert loaded.policy_opt.state_dict()["state"][0]["step"] == source.policy_opt.state_dict()["state"][0]["step"]
        if finished:
            break
        kill_at += 1
        runlog.save_checkpoint(run_dir, 10, old, d)  # back to the old checkpoint for the next kill
    # every kind of step was interrupted once at least, and the kill after the switch resumes the new step
    assert {"torch.save", "os.symlink", "os.replace", "shutil.rmtree"} <= set(seen), seen
    runlog.save_checkpoint(run_dir, 30, new, d)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint", "checkpoint-30"]
    assert sorted(p.name for p in (run_dir / "checkpoint").iterdir()) == ["rng_rank0.pt", "state.pt"]


def recorded_moves(monkeypatch, models) -> list:
    """Every optimizer load and every move of AdamW's moments (runlog.optimizer_state_to), in order, as
    (what, optimizer's name, device); the moves go to the meta device, which only a move puts a tensor
    on, so which tensors went where is checked too."""
    events = []
    names = {id(models.policy_opt): "policy", id(models.prm_opt): "prm"}
    move = runlog.optimizer_state_to
    monkeypatch.setattr(runlog, "optimizer_state_to", lambda opt, device: (
        events.append(("move", names[id(opt)], str(device))), move(opt, "meta"))[1])
    for opt in (models.policy_opt, models.prm_opt):
        load = opt.load_state_dict
        monkeypatch.setattr(opt, "load_state_dict", lambda state, _load=load, _opt=opt: (
            events.append(("load", names[id(_opt)], None)), _load(state))[1])
    return events


def test_resume_with_offloading_moves_each_models_moments_right_after_its_own_load(tmp_path, monkeypatch):
    """--resume --offload-optimizer: each optimizer's moments go to the CPU as soon as that optimizer is
    loaded, before the next one loads, so one model's moments at most are ever on the GPU (loaded all
    first, the policy's and the PRM's would sit there together: +28 GB on the untied 1.5B)."""
    run_dir, d = tmp_path / "run", ddp.Dist()
    run_dir.mkdir()
    runlog.save_checkpoint(run_dir, 10, tiny_models(1), d)
    loaded = tiny_models(2)
    events = recorded_moves(monkeypatch, loaded)
    runlog.load_checkpoint(run_dir, loaded, d, offload_optimizer=True)
    assert events == [("load", "policy", None), ("move", "policy", "cpu"), ("load", "prm", None), ("move", "prm", "cpu")]
    for opt in (loaded.policy_opt, loaded.prm_opt):
        for state in opt.state.values():  # the moments moved, the step counts stayed
            assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta and not state["step"].is_meta
    plain = tiny_models(3)
    events = recorded_moves(monkeypatch, plain)
    runlog.load_checkpoint(run_dir, plain, d)
    assert [e[0] for e in events] == ["load", "load"]  # without offloading nothing moves


def test_an_offloaded_update_brings_the_moments_before_its_first_step_and_returns_them_after_its_last(monkeypatch):
    """microbatch.run_update with --offload-optimizer: to the update's device before the first optimizer
    step, to the CPU after the last (both mutants, never bringing them back or leaving them on the GPU,
    change this sequence)."""
    import config
    import microbatch
    from rollout import Rollout
    events = []
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters())
    step = opt.step
    monkeypatch.setattr(opt, "step", lambda *a, **k: (events.append(("step", None)), step(*a, **k))[1])
    monkeypatch.setattr(microbatch, "optimizer_state_to", lambda o, device: events.append(("move", str(device))))
    args = config.Args(offload_optimizer=True, mini_batches=2, micro_batch_size=2, max_tokens_per_micro_batch=0)
    ro = Rollout(torch.ones(4, 2, dtype=torch.long), torch.ones(4, 2, dtype=torch.long),
                 torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.bool))
    d = ddp.Dist(device=torch.device("meta"))  # the update's device, told apart from the CPU the moments wait on
    plan = microbatch.plan_update(ro, 4, args, d)
    microbatch.run_update(model, opt, lambda mb: model(torch.ones(len(mb.rows), 3)).sum(), lambda mb: len(mb.rows),
                          plan, args, d, 1.0)
    assert events == [("move", "meta"), ("step", None), ("step", None), ("move", "cpu")], events


def test_keep_checkpoints_leaves_every_step_loadable_and_resume_reads_the_newest(tmp_path):
    run_dir, d = tmp_path / "run", ddp.Dist()
    run_dir.mkdir()
    saved = {step: tiny_models(step) for step in (10, 20, 30)}
    for step, models in saved.items():
        runlog.save_checkpoint(run_dir, step, models, d, keep=True)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint", "checkpoint-10", "checkpoint-20",
                                                         "checkpoint-30"]
    assert runlog.load_checkpoint(run_dir, tiny_models(99), d) == 30  # --resume: the newest
    for step, source in saved.items():
        loaded = tiny_models(99)
        assert runlog.load_checkpoint(run_dir, loaded, d, name=f"checkpoint-{step}") == step
        for a, b in ((loaded.policy, source.policy), (loaded.prm, source.prm)):
            for x, y in zip(a.state_dict().values(), b.state_dict().values()):
                assert torch.equal(x, y)
    runlog.save_checkpoint(run_dir, 40, tiny_models(40), d)  # without keep: the older ones go
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint", "checkpoint-40"]


def test_resume_reads_a_run_folder_written_before_checkpoints_were_links(tmp_path):
    """A run folder whose checkpoint/ is a plain folder (an earlier version): resume reads it, and the
    next save replaces it with a link, keeping a complete checkpoint on disk throughout."""
    run_dir, d = tmp_path / "run", ddp.Dist()
    run_dir.mkdir()
    runlog.save_checkpoint(run_dir, 5, tiny_models(1), d)
    target = run_dir / os.readlink(run_dir / "checkpoint")
    (run_dir / "checkpoint").unlink()
    target.rename(run_dir / "checkpoint")  # the old layout
    assert runlog.load_checkpoint(run_dir, tiny_models(3), d) == 5
    runlog.save_checkpoint(run_dir, 6, tiny_models(2), d)
    assert (run_dir / "checkpoint").is_symlink() and runlog.load_checkpoint(run_dir, tiny_models(3), d) == 6
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint", "checkpoint-6"]


def test_torchrun_with_one_rank_destroys_its_process_group(cache_dir, tmp_path):
    """`torchrun --nproc_per_node=1` is a world of one with a real process group: train.py must destroy
    it (NCCL warns at exit otherwise). tests/ddp_exit_probe.py prints a line when it is destroyed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--master_port", str(free_port()),
           str(REPO / "tests" / "ddp_exit_probe.py"), "--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS),
           "--out-dir", str(tmp_path), "--run-name", "one", "--steps", "2", "--eval-problems", "8",
           "--prompts-per-step", "4", "--eval-every", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("DDP models alive at destroy_process_group: 0") == 1, proc.stdout[-2000:]
    assert "destroy_process_group() was not called" not in proc.stderr, proc.stderr[-2000:]
