"""The code reward under attack (issue 30): what the policy could write to get reward 1 without solving
the task, to crash or stall the trainer, to take more than its test's share of the machine, or to read
the user's files. Each test runs the attack through verify.score_batch exactly as train.py does and
asserts on what it gets: reward 0, no file or process left, score_batch returning in time, an honest
sibling still scoring 1. Run in the mode this machine gives (sandbox.sandbox_mode()); what needs
isolation skips elsewhere, saying so.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sandbox
import verify
from conftest import sandbox_dirs

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 2.0
ISOLATED = pytest.mark.skipif(sandbox.sandbox_mode() != "namespaces",
                              reason="needs the 'namespaces' sandbox (root, unshare and mount allowed)")
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def score(program: str, reference, timeout: float = TIMEOUT, workers: int | None = None) -> verify.Score:
    return verify.score_batch([f"```python\n{program}\n```"], [reference], ["code"], timeout=timeout,
                              workers=workers)[0]


CALL = {"fn_name": "f", "inputs": [[1]], "outputs": [[5, 6]]}
ASSERTS = {"asserts": ["assert f(1) == [5, 6]"]}
SCRIPT = {"assert_script": "x = 1\nassert f(x) == [5, 6]"}  # a benchmark's whole test script (LeetCode's)
HONEST = "def f(x):\n    return [5 * x, 6 * x]"

# 1. Reward without solving: each of these scored 1 on a call-based test before issue 30 (when the
# expected value and a pass token lived inside the sandbox), in both modes.
HEX_TOKEN = "lambda c: isinstance(c, str) and len(c) == 16 and all(x in '0123456789abcdef' for x in c)"
CHEATS = {
    "__eq__ always True": "class A:\n    def __eq__(self, other):\n        return True\n"
                          "    __hash__ = object.__hash__\ndef f(*args):\n    return A()",
    "a list subclass equal to anything": "class L(list):\n    def __eq__(self, other):\n        return True\n"
                                         "def f(*args):\n    return L()",
    "print the pass token read from the harness's constants": (
        f"import os, sys\nis_token = {HEX_TOKEN}\ndef f(*args):\n"
        "    print(*[c for c in sys._getframe(1).f_code.co_consts if is_token(c)], flush=True)\n    os._exit(0)"),
    "print the pass token read from its own file": (
        f"import ast, os, sys\nis_token = {HEX_TOKEN}\n"
        "for node in ast.walk(ast.parse(open(sys.argv[0]).read())):\n"
        "    if isinstance(node, ast.Constant) and is_token(node.value):\n        print(node.value, flush=True)\n"
        "        os._exit(0)"),
    "patch json.loads so that args and expected agree": (
        "import json\njson.loads = lambda s: [1]\ndef f(*args):\n    return 1"),
    "an __import__ hook that fakes json": (
        "import builtins, types\n_real = builtins.__import__\nfake = types.SimpleNamespace(loads=lambda s: [1])\n"
        "def hook(name, *a, **k):\n    return fake if name == 'json' else _real(name, *a, **k)\n"
        "builtins.__import__ = hook\ndef f(*args):\n    return 1"),
    "settrace copying the result over the expected value": (
        "import sys\ndef tracer(frame, event, arg):\n    g = frame.f_globals\n"
        "    if '_out' in g and '_expected' in g:\n        g['_expected'] = g['_out']\n    return tracer\n"
        "sys.settrace(tracer)\nsys._getframe().f_trace = tracer\ndef f(*args):\n    return 1"),
    "exit 0 before the harness runs": "import os\nos._exit(0)",
}
SORTED = {"fn_name": "sorted", "inputs": [[[3, 1, 2]]], "outputs": [[1, 2, 3]]}


@pytest.mark.parametrize("name", CHEATS)
def test_a_cheat_scores_zero_and_the_honest_program_one(name):
    assert score(CHEATS[name], CALL).reward == 0.0
    assert score(CHEATS[name], ASSERTS).reward == 0.0
    assert score(CHEATS[name], SCRIPT).reward == 0.0
    assert score(HONEST, CALL).reward == 1.0 and score(HONEST, ASSERTS).reward == 1.0
    assert score(HONEST, SCRIPT).reward == 1.0


def test_fn_name_must_be_the_programs_own():
    """`pass` with fn_name "sorted" called the builtin and passed; now the name must be defined by
    the program (a module-level name of its own, or a method of its class Solution)."""
    assert score("pass", SORTED).reward == 0.0
    assert score("def sorted(x):\n    return [1, 2, 3]", SORTED).reward == 1.0  # its own, however dumb
    assert score("class Solution:\n    def sorted(self, x):\n        return [1, 2, 3]", SORTED).reward == 1.0


def test_a_guess_printed_by_the_program_is_compared_outside_and_must_be_right():
    """The harness's line is read as a literal and compared in the worker: a program that prints a
    value and exits before the harness is graded on that value, so only the right one passes."""
    assert score("print([5, 6], flush=True)\nimport os\nos._exit(0)", CALL).reward == 1.0  # it computed the answer
    assert score("print([5, 7], flush=True)\nimport os\nos._exit(0)", CALL).reward == 0.0


@pytest.mark.parametrize("reference, message", [
    ({"asserts": [""]}, "exactly one assert"),
    ({"asserts": ["   "]}, "exactly one assert"),
    ({"asserts": ["x = 1"]}, "exactly one assert"),
    ({"asserts": ["assert True"]}, "reads nothing the program defines"),
    ({"asserts": ["assert 1 + 1 == 2"]}, "reads nothing the program defines"),
    ({"asserts": ["assert all(f(i) == i for i in range(3))"]}, "cannot evaluate"),
    ({"asserts": ["assert f(1) == math.__loader__"]}, "cannot evaluate"),
    ({"asserts": []}, "has no tests"),
    ({}, "has no tests"),
    ({"inputs": ["1\n"], "outputs": ["  \n"]}, "empty expected output"),
    ({"fn_name": "f", "inputs": [], "outputs": []}, "non-empty"),
])
def test_an_empty_or_checkless_test_is_a_malformed_reference(reference, message):
    with pytest.raises(ValueError, match=r"references\[0\] \(kind 'code'\).*" + message):
        score(HONEST, reference)


@pytest.mark.parametrize("depth", [1_000, 200_000])
def test_a_reference_nested_past_any_depth_is_the_same_clear_error(depth):
    deep = "[" * depth + "]" * depth
    for reference in ('{"fn_name": "f", "inputs": [[' + deep + ']], "outputs": [1]}',
                      {"fn_name": "f", "inputs": [[json.loads("[" * 500 + "]" * 500)]], "outputs": [1]}):
        try:
            result = score(HONEST, reference)
        except ValueError as error:
            assert "references[0] (kind 'code')" in str(error)
        else:  # shallow enough to read: then it is graded like any other
            assert result.reward == 0.0


def test_asserts_keep_their_meaning_outside_the_sandbox():
    program = "import math\ndef f(x):\n    return (x, x / 3)\nLIMIT = 4\nclass Box:\n    def size(self):\n        return 7"
    asserts = ["assert f(3) == (3, 1.0)", "assert math.isclose(f(1)[1], 0.3333333, rel_tol=1e-6)",
               "assert sorted(f(2)) == [2 / 3, 2]", "assert LIMIT == 4 and Box().size() == 7",
               "assert f(0) != (1, 1)", "assert isinstance(f(1), tuple)", "assert f(3) == (3, 2)"]
    got = score(program, {"asserts": asserts})
    assert got.reward == pytest.approx(6 / 7) and "first failure test 6: wrong output" in got.reason


# 2. Crash or stall the trainer.
DEEP_TREE = ("import os\nfor i in range(3000):\n    try:\n        os.mkdir('d')\n        os.chdir('d')\n"
             "    except OSError:\n        break\nprint('made')")
MANY_DIRS = ("import os\nfor i in range(200000):\n    try:\n        os.mkdir(f'd{i}')\n    except OSError:\n"
             "        break\nprint('made')")


@pytest.mark.parametrize("program", [DEEP_TREE, MANY_DIRS], ids=["3000 deep", "many directories"])
def test_a_directory_bomb_neither_crashes_nor_stalls_score_batch(program):
    start = time.monotonic()
    got = verify.score_batch([f"```python\n{program}\n```", f"```python\n{HONEST}\n```"],
                             [{"inputs": [""], "outputs": ["made"]}, CALL], ["code", "code"], timeout=TIMEOUT)
    assert time.monotonic() - start < 4 * TIMEOUT + 10
    assert got[1].reward == 1.0
    assert sandbox_dirs(inside="d*") == []


def test_the_workers_scratch_is_removed_off_the_trainers_thread(tmp_path):
    """A killed worker's scratch directory, however deep, goes in the background: replacing the
    worker returns at once, and rm -rf (not a recursive rmtree) removes a 3000-deep tree."""
    deep = tmp_path / "scratch"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(3000):  # (os.makedirs itself recurses)
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    start = time.monotonic()
    sandbox.remove_tree(str(deep), wait=False)
    assert time.monotonic() - start < 0.5
    deadline = time.monotonic() + 30
    while deep.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not deep.exists()


# 3. More than a test's share.
@ISOLATED
def test_the_work_directory_is_a_small_tmpfs():
    program = ("n = 0\ntry:\n    for i in range(20):\n        open(f'f{i}', 'wb').write(b'x' * (10 << 20))\n"
               "        n += 1\nexcept OSError:\n    pass\nprint(n)")
    got = score(program, {"inputs": [""], "outputs": ["6"]})  # 6 x 10 MB fit in 64 MB, the 7th does not
    assert got.reward == 1.0, got


MEMORY_HOG = """import os, time
pids = []
for _ in range({n}):
    pid = os.fork()
    if pid == 0:
        try:
            x = b'x' * (800 << 20)  # under the 1 GiB a process may map, and touched
            time.sleep(2)
            os._exit(0)
        except MemoryError:
            os._exit(1)
    pids.append(pid)
print(sum(os.waitpid(p, 0)[1] == 0 for p in pids))"""


@pytest.mark.skipif(sandbox._memory_cgroup_root() is None, reason="needs a cgroup-v1 memory controller we may write")
def test_memory_is_limited_per_test_not_per_process():
    """Five children of 800 MB each passed the per-process limit and took 4 GB; the test's memory
    cgroup (2 GiB) lets two hold theirs and the kernel stops the rest; the sandbox carries on."""
    assert score(MEMORY_HOG.format(n=2), {"inputs": [""], "outputs": ["2"]}, timeout=10.0).reward == 1.0
    assert score(MEMORY_HOG.format(n=5), {"inputs": [""], "outputs": ["5"]}, timeout=10.0).reward == 0.0
    assert score(HONEST, CALL).reward == 1.0


@ISOLATED
def test_sysv_shared_memory_does_not_outlive_the_test():
    key = 0x5EED0000 + os.getpid() % 0xFFFF
    program = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               f"print('made' if libc.shmget({key}, 4096, 0o1666) >= 0 else 'failed')")
    assert score(program, {"inputs": [""], "outputs": ["made"]}).reward == 1.0
    keys = [int(line.split()[0]) for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert key not in keys


@pytest.mark.skipif(sandbox.sandbox_mode() == "rlimits", reason="needs root to give each test its own user")
def test_a_process_hog_does_not_starve_an_honest_sibling():
    """32 processes per TEST (each test runs as its own user), not per sandbox user: a program that
    holds all of its 32 while an honest one is graded beside it (2 workers) does not make it fail."""
    hog = ("import os, time\nfor _ in range(40):\n    try:\n        if os.fork() == 0:\n            time.sleep(60)\n"
           "    except OSError:\n        break\ntime.sleep(60)")
    got = verify.score_batch([f"```python\n{hog}\n```", f"```python\n{HONEST}\n```"],
                             [{"inputs": [""], "outputs": ["x"]}, CALL], ["code", "code"], timeout=4.0, workers=2)
    assert got[0].reward == 0.0 and got[1].reward == 1.0


@pytest.mark.skipif(sandbox.sandbox_mode() == "rlimits", reason="needs root to give each test its own user")
def test_kill_minus_one_reaches_no_other_test():
    """kill(-1) signals every process the caller may signal: as a user of its own, only its own."""
    killer = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\nprint('x')"
    slow = "import time\ntime.sleep(1.5)\ndef f(x):\n    return [5 * x, 6 * x]"
    got = verify.score_batch([f"```python\n{slow}\n```", f"```python\n{killer}\n```"],
                             [CALL, {"inputs": [""], "outputs": ["y"]}], ["code", "code"], timeout=4.0, workers=2)
    assert got[0].reward == 1.0


# 4. The user's files.
@ISOLATED
@pytest.mark.parametrize("target", [str(REPO / "README.md"), str(REPO / "benchmarks" / "SOURCES.md"),
                                    "/run/lock/escaped", "/etc/passwd", "/proc/self/cmdline"])
def test_the_program_sees_none_of_the_machines_files(target):
    program = (f"try:\n    print(len(open({target!r}).read()))\nexcept OSError:\n    print('hidden')\n"
               f"try:\n    open('/run/lock/escaped-{os.getpid()}', 'w')\nexcept OSError:\n    pass")
    assert score(program, {"inputs": [""], "outputs": ["hidden"]}).reward == 1.0
    assert not Path(f"/run/lock/escaped-{os.getpid()}").exists()


@ISOLATED
def test_a_walk_of_the_filesystem_finds_no_data():
    program = ("import os\nmine = {'SOURCES.md', 'REPRODUCTION.md', 'PRIME.md', 'model.safetensors', 'SHA256SUMS'}\n"
               "found = [os.path.join(d, f) for d, _, fs in os.walk('/') for f in fs\n"
               "         if f in mine or f.endswith(('.parquet', '.jsonl'))]\nprint(len(found))")
    # The walk visits /usr and the interpreter's prefix (a venv with torch and vLLM: about 200k
    # entries). Warm it takes under a second; with a cold directory cache under CI's load it has
    # passed 10 s (a CI run failed on "timeout"), so the limit here only bounds a hang.
    assert score(program, {"inputs": [""], "outputs": ["0"]}, timeout=120.0).reward == 1.0


# 5-6. The mode: chosen by what the machine allows, not by where Python lives, and announced.
@pytest.mark.skipif(sandbox.sandbox_mode() == "rlimits", reason="needs root")
def test_a_venv_under_the_temporary_directory_gets_the_same_mode(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import sandbox; print(sandbox.sandbox_mode())"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == sandbox.sandbox_mode(), out.stderr[-2000:]


def test_the_mode_is_announced_and_a_weaker_one_says_what_it_leaves_open():
    line = sandbox.announce()
    mode = sandbox.sandbox_mode()
    assert mode in line and (line.startswith("warning") == bool(sandbox.MODE_GAPS[mode]))
    if mode == "namespaces":
        assert sandbox.announce("namespaces") == line
    else:
        with pytest.raises(RuntimeError, match="--sandbox namespaces"):
            sandbox.announce("namespaces")
    for weaker in ("nobody", "rlimits"):
        assert sandbox.MODE_GAPS[weaker]  # each weaker mode names what it does not protect against
