"""Fixtures shared by the test files: the toy SFT checkpoint every test starts from, and the
sandbox's scratch directories the verify and sandbox tests look for leftovers in."""

import os
import tempfile
from pathlib import Path

import pytest

import toy_task

SFT_STEPS = 0  # the recipe's checkpoint of the default task, shipped in checkpoints/: nothing to train

# `pytest -m quick`: the files that check the math, the graders, the benchmarks' scoring, the flags and the
# docs without a training run (about 2.5 minutes on 2 cores; README, CI). The whole suite adds the runs.
QUICK_FILES = {"test_prime.py", "test_gradients.py", "test_pass.py", "test_verify.py", "test_benchmarks.py",
               "test_config.py", "test_docs.py", "test_step_prm.py", "test_toy_task.py"}


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: the quick files (QUICK_FILES in tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in QUICK_FILES:
            item.add_marker(pytest.mark.quick)


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


def free_port() -> int:
    """A TCP port nothing listens on now, for a torchrun rendezvous or a process group: two test runs on
    one host (two clones' quickstart files at once) never meet on a fixed port."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
