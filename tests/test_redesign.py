"""The redesign of train.py into flat modules (issue 28) changed no behaviour: the same seed gives the
same metrics, episodes and held-out accuracies as the code before it, on the same machine.

The code before is REFERENCE_COMMIT, unpacked from this repository's history (`git archive`); both
run in subprocesses with one thread, with every flag whose default has changed since given
explicitly. A later change that alters the loop's behaviour on purpose fails this test: then set
REFERENCE_COMMIT to the commit that made that change, so that the test guards the refactors after it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE_COMMIT = "8cf20fb"  # train.py as one 1490-line file, just before the redesign
FLAGS = ["--steps", "2", "--seed", "3", "--prompts-per-step", "8", "--eval-problems", "8", "--eval-every", "1",
         "--save-every", "1", "--policy-lr", "3e-5", "--micro-batch-size", "64"]  # rows, not the later token budget


def reference_tree(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the code before the redesign comes from this repository's history")
    tree = tmp_path / "before"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", REFERENCE_COMMIT], capture_output=True)
    if archive.returncode:
        pytest.skip(f"commit {REFERENCE_COMMIT} is not in this checkout's history (a shallow clone?)")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    (tree / "checkpoints").symlink_to(REPO / "checkpoints")  # the same shipped SFT start (not in that commit)
    return tree


def run(tree: Path, out: Path, flags: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "train.py", *FLAGS, *flags, "--out-dir", str(out), "--cache-dir", str(out / "cache"),
           "--run-name", "r"]
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = out / "r"
    metrics = [{k: v for k, v in json.loads(l).items() if k != "time"}
               for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"metrics": metrics, "episodes": (run_dir / "episodes.jsonl").read_text(),
            "summary": {k: v for k, v in summary.items() if k not in ("wall_seconds", "step_seconds", "eval_seconds")}}


@pytest.mark.parametrize("flags", [[], ["--estimator", "pass", "--process", "step"]], ids=["prime", "pass-step"])
def test_the_redesign_gives_the_same_run_as_the_code_before_it(flags, tmp_path):
    before = run(reference_tree(tmp_path), tmp_path / "before-runs", flags)
    after = run(REPO, tmp_path / "after-runs", flags)
    assert len(after["metrics"]) == 2 and after["metrics"][0]["reward"] > 0
    assert after == before
