"""reproduce.py: its curve arithmetic by hand, and one tiny comparison end to end."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import reproduce

from conftest import SFT_STEPS

REPO = Path(__file__).resolve().parents[1]


def test_moving_average_and_first_step_reaching_by_hand():
    x = np.array([[0.0, 1.0, np.nan, 3.0, 5.0]])
    # trailing window 2: [0], [0,1], [1,nan], [nan,3], [3,5]
    assert reproduce.moving_average(x, 2).tolist() == [[0.0, 0.5, 1.0, 3.0, 4.0]]
    assert reproduce.first_step_reaching(np.array([0.1, 0.3, 0.2, 0.5]), 0.3) == 2  # steps count from 1
    assert reproduce.first_step_reaching(np.array([0.1, 0.2]), 0.3) is None


def test_every_arm_is_in_a_comparison_and_has_a_label():
    used = {a for arms in reproduce.COMPARISONS.values() for a in arms}
    assert used == set(reproduce.ARMS) == set(reproduce.LABELS)


def test_one_comparison_end_to_end(cache_dir, tmp_path):
    cmd = [sys.executable, str(REPO / "reproduce.py"), "prime-vs-rloo", "--seeds", "1", "--steps", "3",
           "--jobs", "1", "--out", str(tmp_path / "runs"), "--cache-dir", str(cache_dir),
           "--figures", str(tmp_path / "fig"), "--window", "2",
           "--sft-steps", str(SFT_STEPS), "--prompts-per-step", "8", "--eval-problems", "8", "--eval-every", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "fig" / "prime-vs-rloo.png").stat().st_size > 1000
    results = json.loads((tmp_path / "fig" / "results.json").read_text())
    assert set(results) == {"prime", "rloo"}
    metrics = [json.loads(l) for l in (tmp_path / "runs" / "rloo-s1" / "metrics.jsonl").read_text().splitlines()]
    assert results["rloo"]["reward_last"] == [np.mean([m["reward"] for m in metrics[-2:]])]
    assert "| RLOO, outcome only |" in proc.stdout and "PRIME reaches" in proc.stdout
    # a second call finds the runs finished and only redraws
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert again.returncode == 0 and "done in" not in again.stdout
