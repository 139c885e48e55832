"""bench/run_gpu_checks.sh's one JSON: every figure its checks measured, gathered from the files they
wrote in the script's work folder. The script runs this after each check, so a run cut short still
leaves a JSON of what it measured.

    python bench/gpu_report.py WORK OUT_JSON

WORK holds gpu.txt (the device and the versions), status.tsv (a line a check: name, exit status or
"skipped", seconds, limit) and each check's own files: NAME.log (its output), lora7b.json
(bench_lora.py), tests.xml (pytest's JUnit report), preset/ and runs/gpu-toy/ (train.py's run folders),
microbatch.json (bench_microbatch.py).
"""

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runlog import write_json  # noqa: E402  (atomic)

# train.py's line after the first step on a GPU (memory.memory_line)
MEMORY_LINE = re.compile(r"memory per GPU after the first step: estimated ([\d.]+) GB \(([\d.]+) of it beyond tensors.*?\); "
                         r"the allocator's peaks ([\d.]+) GB allocated, ([\d.]+) GB reserved; the device in use now "
                         r"([\d.]+) of ([\d.]+) GB")


def read_json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def memory_line(log: Path) -> dict | None:
    """The estimate beside what the first step used, from a train.py run's output."""
    found = MEMORY_LINE.search(log.read_text(errors="replace")) if log.exists() else None
    if not found:
        return None
    keys = ["estimated_gb", "beyond_tensors_gb", "allocated_peak_gb", "reserved_peak_gb", "device_used_gb", "device_gb"]
    return dict(zip(keys, map(float, found.groups())))


def run_figures(run_dir: Path, log: Path) -> dict:
    """A train.py run: its summary (the step-time split, the accuracies) and its memory line."""
    return {"summary": read_json(run_dir / "summary.json"), "memory": memory_line(log)}


def test_outcomes(xml: Path) -> dict | None:
    """pytest's JUnit report: each test's outcome (with the first line of a failure's message), and counts."""
    if not xml.exists():
        return None
    outcomes = {}
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        message = (problem.get("message") or "").splitlines()[0][:300] if problem is not None and problem.get("message") else ""
        outcomes[name] = "passed" if problem is None else f"{problem.tag}: {message}".rstrip(": ")
    counts = Counter(outcome.split(":")[0] for outcome in outcomes.values())
    return {"counts": dict(counts), "tests": outcomes}


FIGURES = {
    "lora7b": lambda work: {"figures": read_json(work / "lora7b.json")},
    "tests": lambda work: test_outcomes(work / "tests.xml") or {},
    "preset": lambda work: run_figures(work / "preset" / "runs" / "preset-1.5b", work / "preset.log"),
    "microbatch": lambda work: {"figures": read_json(work / "microbatch.json")},
    "toy": lambda work: run_figures(work / "runs" / "gpu-toy", work / "toy.log"),
}


def main(work: str, out: str) -> None:
    work = Path(work)
    device = work / "gpu.txt"
    report = {"device": device.read_text().splitlines() if device.exists() else [], "checks": {}}
    status = work / "status.tsv"
    for line in (status.read_text().splitlines() if status.exists() else []):
        name, code, seconds, limit = line.split("\t")
        entry = {"exit": code if code == "skipped" else int(code), "seconds": int(seconds), "limit_s": int(limit)}
        if code != "skipped":
            entry.update(FIGURES[name](work))
        report["checks"][name] = entry
    write_json(out, report)


if __name__ == "__main__":
    main(*sys.argv[1:])
