"""Fixtures shared by the test files: the toy SFT checkpoint every test starts from, and the
sandbox's scratch directories the verify and sandbox tests look for leftovers in."""

import os
import tempfile
from pathlib import Path

import pytest

import toy_task

SFT_STEPS = 0  # the recipe's checkpoint of the default task, shipped in checkpoints/: nothing to train


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """The cache folder the tests' runs use. The default task's SFT checkpoint is shipped, so the
    folder stays empty unless a test asks for another setting. PRIME_TEST_CACHE=DIR keeps it between
    sessions while developing; CI starts from nothing."""
    cache = Path(os.environ["PRIME_TEST_CACHE"]) if os.environ.get("PRIME_TEST_CACHE") else \
        tmp_path_factory.mktemp("cache")
    toy_task.sft_checkpoint(cache, SFT_STEPS)
    return cache


def sandbox_dirs(inside: str = "") -> list[Path]:
    """The verify-sandbox-* directories in this process's code workers' scratch directories (other
    processes on the machine may be using verify.py too), or with `inside`, what they hold matching
    that glob. A replaced worker's scratch is removed in the background (sandbox.remove_tree): one
    that vanishes while it is listed is skipped, where a plain glob would raise FileNotFoundError."""
    found = []
    for scratch in Path(tempfile.gettempdir()).glob(f"verify-worker-{os.getpid()}-*"):
        try:
            boxes = [p for p in scratch.iterdir() if p.name.startswith("verify-sandbox-")]
            found += [p for box in boxes for p in box.glob(inside)] if inside else boxes
        except FileNotFoundError:
            continue
    return found
