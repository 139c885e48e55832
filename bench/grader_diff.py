"""The grader before and after a change, case by case: every labelled case of tests/math_equivalence_cases.py
scored by verify.py at a git revision and by the working tree, under both graders, and every verdict that
changed, with whether it now agrees with its label (better) or no longer does (worse).

    python bench/grader_diff.py                  # the committed grader (HEAD) against the working tree
    python bench/grader_diff.py --before 617eb56 # a given revision against the working tree

A case of READ_CAREFULLY carries the question it answers (units, order and "how many" are read from it);
a revision whose verify.py takes no questions is given none. Exits 1 if any verdict got worse.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter with the grader's folder first on sys.path: (default, official) per case.
SCORE = """
import json, sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2])
import verify
from math_equivalence_cases import CASES, READ_CAREFULLY
cases = [(g, r, "") for g, r, _ in CASES] + [(g, r, q) for g, r, _, q in READ_CAREFULLY]
out = {}
for grader in ("math-verify", "official"):
    scores = verify.score_batch([r for _, r, _ in cases], [g for g, _, _ in cases], ["math"] * len(cases),
                                questions=[q for _, _, q in cases], math_grader=grader, timeout=30.0)
    out[grader] = [s.reward for s in scores]
print(json.dumps(out))
"""


def scores(grader_dir: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", SCORE, str(grader_dir), str(REPO / "tests")], capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"scoring with {grader_dir} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="HEAD", help="the git revision of the grader to compare against")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from math_equivalence_cases import CASES, READ_CAREFULLY

    cases = [(g, r, label, "") for g, r, label in CASES] + list(READ_CAREFULLY)
    with tempfile.TemporaryDirectory() as old:
        for name in ("verify.py", "sandbox.py"):
            source = subprocess.run(["git", "show", f"{args.before}:{name}"], cwd=REPO, capture_output=True,
                                    text=True, check=True).stdout
            (Path(old) / name).write_text(source)
        before = scores(Path(old))
    after = scores(REPO)
    worse = 0
    for grader in ("math-verify", "official"):
        agree_before = sum(b == c[2] for b, c in zip(before[grader], cases))
        agree_after = sum(a == c[2] for a, c in zip(after[grader], cases))
        print(f"{grader}: {len(cases)} cases; agrees with the label on {agree_before} at {args.before}, "
              f"{agree_after} now")
        for (gold, response, label, question), b, a in zip(cases, before[grader], after[grader]):
            if a != b:
                verdict = "better" if a == label else "WORSE" if b == label else "changed"
                worse += verdict == "WORSE"
                print(f"  {verdict:7} label {label}: {b} -> {a}  gold {gold!r}  response {response[:90]!r}"
                      + (f"  question {question[:60]!r}" if question else ""))
    print(f"{worse} verdicts worse")
    sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
