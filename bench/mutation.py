"""Mutation testing of the math with mutmut (configured in setup.cfg), and the kill rate per file.

    pip install mutmut==3.8.1             # once (not in requirements.txt: CI does not run it)
    python bench/mutation.py              # mutmut run (resumes where it stopped), then the report
    python bench/mutation.py --report     # only the report, from the mutants/ folder mutmut left
    python bench/mutation.py --recheck step_prm   # rerun each non-killed mutant's tests directly

Two mutmut pitfalls seen here. A "survived" verdict stays when only the tests change: name the
mutants (`mutmut run NAME ...`) or use --recheck to test them again. On a busy machine mutmut marks
quick mutants "timeout", which its score counts as killed: --recheck runs each one's tests (those
mutmut maps to its function) in mutants/ with MUTANT_UNDER_TEST set, one at a time, no time limit
but the test's own, and prints killed / survived.

mutmut rewrites each function of prime.py, pass_advantage.py, step_prm.py and eval.py in many
one-token ways (an operator flipped, a constant changed, an argument dropped) and runs the tests that
call that function against each mutant. A mutant the tests do not notice ("survived") is a slip
they would miss, or an equivalent rewrite (e.g. `.to(None)` on a tensor already float32). Of eval.py
only the math counts here (pass@k, ks_for, the bootstrap); the rest of it is plumbing tested end to
end. Not part of CI: on 2 cores a full run takes hours (each pass_advantage mutant reruns the PASS
suite); it resumes, so it can be run in pieces. `mutmut show NAME` prints one mutant's diff.
"""

import argparse
import re
import subprocess
import sys
from collections import Counter, defaultdict

FILES = ("prime", "pass_advantage", "step_prm", "eval")
EVAL_MATH = ("pass_at_k", "ks_for", "bootstrap_interval")


def results() -> list[tuple[str, str, str, str]]:
    """(mutant name, module, function, status) for every mutant mutmut knows."""
    out = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*((\w+)\.(\S+)__mutmut_\d+): (.+)$", line)
        if m:
            function = re.sub(r"^x_|^xǁ", "", m[3]).replace("ǁ", ".")
            rows.append((m[1], m[2], function, m[4].strip()))
    return rows


def report(rows) -> None:
    per_file, survivors = defaultdict(Counter), defaultdict(list)
    for _, module, function, status in rows:
        if module == "eval" and function not in EVAL_MATH:
            continue
        per_file[module][status] += 1
        if status == "survived":
            survivors[module].append(function)
    print("| file | mutants | killed | survived | timeout | no tests | not checked | kill rate |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for module in FILES:
        c = per_file[module]
        killed, survived = c["killed"] + c["timeout"], c["survived"]
        rate = f"{killed / (killed + survived):.1%}" if killed + survived else "n/a"
        print(f"| {module}.py{' (math)' if module == 'eval' else ''} | {sum(c.values())} | {c['killed']} | "
              f"{survived} | {c['timeout']} | {c['no tests']} | {c['not checked']} | {rate} |")
    for module in FILES:
        if survivors[module]:
            print(f"\nsurvived in {module}.py: " + ", ".join(f"{f} x{n}" for f, n in Counter(survivors[module]).items()))


def recheck(module: str) -> None:
    """Every mutant of `module` that mutmut left "survived" or "timeout", its tests run directly."""
    import json
    import os
    stats = json.loads(open("mutants/mutmut-stats.json").read())["tests_by_mangled_function_name"]
    names = [name for name, mod, _, status in results() if mod == module and status in ("survived", "timeout")]
    verdicts = Counter()
    for name in names:
        tests = sorted(stats.get(name.rsplit("__mutmut_", 1)[0], []))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                              cwd="mutants", env=dict(os.environ, MUTANT_UNDER_TEST=name), capture_output=True)
        verdict = {0: "survived", 1: "killed"}.get(proc.returncode, f"error (pytest exit {proc.returncode})")
        verdicts[verdict] += 1
        print(f"{name}: {verdict}", flush=True)
    print(", ".join(f"{v} {n}" for v, n in verdicts.items()) or "nothing to recheck")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", action="store_true", help="only report the results of earlier runs")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at a time")
    parser.add_argument("--recheck", choices=FILES, help="rerun this file's non-killed mutants' tests directly")
    args = parser.parse_args(argv)
    if args.recheck:
        return recheck(args.recheck)
    if not args.report:
        subprocess.run(["mutmut", "run", "--max-children", str(args.max_children)], check=False)
    rows = results()
    if not rows:
        sys.exit("no mutmut results: run `python bench/mutation.py` from the repository root first")
    report(rows)


if __name__ == "__main__":
    main()
