"""Step-level process rewards (step_prm.py, toy_task.check_steps): checker, step->token map, HF PRM."""

import types

import pytest
import torch

import step_prm
import toy_task
import verify


# ---------------------------------------------------------------------------------------------------
# The exact step checker of the embedded task
# ---------------------------------------------------------------------------------------------------

PROMPT = "((7+5)*3)-4\n"  # 7+5=12, 12*3=36, 36-4=32


@pytest.mark.parametrize("lines, expected", [
    (["7+5=12", "12*3=36", "36-4=32", "\\boxed{32}"], [1, 1, 1, 1]),           # the worked solution
    (["7+5=13", "13*3=39", "39-4=35", "\\boxed{35}"], [0, 1, 1, 1]),           # one slip, then consistent
    (["7+5=12", "12*3=36", "36-4=31", "\\boxed{31}"], [1, 1, 0, 1]),           # last step wrong
    (["7+6=13", "13*3=39", "39-4=35", "\\boxed{35}"], [0, 1, 1, 1]),           # wrong operand copied
    (["7+5=12", "12+3=15", "15-4=11", "\\boxed{11}"], [1, 0, 1, 1]),           # wrong operator, right sum
    (["7+5=12", "12*3=36", "36-4=32", "\\boxed{36}"], [1, 1, 1, 0]),           # box disagrees with the work
    (["7+5=12", "12*3=36", "\\boxed{36}"], [1, 1, 0]),                          # box one step early
    (["7+5=12", "12*3=36", "36-4=32", "32+1=33", "\\boxed{33}"], [1, 1, 1, 0, 0]),  # an extra step
    (["7+5=12", "12*3=36", "36-4=32"], [1, 1, 1]),                              # no box (outcome is 0)
    (["7+5=12", "12*=36", "36-4=32", "\\boxed{32}"], [1, 0, 1, 1]),            # unreadable: next judged
    (["7+5=12", "11*3=33", "33-4=29", "\\boxed{29}"], [1, 0, 1, 1]),           # does not follow line 1
])
def test_check_steps_on_hand_made_solutions(lines, expected):
    assert toy_task.check_steps(PROMPT, lines) == [float(x) for x in expected]


def test_check_steps_accepts_every_generated_solution():
    for p in toy_task.make_problems(200, seed=3):
        scores = toy_task.check_steps(p.prompt, p.solution.split("\n"))
        assert scores == [1.0] * len(p.solution.split("\n")), (p.prompt, p.solution)


def test_toy_checker_scores_responses_split_at_newlines():
    checker = step_prm.ToyStepChecker()
    assert checker.score([PROMPT, "4-1\n"], ["7+5=12\n12*3=35\n35-4=31\n\\boxed{31}", "4-1=3\n\\boxed{3}"]) == \
        [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0]]


def test_chain_checker_scores_every_line_of_a_chains_response():
    """--step-scorer chains (data.py chains files): one score per line, by hand: a sum line as
    data.chain_steps marks it, the boxed line 1 when it holds the running total the response reached,
    any other line 0; the question may carry train.py's boxed suffix."""
    checker = step_prm.load_step_scorer("chains")
    question = "What is 7 + 5 + 8?\n\nPresent the answer in LaTex format: \\boxed{Your answer}"
    responses = ["7 + 5 = 12\n12 + 8 = 20\nThe answer is $\\boxed{20}$.",
                 "7 + 5 = 13\n13 + 8 = 21\nThe answer is $\\boxed{21}$.",   # slip, carried on, boxed its own total
                 "7 + 5 = 12\n12 + 8 = 20\nThe answer is $\\boxed{21}$.",   # boxes a total it did not reach
                 "First add.\n7 + 5 = 12\n12 + 9 = 21\nSo $\\boxed{21}$"]   # a line of words, a wrong number
    assert checker.score([question] * 4, responses) == [[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0],
                                                        [0.0, 1.0, 0.0, 1.0]]
    assert checker.separator == "\n"
    assert len(step_prm.step_texts(responses[3], checker.separator)) == 4  # one score per step the token map sees
    # a two-digit sums answer as the policies write it, with a sentence's stop: a right step, not a line of words
    assert checker.score(["What is 43 + 45?"] * 2, ["43 + 45 = 88.", "43 + 45 = 89."]) == [[1.0], [0.0]]


def padded_rollout(tok, responses: list[str]):
    """The responses as a Rollout's right-padded response_ids and response_mask, each ending in EOS."""
    encoded = [tok(r)["input_ids"] + [tok.eos_token_id] for r in responses]
    T = max(map(len, encoded))
    ids, mask = torch.full((len(encoded), T), tok.pad_token_id), torch.zeros(len(encoded), T, dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, :len(e)], mask[i, :len(e)] = torch.tensor(e), 1
    return types.SimpleNamespace(response_ids=ids, response_mask=mask)


def test_checker_steps_finds_the_first_wrong_line_of_a_chains_batch_and_no_checker_elsewhere():
    """step_prm.checker_steps, what train.py's localisation and episodes read: on a chains batch each
    token's line (by hand, one token a character with the toy tokenizer) and the first line
    ChainStepChecker marks wrong; on other --data no checker; on the embedded task ToyStepChecker's."""
    tok = toy_task.build_tokenizer()
    question = "What is 7 + 5 + 8?\n\nPresent the answer in LaTex format: \\boxed{Your answer}"
    responses = ["7+5=13\n13+8=21\n\\boxed{21}",     # slips at line 0
                 "7+5=12\n12+8=20\n\\boxed{20}",     # right
                 "7+5=12\n12+8=21\n\\boxed{21}"]     # slips at line 1
    ro = padded_rollout(tok, responses)
    mask = ro.response_mask
    step_ids, first_wrong = step_prm.checker_steps(tok, [question] * 3, responses, ro, embedded=False)
    assert first_wrong.tolist() == [0, -1, 1]
    # row 1 by hand: "7+5=12\n" is line 0 (7 tokens), "12+8=20\n" line 1 (8), "\\boxed{20}" line 2
    # (the toy tokenizer's \\boxed{ is one token: 4 tokens), then the EOS, which is in no line
    row = step_ids[1, :int(mask[1].sum())].tolist()
    assert row[:7] == [0] * 7 and row[7:15] == [1] * 8 and row[15:-1] == [2] * (len(row) - 16)
    assert (step_ids[mask == 0] == -1).all()
    assert step_prm.checker_steps(tok, ["How many legs has a cat?"] * 3, responses, ro, embedded=False) == (None, None)
    toy_steps, toy_first = step_prm.checker_steps(tok, ["((7+5)*3)-4\n"], ["7+5=13\n13*3=39"], types.SimpleNamespace(
        response_ids=torch.tensor([tok("7+5=13\n13*3=39")["input_ids"]]),
        response_mask=torch.ones(1, len(tok("7+5=13\n13*3=39")["input_ids"]), dtype=torch.long)), embedded=True)
    assert toy_first.tolist() == [0]


def test_right_with_wrong_step_counts_right_answers_whose_slips_cancel():
    """step_prm.right_with_wrong_step, train.py's right_with_wrong_step metric: by hand, then on the
    chains checker's verdicts of real responses."""
    assert step_prm.right_with_wrong_step(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([-1, 2, 0, 0])) == (2, 3)
    assert step_prm.right_with_wrong_step(torch.tensor([0.0, 0.5]), torch.tensor([1, 0])) == (0, 0)  # none right
    assert step_prm.right_with_wrong_step(torch.tensor([]), torch.tensor([], dtype=torch.long)) == (0, 0)
    tok = toy_task.build_tokenizer()
    question = "What is 75 + 24 + 44?\n\nPresent the answer in LaTex format: \\boxed{Your answer}"
    responses = ["75+24=109\n109+44=143\n\\boxed{143}",  # 75 + 24 is 99: two slips of 10 cancel, 143 is right
                 "75+24=99\n99+44=143\n\\boxed{143}",    # right on every line
                 "75+24=99\n99+44=153\n\\boxed{153}"]    # a slip at line 1, a wrong answer
    ro = padded_rollout(tok, responses)
    _, first_wrong = step_prm.checker_steps(tok, [question] * 3, responses, ro, embedded=False)
    assert first_wrong.tolist() == [0, -1, 1]
    outcome = torch.tensor([float(verify.math_reward(r, "143")) for r in responses])
    assert outcome.tolist() == [1.0, 1.0, 0.0]
    assert step_prm.right_with_wrong_step(outcome, first_wrong) == (1, 2)


def test_checker_diagnostics_count_the_training_rows_only():
    """step_prm.checker_diagnostics, train.py's localized / wrong / right_slipped / right counts, by hand.
    Rows: 0 wrong, first wrong step 1; 1 right through a wrong step 0; 2 right and clean; 3 wrong, first
    wrong step 0; 4 a row past n_train (wrong, a wrong step 0) that no count may see."""
    signal = torch.tensor([[0.2, -0.5, -0.1, 0.0],   # step sums [0.2, -0.6]: blames step 1 (hit)
                           [-0.9, 0.1, 0.0, 0.0],
                           [0.1, 0.1, 0.1, 0.1],
                           [0.3, -0.1, -0.4, 0.0],   # step sums [0.3, -0.5]: blames step 1, first wrong 0 (miss)
                           [-1.0, 0.0, 0.0, 0.0]])
    step_ids = torch.tensor([[0, 1, 1, -1], [0, 0, 1, -1], [0, 1, -1, -1], [0, 1, 1, -1], [0, 1, -1, -1]])
    first_wrong = torch.tensor([1, 0, -1, 0, 0])
    outcome = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.0])
    assert step_prm.checker_diagnostics(signal, step_ids, first_wrong, outcome, 4) == (1, 2, 1, 2)
    assert step_prm.checker_diagnostics(signal, step_ids, first_wrong, outcome, 5) == (2, 3, 1, 2)  # row 4: a hit
    assert step_prm.checker_diagnostics(None, step_ids, first_wrong, outcome, 4) == (0, 0, 1, 2)  # outcome-only
    assert step_prm.checker_diagnostics(signal, None, None, outcome, 4) == (0, 0, 0, 0)  # no checker


@pytest.mark.parametrize("local, first_only", [
    ([1, 0, 1, 0, 1], [1, 0, 1, 1, 1]),   # two slips: only the first stays wrong
    ([0, 0, 0], [0, 1, 1]),               # every line wrong: the first one
    ([1, 1, 1, 1], [1, 1, 1, 1]),         # a right response is untouched
    ([1, 1, 1, 0], [1, 1, 1, 0]),         # only the box wrong
])
def test_first_wrong_line_checker_keeps_only_the_first_wrong_line(local, first_only):
    """--step-scorer toy-first: the local checker's scores (by hand) with every wrong line after the
    first one marked right; every wrong response then has the same number of 0s (one)."""
    # a chain of +1 operations whose lines follow `local`: a slip writes one too many, a wrong box 5
    ops = len(local) - 1
    prompt = "7" + "+1" * ops + "\n"
    lines, prev = [], 7
    for k in range(ops):
        c = prev + 1 + (0 if local[k] else 1)
        lines.append(f"{prev}+1={c}")
        prev = c
    lines.append(f"\\boxed{{{prev + (0 if local[-1] else 5)}}}")
    response = "\n".join(lines)
    assert step_prm.ToyStepChecker().score([prompt], [response]) == [[float(x) for x in local]]
    assert step_prm.ToyFirstStepChecker().score([prompt], [response]) == [[float(x) for x in first_only]]
    assert isinstance(step_prm.load_step_scorer("toy-first"), step_prm.ToyFirstStepChecker)


def test_step_noise_lands_on_each_response_own_steps_only():
    """--step-noise: scores + sd x N(0, 1) from a generator seeded by `seed` alone, on real steps; the
    padded columns (past a response's last step) stay 0. Checked against the same draws by a loop."""
    scores = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])  # row 1 has 2 steps: column 2 is padding
    step_ids = torch.tensor([[0, 0, 1, 2, 2], [0, 1, 1, -1, -1]])
    noisy = step_prm.add_step_noise(scores, step_ids, 0.5, seed=11)
    draws = torch.randn(2, 3, generator=torch.Generator().manual_seed(11))
    for i, n_steps in enumerate([3, 2]):
        for k in range(3):
            expected = scores[i, k] + (0.5 * draws[i, k] if k < n_steps else 0.0)
            assert noisy[i, k].item() == pytest.approx(expected.item(), abs=1e-6)
    assert torch.equal(noisy, step_prm.add_step_noise(scores, step_ids, 0.5, seed=11))  # a resumed run: the same
    assert not torch.equal(noisy, step_prm.add_step_noise(scores, step_ids, 0.5, seed=12))
    assert torch.equal(step_prm.add_step_noise(scores, step_ids, 0.0, seed=11), scores)


# ---------------------------------------------------------------------------------------------------
# Steps and the step of each policy token
# ---------------------------------------------------------------------------------------------------


def test_step_spans_cover_the_text_and_never_leave_an_empty_step():
    assert step_prm.step_spans("a\n\nb\n\n\n\nc", "\n\n") == [(0, 3), (3, 8), (8, 9)]
    assert step_prm.step_spans("\n\nx\n\n", "\n\n") == [(0, 5)]       # leading blanks join step 1
    assert step_prm.step_spans("x\n\ny\n\n", "\n\n") == [(0, 3), (3, 6)]  # trailing ones the last step
    assert step_prm.step_spans("", "\n") == [(0, 0)]
    assert step_prm.step_texts("a\n\n b \n\nc", "\n\n") == ["a", "b", "c"]


def test_step_spans_blank_and_whitespace_only_steps_and_trailing_whitespace():
    # a whitespace-only line is no step of its own: it joins the step after it
    assert step_prm.step_spans("a\n \nb", "\n") == [(0, 2), (2, 5)]
    assert step_prm.step_texts("a\n \nb", "\n") == ["a", "b"]
    # trailing whitespace after the last separator belongs to the last step
    assert step_prm.step_spans("a\nb\n  ", "\n") == [(0, 2), (2, 6)]
    assert step_prm.step_spans("a\nb  ", "\n") == [(0, 2), (2, 5)]
    # a text of only blanks and separators is one step
    assert step_prm.step_spans(" \n\t\n", "\n") == [(0, 4)]
    assert step_prm.step_texts("a\n \nb\n  ", "\n") == ["a", "b"]


class FirstStepsOnly(step_prm.ToyStepChecker):
    """The toy checker, keeping only the first `n` scores of each response: what a step PRM that
    found fewer step markers than the response has steps returns."""

    def __init__(self, n):
        self.n = n

    def score(self, questions, responses):
        return [s[:self.n] for s in super().score(questions, responses)]


def test_step_scores_and_ids_when_the_scorer_returns_fewer_scores_than_steps():
    tok = toy_task.build_tokenizer()
    response = "7+5=12\n12*3=35\n\\boxed{35}"  # 3 steps; the scorer returns 2 scores, then 0
    ids = tok(response)["input_ids"] + [tok.eos_token_id]
    T = len(ids)
    mask = torch.ones(1, T, dtype=torch.long)
    scores, step_ids = step_prm.step_scores_and_ids(FirstStepsOnly(2), tok, ["(7+5)*3\n"], [response],
                                                    torch.tensor([ids]), mask)
    assert scores.tolist() == [[1.0, 0.0]]
    # tokens of step 3 (the box and EOS) fall into the last scored step, 1
    assert step_ids[0].tolist() == [0] * 7 + [1] * (T - 7)
    scores, step_ids = step_prm.step_scores_and_ids(FirstStepsOnly(0), tok, ["(7+5)*3\n"], [response],
                                                    torch.tensor([ids]), mask)
    assert scores.tolist() == [[0.0]] and step_ids[0].tolist() == [0] * T  # no score: one zero step


def test_token_step_ids_with_steps_that_split_mid_token():
    # BPE pieces: "2\n1" straddles the boundary between step 0 and step 1; "" is an EOS
    pieces = ["7+5=1", "2\n1", "2*3=36", "\n\\", "boxed{36}", ""]
    assert step_prm.token_step_ids(pieces, "\n") == [0, 0, 1, 1, 2, 2]
    # a separator split over two tokens ("\n" + "\n") with blank-line steps
    pieces = ["Step one.", "\n", "\nStep", " two.", "\n\n", "Done"]
    assert step_prm.token_step_ids(pieces, "\n\n") == [0, 0, 0, 1, 1, 2]
    # by a plain loop: the step of each token is the number of step starts at or before its first char
    text = "".join(pieces)
    starts = [s for s, _ in step_prm.step_spans(text, "\n\n")]
    pos, expected = 0, []
    for piece in pieces:
        expected.append(sum(1 for s in starts if s <= pos) - 1)
        pos += len(piece)
    assert step_prm.token_step_ids(pieces, "\n\n") == expected


def test_step_ids_of_real_toy_tokens_cover_every_token_once():
    tok = toy_task.build_tokenizer()
    response = "7+5=12\n12*3=36\n36-4=32\n\\boxed{32}"
    ids = tok(response)["input_ids"] + [tok.eos_token_id]
    pieces = step_prm.response_pieces(tok, ids)
    assert "".join(pieces) == response
    step_ids = step_prm.token_step_ids(pieces, "\n")
    assert len(step_ids) == len(ids)
    lines = response.split("\n")
    expected = [k for k, line in enumerate(lines) for _ in range(len(line) + (k < len(lines) - 1))] + [3]
    assert step_ids == expected


def test_step_end_rewards_put_each_score_on_its_last_token():
    signal = torch.tensor([[.9, .9, .2, .2, 0.], [.5, .5, .5, 0., 0.]])
    step_ids = torch.tensor([[0, 0, 1, 1, -1], [0, 0, 0, -1, -1]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    out = step_prm.step_end_rewards(signal, step_ids, mask)
    assert out.tolist() == [[0.0, 0.8999999761581421, 0.0, 0.20000000298023224, 0.0], [0.0, 0.0, 0.5, 0.0, 0.0]]


def test_step_scores_and_ids_for_a_batch():
    tok = toy_task.build_tokenizer()
    responses = ["7+5=12\n12*3=35\n\\boxed{35}", "7+5=12\n\\boxed{12}"]
    encoded = [tok(r)["input_ids"] + [tok.eos_token_id] for r in responses]
    T = max(len(e) for e in encoded) + 2
    ids = torch.full((2, T), tok.pad_token_id)
    mask = torch.zeros(2, T, dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, :len(e)] = torch.tensor(e)
        mask[i, :len(e)] = 1
    scores, step_ids = step_prm.step_scores_and_ids(step_prm.ToyStepChecker(), tok, ["(7+5)*3\n", "(7+5)*3\n"],
                                                    responses, ids, mask)
    assert scores.tolist() == [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]  # row 2: box too early; padded with 0
    assert step_ids[0, :7].tolist() == [0] * 7 and step_ids[0, 7:15].tolist() == [1] * 8
    assert step_ids[0, len(encoded[0]) - 1].item() == 2          # EOS sits in the last step
    assert (step_ids[mask == 0] == -1).all()


# ---------------------------------------------------------------------------------------------------
# A Hugging Face step PRM (token classification, two labels), saved by the test
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForTokenClassification
    path = tmp_path_factory.mktemp("step_prm")
    tok = toy_task.build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<extra_0>"]})
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, num_labels=2,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen2ForTokenClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_hf_step_prm_reads_p_good_at_each_step_marker(tiny_prm):
    from transformers import AutoModelForTokenClassification, AutoTokenizer
    prm = step_prm.load_step_scorer(str(tiny_prm), separator="\n")
    question, response = "(7+5)*3\n", "7+5=12\n12*3=36\n\\boxed{36}"
    got = prm.score([question, question], [response, "7+5=12"])
    assert [len(g) for g in got] == [3, 1]
    # independently: build the input by hand and read softmax(logits)[1] at each marker
    tok = AutoTokenizer.from_pretrained(tiny_prm)
    model = AutoModelForTokenClassification.from_pretrained(tiny_prm).eval()
    marker = tok.convert_tokens_to_ids("<extra_0>")
    ids, positions = tok(question + "\n")["input_ids"], []
    for step in response.split("\n"):
        ids += tok(step)["input_ids"] + [marker]
        positions.append(len(ids) - 1)
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([ids])).logits.softmax(-1)[0, :, 1]
    assert got[0] == pytest.approx(probs[positions].tolist(), abs=1e-6)
    assert all(0.0 < p < 1.0 for p in got[0])
    # batched with right padding = one at a time
    assert prm.score([question], ["7+5=12"])[0] == pytest.approx(got[1], abs=1e-6)


def test_hf_step_prm_with_a_chat_template_finds_every_marker(tiny_prm):
    prm = step_prm.HFStepPRM(str(tiny_prm), separator="\n\n")
    prm.tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}")
    ids, positions = prm.encode("(7+5)*3", ["7+5=12", "12*3=36"])
    assert [ids[p] for p in positions] == [prm.marker_id, prm.marker_id] and len(positions) == 2
    assert len(prm.score(["(7+5)*3"], ["7+5=12\n\n12*3=36\n\n\\boxed{36}"])[0]) == 3


def test_hf_step_prm_bad_path_and_bad_marker(tiny_prm, tmp_path):
    with pytest.raises(SystemExit, match="--step-scorer"):
        step_prm.load_step_scorer(str(tmp_path / "nope"))
    with pytest.raises(SystemExit, match="not one token"):
        step_prm.HFStepPRM(str(tiny_prm), step_token="<no such marker>")


def test_load_step_scorer_toy_and_the_default_separator(tiny_prm):
    assert isinstance(step_prm.load_step_scorer("toy"), step_prm.ToyStepChecker)
    scorer = step_prm.load_step_scorer(str(tiny_prm))
    assert isinstance(scorer, step_prm.HFStepPRM) and scorer.separator == "\n\n" and scorer.device == "cpu"
    assert step_prm.load_step_scorer(str(tiny_prm), separator="\n").separator == "\n"


def test_step_end_rewards_ignore_valid_tokens_in_no_step():
    # token 2 is valid but belongs to no step (-1): it gets nothing, and step 0 still ends at token 1
    signal = torch.tensor([[.9, .9, .5, .2]])
    out = step_prm.step_end_rewards(signal, torch.tensor([[0, 0, -1, 1]]), torch.ones(1, 4))
    assert out.tolist() == [[0.0, pytest.approx(0.9), 0.0, pytest.approx(0.2)]]


@pytest.fixture(scope="module")
def bos_prm(tiny_prm, tmp_path_factory):
    """The tiny PRM with a tokenizer that adds a BOS token by default (as Llama-style tokenizers do)
    and a chat template with a generation prompt: the two ways a step PRM's input can pick up tokens
    that were not in the text."""
    from tokenizers import processors
    from transformers import AutoTokenizer
    path = tmp_path_factory.mktemp("bos_prm")
    tok = AutoTokenizer.from_pretrained(tiny_prm)
    tok.add_special_tokens({"bos_token": "<bos>"})
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", tok.convert_tokens_to_ids("<bos>"))])
    # roles as digits and the generation prompt as "=+=": characters the toy vocabulary has (letters
    # would all read as <unk>, and a wrong role name would go unseen)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}1{% elif m['role'] == 'user' %}2"
                         "{% elif m['role'] == 'assistant' %}3{% endif %}={{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}=+={% endif %}")
    tok.save_pretrained(path)
    from transformers import AutoModelForTokenClassification
    AutoModelForTokenClassification.from_pretrained(tiny_prm).save_pretrained(path)
    return path


def test_hf_step_prm_input_has_no_bos_inside_and_no_generation_prompt(bos_prm):
    """Pieces are tokenised without special tokens (a BOS before every step would shift the PRM's
    reading), and the chat template closes the assistant turn without a generation prompt."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(bos_prm)
    bos = tok.convert_tokens_to_ids("<bos>")
    assert tok("7")["input_ids"][0] == bos  # this tokenizer does add a BOS by default
    prm = step_prm.HFStepPRM(str(bos_prm), separator="\n")
    template = tok.chat_template
    prm.tokenizer.chat_template = None  # plain: question, newline, then each step and its marker
    ids, positions = prm.encode("(7+5)*3", ["7+5=12", "12*3=36"])
    plain = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    expected = plain("(7+5)*3\n") + plain("7+5=12") + [prm.marker_id] + plain("12*3=36") + [prm.marker_id]
    assert ids == expected and bos not in ids and positions == [len(plain("(7+5)*3\n7+5=12")),
                                                                len(expected) - 1]
    prm.tokenizer.chat_template = template  # templated: the text below, by hand
    ids, positions = prm.encode("(7+5)*3", ["7+5=12", "12*3=36"])
    text = f"1={prm.SYSTEM}\n2=(7+5)*3\n3=7+5=12<extra_0>12*3=36<extra_0>\n"
    assert ids == plain(text) and [ids[p] for p in positions] == [prm.marker_id] * 2
    assert len(tok.apply_chat_template([{"role": "user", "content": "1"}], add_generation_prompt=True)["input_ids"]) > \
        len(tok.apply_chat_template([{"role": "user", "content": "1"}])["input_ids"])  # a prompt it could have added


# A step PRM that ships its own model class, as Qwen2.5-Math-PRM does (Qwen2ForProcessRewardModel,
# loaded with trust_remote_code): a config class and a model class in the checkpoint folder, listed in
# config.json's auto_map. The model returns a plain tuple (logits first), not an output object.
CUSTOM_CONFIG = '''
from transformers import Qwen2Config


class ToyPRMConfig(Qwen2Config):
    model_type = "toy_step_prm"
'''
CUSTOM_MODEL = '''
import torch
from transformers import PreTrainedModel, Qwen2Model

from .configuration_toy_step_prm import ToyPRMConfig


class ToyProcessRewardModel(PreTrainedModel):
    config_class = ToyPRMConfig

    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.score = torch.nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return (self.score(hidden),)
'''


@pytest.fixture(scope="module")
def custom_code_prm(tiny_prm, tmp_path_factory):
    import json
    from transformers import AutoConfig, AutoModel, AutoTokenizer
    path = tmp_path_factory.mktemp("custom_prm")
    (path / "configuration_toy_step_prm.py").write_text(CUSTOM_CONFIG)
    (path / "modeling_toy_step_prm.py").write_text(CUSTOM_MODEL)
    config = AutoConfig.from_pretrained(tiny_prm).to_dict()
    config.update(model_type="toy_step_prm", architectures=["ToyProcessRewardModel"],
                  auto_map={"AutoConfig": "configuration_toy_step_prm.ToyPRMConfig",
                            "AutoModel": "modeling_toy_step_prm.ToyProcessRewardModel"})
    (path / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.from_pretrained(path, trust_remote_code=True), trust_remote_code=True)
    model.save_pretrained(path)  # the weights (config.json and the code files stay as written)
    AutoTokenizer.from_pretrained(tiny_prm).save_pretrained(path)
    return path


def test_hf_step_prm_loads_a_prm_with_its_own_code(custom_code_prm):
    """The custom-class branch (AutoModel with trust_remote_code, a tuple output), at the dtype asked
    for, frozen; its scores are softmax(logits)[1] at each marker of the plain input, by hand."""
    from transformers import AutoModel, AutoTokenizer
    prm = step_prm.HFStepPRM(str(custom_code_prm), dtype=torch.float64)
    assert type(prm.model).__name__ == "ToyProcessRewardModel"
    assert prm.separator == "\n\n" and prm.step_token == "<extra_0>" and prm.batch_size == 8  # the defaults
    assert all(p.dtype == torch.float64 and not p.requires_grad for p in prm.model.parameters())
    assert not prm.model.training
    question, steps = "(7+5)*3", ["7+5=12", "12*3=36"]
    got = prm.score([question], ["\n\n".join(steps)])[0]
    tok = AutoTokenizer.from_pretrained(custom_code_prm)
    model = AutoModel.from_pretrained(custom_code_prm, trust_remote_code=True, dtype=torch.float64).eval()
    plain = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = plain(question + "\n") + plain(steps[0]) + [prm.marker_id] + plain(steps[1]) + [prm.marker_id]
    positions = [i for i, t in enumerate(ids) if t == prm.marker_id]
    with torch.no_grad():
        probs = model(input_ids=torch.tensor([ids]))[0].softmax(-1)[0, :, 1]
    assert got == pytest.approx(probs[positions].tolist(), abs=1e-6)  # (score reads float32 probabilities)
    # without trust_remote_code the folder cannot be read at all: the loader must pass it
    from transformers import AutoConfig
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoConfig.from_pretrained(custom_code_prm, trust_remote_code=False)


def test_hf_step_prm_of_a_token_classifier_keeps_the_dtype_asked_for(tiny_prm):
    prm = step_prm.HFStepPRM(str(tiny_prm), separator="\n", dtype=torch.float64)
    assert all(p.dtype == torch.float64 and not p.requires_grad for p in prm.model.parameters())
