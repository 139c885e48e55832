"""The embedded task: the noisy demonstrator, the chain lengths, and the diagnostics built on the exact
step checker (first wrong step, localisation), with values worked out by hand."""

import json
import random

import pytest
import torch

import step_prm
import toy_task


def written_values(solution: str) -> list[int]:
    return [int(line.split("=")[1]) for line in solution.split("\n")[:-1]]


def test_clean_demonstrator_writes_the_worked_solution():
    rng = random.Random(0)
    for p in toy_task.make_problems(300, seed=2):
        assert toy_task.demonstrate(p, rng, 0.0) == p.solution
        assert toy_task.check_steps(p.prompt, p.solution.split("\n")) == [1.0] * (len(p.ops) + 1)


def test_a_slip_is_a_wrong_value_near_the_right_one_and_the_chain_carries_on():
    rng = random.Random(1)
    for p in toy_task.make_problems(300, seed=3):
        text = toy_task.demonstrate(p, rng, 1.0)  # every step slips
        lines = text.split("\n")
        values = written_values(text)
        prev = p.first
        for (op, b), line, v in zip(p.ops, lines, values):
            assert line.startswith(f"{prev}{op}{b}=")  # each line starts from the line before
            right = toy_task.apply(op, prev, b)
            assert v != right and abs(v - right) <= 9
            # kept in [0, 99], unless an earlier slip carried the chain so far out that nothing near is
            assert 0 <= v <= 99 or not any(0 <= u <= 99 for u in range(right - 9, right + 10))
            prev = v
        assert lines[-1] == f"\\boxed{{{values[-1]}}}"  # the box holds the last written value
        scores = toy_task.check_steps(p.prompt, lines)
        assert scores == [0.0] * len(p.ops) + [1.0]  # the checker marks every slipped line, box consistent
        assert p.answer == str(toy_task.gold_values(p.first, [(o, str(b)) for o, b in p.ops])[-1])


def test_one_slip_by_hand():
    # "(7+5)*3": a slip on step 1 only. Find a seed whose first draw slips and second does not.
    p = toy_task.Problem(prompt="(7+5)*3\n", answer="36", solution="7+5=12\n12*3=36\n\\boxed{36}",
                         first=7, ops=(("+", 5), ("*", 3)))
    rng = random.Random(4)
    text = toy_task.demonstrate(p, rng, 0.5)
    rng = random.Random(4)
    slipped = rng.random() < 0.5
    assert slipped  # seed 4: step 1 slips
    wrong = rng.choice([v for v in range(3, 22) if v != 12])
    second = rng.random() < 0.5
    assert not second
    assert text == f"7+5={wrong}\n{wrong}*3={wrong * 3}\n\\boxed{{{wrong * 3}}}"
    assert toy_task.check_steps(p.prompt, text.split("\n")) == [0.0, 1.0, 1.0]


def test_slip_rate_and_chain_lengths():
    rng = random.Random(5)
    problems = toy_task.make_problems(2000, seed=6, min_ops=3, max_ops=6)
    assert {len(p.ops) for p in problems} == {3, 4, 5, 6}
    slips = steps = 0
    for p in problems:
        scores = toy_task.check_steps(p.prompt, toy_task.demonstrate(p, rng, 0.15).split("\n"))
        slips += scores[:-1].count(0.0)
        steps += len(p.ops)
    assert 0.14 < slips / steps < 0.16  # 9000 steps: one standard error is 0.004
    assert {len(p.ops) for p in toy_task.make_problems(50, seed=1, min_ops=2, max_ops=2)} == {2}


@pytest.mark.parametrize("text, expected", [("3-6", (3, 6)), ("4", (4, 4)), ("1-12", (1, 12))])
def test_parse_ops(text, expected):
    assert toy_task.parse_ops(text) == expected


@pytest.mark.parametrize("text", ["6-3", "0-2", "a-b", "1-2-3", "", "3-13"])
def test_parse_ops_rejects(text):
    with pytest.raises(ValueError, match="MIN-MAX"):
        toy_task.parse_ops(text)


def test_heldout_problems_follow_the_chain_length_and_not_the_slip():
    short = toy_task.heldout_problems(40, (2, 4))
    assert all(2 <= len(p.ops) <= 4 for p in short)
    assert toy_task.heldout_problems(40, (2, 4)) == short  # fixed


# ---------------------------------------------------------------------------------------------------
# First wrong step and localisation (step_prm)
# ---------------------------------------------------------------------------------------------------


def test_first_wrong_steps_by_hand():
    # row 0: 3 steps [1, 0, 0] -> 1; row 1: 2 steps [1, 1] (+ a padded 0 column) -> -1;
    # row 2: 3 steps [0, 1, 1] -> 0; row 3: empty response (no step ids) -> -1
    scores = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    step_ids = torch.tensor([[0, 1, 2, 2], [0, 0, 1, -1], [0, 1, 2, -1], [-1, -1, -1, -1]])
    assert step_prm.first_wrong_steps(scores, step_ids).tolist() == [1, -1, 0, -1]


def test_step_localization_by_hand():
    reward = torch.tensor([[0.1, -0.5, 0.2, 0.3, 9.0],     # sums [0.1, -0.3, 0.3]: blamed 1
                           [-0.2, -0.1, 0.4, -0.4, 0.0],   # sums [-0.3, 0.4, -0.4]: blamed 2
                           [0.5, 0.5, 0.5, 0.5, -7.0],     # sums [1.0, 1.0] (padding -7 ignored): tie -> 0
                           [-1.0, 0.0, 0.0, 0.0, 0.0]])   # not counted (first wrong -1)
    step_ids = torch.tensor([[0, 1, 1, 2, -1], [0, 0, 1, 2, -1], [0, 0, 1, 1, -1], [0, 1, 1, 1, -1]])
    first_wrong = torch.tensor([1, 0, 0, -1])
    assert step_prm.step_localization(reward, step_ids, first_wrong) == (2, 3)  # rows 0 and 2 hit
    # a step that holds no token never wins, even though its (empty) sum 0 is below the others
    reward = torch.tensor([[0.5, 0.2, 0.3]])
    assert step_prm.step_localization(reward, torch.tensor([[0, 2, 2]]), torch.tensor([0])) == (1, 1)
    assert step_prm.step_localization(reward, torch.tensor([[-1, -1, -1]]), torch.tensor([0])) == (0, 0)


def test_localization_of_real_toy_tokens_against_a_plain_loop():
    tok = toy_task.build_tokenizer()
    prompt = "((7+5)*3)-4\n"
    responses = ["7+5=12\n12*3=35\n35-4=31\n\\boxed{31}", "7+5=13\n13*3=39\n39-4=35\n\\boxed{35}"]
    encoded = [tok(r)["input_ids"] + [tok.eos_token_id] for r in responses]
    T = max(map(len, encoded))
    ids = torch.full((2, T), tok.pad_token_id)
    mask = torch.zeros(2, T, dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, :len(e)], mask[i, :len(e)] = torch.tensor(e), 1
    scores, step_ids = step_prm.step_scores_and_ids(step_prm.ToyStepChecker(), tok, [prompt] * 2, responses,
                                                    ids, mask)
    first_wrong = step_prm.first_wrong_steps(scores, step_ids)
    assert first_wrong.tolist() == [1, 0]
    g = torch.Generator().manual_seed(0)
    reward = torch.randn(2, T, generator=g)
    hits = 0
    for i in range(2):  # plain loop: sum per line of text, the most negative line
        sums = {}
        for t in range(int(mask[i].sum())):
            sums[step_ids[i, t].item()] = sums.get(step_ids[i, t].item(), 0.0) + reward[i, t].item()
        hits += min(sums, key=lambda s: (sums[s], s)) == first_wrong[i].item()
    assert step_prm.step_localization(reward, step_ids, first_wrong) == (hits, 2)


def test_step_localization_with_one_step_and_an_empty_batch():
    # a response of a single step (e.g. only a box): that step is blamed, a hit when it is the wrong one
    assert step_prm.step_localization(torch.tensor([[0.3, -0.2]]), torch.tensor([[0, 0]]), torch.tensor([0])) == (1, 1)
    empty = torch.zeros(0, 4)
    assert step_prm.step_localization(empty, empty.long(), torch.zeros(0, dtype=torch.long)) == (0, 0)


# --- the shipped SFT checkpoints (checkpoints/, SHA256SUMS) -----------------------------------------


def test_every_shipped_checkpoint_matches_its_hash_and_loads():
    """Every machine starts RL from the same bytes: the recipe's checkpoints ship in the repository."""
    from transformers import AutoModelForCausalLM
    hashes = toy_task.shipped_hashes()
    assert toy_task.checkpoint_name(toy_task.SFT_STEPS, 0, toy_task.DEFAULT_OPS, toy_task.DEFAULT_SLIP) in hashes
    for name, digest in hashes.items():
        path = toy_task.SHIPPED / name
        assert toy_task.folder_hash(path) == digest, name
        info = json.loads((path / "extra.json").read_text())["sft"]
        assert name == toy_task.checkpoint_name(info["steps"], info["seed"], tuple(info["ops"]), info["slip"])
        AutoModelForCausalLM.from_pretrained(path)


def test_sft_checkpoint_returns_the_shipped_folder_without_training(tmp_path):
    path = toy_task.sft_checkpoint(tmp_path, 0, log=lambda m: pytest.fail(f"trained: {m}"))
    assert path.parent == toy_task.SHIPPED and not any(tmp_path.iterdir())


def test_a_changed_shipped_checkpoint_is_an_error_naming_the_rebuild_command(tmp_path, monkeypatch):
    import shutil
    name = toy_task.checkpoint_name(toy_task.SFT_STEPS, 0, toy_task.DEFAULT_OPS, toy_task.DEFAULT_SLIP)
    copy = tmp_path / "checkpoints"
    shutil.copytree(toy_task.SHIPPED, copy)
    monkeypatch.setattr(toy_task, "SHIPPED", copy)
    assert toy_task.sft_checkpoint(tmp_path / "cache", 0) == copy / name  # an exact copy passes
    config = copy / name / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 3', '"num_hidden_layers": 2'))
    with pytest.raises(SystemExit, match="toy_task.py --ops 3-6 --slip 0.15 --steps 3000"):
        toy_task.sft_checkpoint(tmp_path / "cache", 0)


def test_the_default_start_writes_the_format_and_gets_the_arithmetic_right(tmp_path):
    """The start the README's figures begin from: greedy >= 0.95 on the 200 held-out problems
    (eval.py's toy benchmark, train.py's held-out set)."""
    import eval
    report = eval.main(["--model", str(toy_task.sft_checkpoint(toy_task.SHIPPED, 0)), "--benchmarks", "toy",
                        "--greedy", "--out", str(tmp_path / "eval.json")])
    assert report["benchmarks"]["toy"]["pass@1"] >= 0.95


def test_a_fixed_length_sft_is_deterministic_and_uncached_settings_train_into_the_cache(tmp_path):
    logs = []
    first = toy_task.sft_checkpoint(tmp_path / "a", 3, ops=(2, 3), log=logs.append)
    second = toy_task.sft_checkpoint(tmp_path / "b", 3, ops=(2, 3), log=logs.append)
    assert first.parent == tmp_path / "a" and len(logs) > 2
    # the same weights (extra.json records the seconds each build took, so the folders differ there)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    count = len(logs)
    assert toy_task.sft_checkpoint(tmp_path / "a", 3, ops=(2, 3), log=logs.append) == first
    assert len(logs) == count  # cached: not trained again
