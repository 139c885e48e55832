"""The code sandbox and the worker pool behind verify.py: where untrusted programs and slow math run.

    run_jobs(jobs, n_workers) -> {i: (reward, reason)}   every job in a pool of worker processes
    run_code_tests(program, tests, timeout)            (in a worker) each test in its own sandbox
    sandbox_mode() -> str                               which defences this machine allows
    announce(required) -> str                           train.py's start-up line (or RuntimeError)
    parse_assert(text, where) -> dict                   an assert test, split into sandbox and check
    shutdown()                                          stop the pool (also runs at exit)

verify.py holds the reward functions and the worker's side of the protocol (`verify._worker_main`,
one job at a time, JSON lines on stdin/stdout); this module starts, feeds, times and replaces the
workers, and runs each code test as a sandboxed process. verify.py's docstring ("Design", 2-5)
describes the time limits and the sandbox's modes and what each protects against.
"""

import ast
import atexit
import builtins
import ctypes
import functools
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_readable
from pathlib import Path

WORKER_MODULE = "verify"  # a pool worker runs this module's _worker_main (the reward functions' side)
WORKER_STARTUP_SECONDS = 120.0  # a worker imports sympy and warms up; generous for a loaded machine

# Code sandbox limits (per test program).
CODE_MEMORY_BYTES = 1 << 30      # RLIMIT_AS: allocating 50 GB fails with MemoryError
CODE_FILE_BYTES = 16 << 20       # RLIMIT_FSIZE: largest file (and stdout) a program may write
CODE_MAX_PROCESSES = 32          # RLIMIT_NPROC for the sandbox user (not enforced for root)
CODE_MAX_OPEN_FILES = 64         # RLIMIT_NOFILE
CODE_TEST_MEMORY_BYTES = 2 << 30  # every process of one test together (a memory cgroup, where we may make one)
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# Comparing outside the sandbox. The program (and anything it patches: json, __eq__, builtins, the
# frames above it) runs in the sandbox; the expected values never do. For a call-based or an assert
# test the program is followed by a harness that computes the values the test reads (the call's
# return value; each program-defined value an assert reads) and writes their repr() as the last line
# of stdout. The worker reads that line back with ast.literal_eval, so only plain values come out (an
# object with its own __eq__ has no literal repr: the test fails), and compares them with the
# expected values itself. There is no pass token to steal: the program cannot print a right answer
# it has not computed, because nothing it can reach holds one.

# A call-based test (APPS/TACO, LeetCode): `class Solution` instantiated and its method called if the
# program defines one, else the program's own module-level function of that name (a builtin the
# program never defined, such as `sorted`, is not found: exit code 3).
_CALL_HARNESS = """
def _sandbox_call():
    import json, sys
    names = globals()
    if isinstance(names.get("Solution"), type) and hasattr(names["Solution"], {name!r}):
        target = getattr(names["Solution"](), {name!r})
    elif {name!r} in names:
        target = names[{name!r}]
    else:
        sys.exit(3)
    sys.stdout.write("\\n" + repr(target(*json.loads({args!r}))) + "\\n")
_sandbox_call()
"""

# An assert test: the values the assert reads from the program, computed in the sandbox.
_VALUES_HARNESS = """
def _sandbox_values():
    import sys
    names = globals()
    if not all(name in names for name in {names!r}):
        sys.exit(3)
    sys.stdout.write("\\n" + repr([{calls}]) + "\\n")
_sandbox_values()
"""

# What an assert may do with those values, evaluated in the worker: these builtins and `math` (no
# attribute starting with "_"), comparisons, arithmetic, literals. Everything else in the assert (a
# call of the program's function, one of its names) is computed in the sandbox.
CHECK_BUILTINS = ("abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "frozenset", "int",
                  "isinstance", "len", "list", "max", "min", "pow", "range", "reversed", "round", "set",
                  "sorted", "str", "sum", "tuple", "type", "zip")
_CHECK_NAMES = {*CHECK_BUILTINS, "math"}
_CHECK_NODES = (ast.Expression, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Call, ast.keyword,
                ast.Attribute, ast.Name, ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Subscript,
                ast.Slice, ast.IfExp, ast.Load, ast.expr_context, ast.cmpop, ast.boolop, ast.unaryop,
                ast.operator)


def _root_name(node: ast.AST) -> str | None:
    """The name a chain of calls, attributes and subscripts starts from (`f` in f(1)[0].x)."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def parse_assert(text: str, where: str) -> dict:
    """A reference's assert -> {"assert": text, "names": program names it reads, "calls": the
    sources the sandbox computes, "check": the assert with each of them replaced by _r[i]}.

    `assert add(1, 2) == 3` becomes calls ["add(1, 2)"], check "_r[0] == 3". Every maximal piece of
    the expression that starts from a name the checker does not know (the program's function, class
    or constant) is computed in the sandbox; the rest (comparisons, math.isclose, sorted, set, ...) is
    checked in the worker on plain values. ValueError for an empty assert, anything but one assert
    statement, one that reads nothing from the program, or one the worker could not check safely
    (lambdas, comprehensions, attributes starting with "_")."""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise ValueError(f"{where} is not Python: {error.msg}") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise ValueError(f"{where} must be exactly one assert statement, got {text[:80]!r}")
    calls, names = [], set()

    class Split(ast.NodeTransformer):
        def visit(self, node):
            root = _root_name(node) if isinstance(node, (ast.Call, ast.Attribute, ast.Subscript, ast.Name)) else None
            if root is not None and root not in _CHECK_NAMES:  # the program's: computed in the sandbox
                calls.append(ast.unparse(node))
                names.add(root)
                return ast.Subscript(ast.Name("_r", ast.Load()), ast.Constant(len(calls) - 1), ast.Load())
            return self.generic_visit(node)

    check = ast.Expression(Split().visit(tree.body[0].test))
    if not calls:
        raise ValueError(f"{where} reads nothing the program defines: {text[:80]!r}")
    for node in ast.walk(check):
        bad = (not isinstance(node, _CHECK_NODES)
               or (isinstance(node, ast.Attribute) and (node.attr.startswith("_") or _root_name(node) != "math"))
               or (isinstance(node, ast.Name) and node.id not in _CHECK_NAMES | {"_r"}))
        if bad:
            raise ValueError(f"{where}: the checker cannot evaluate {ast.unparse(node)[:60]!r} outside the sandbox "
                             f"(only comparisons, literals, math and {', '.join(CHECK_BUILTINS)} on the program's values)")
    return {"assert": text, "names": sorted(names), "calls": calls, "check": ast.unparse(check)}


# A test script (LeetCode's: a Solution instance, then 100 `test_input = {...}` / `assert
# my_solution.f(**test_input) == <literal>` pairs) runs whole, once, after the program, as the paper's
# harness runs it: one process, one time limit for the suite. Each assert's left side is computed in the
# sandbox and collected; its right side, the expected literal, never enters the sandbox: the worker
# compares the collected values with it (Python's ==, as the assert would).
_SCRIPT_HARNESS = """
_sandbox_got = []
{script}
def _sandbox_report():
    import sys
    sys.stdout.write("\\n" + repr(_sandbox_got) + "\\n")
_sandbox_report()
"""


def parse_assert_script(text: str, where: str) -> dict:
    """A test script -> {"script": it with each `assert <expr> == <literal>` replaced by
    `_sandbox_got.append(<expr>)`, "expected": [repr(<literal>), ...]}. Its other statements (building
    the inputs, `my_solution = Solution()`) stay as they are. ValueError if it is not Python, holds no
    assert, or holds an assert of another form (the literal must not run in the sandbox's reach).

        "s = Solution()\nassert s.f(x=1) == 2" -> script "s = Solution()\n_sandbox_got.append(s.f(x=1))",
                                                  expected ["2"]"""
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise ValueError(f"{where} is not Python: {error.msg}") from None
    expected = []
    for k, node in enumerate(tree.body):
        if not isinstance(node, ast.Assert):
            continue
        test = node.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            raise ValueError(f"{where}: statement {k + 1} is not of the form `assert <expr> == <literal>`")
        try:
            expected.append(repr(ast.literal_eval(test.comparators[0])))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ValueError(f"{where}: statement {k + 1} compares with something that is not a literal") from None
        call = ast.parse("_sandbox_got.append(0)").body[0]
        call.value.args = [test.left]
        tree.body[k] = ast.copy_location(call, node)
    if not expected:
        raise ValueError(f"{where} holds no assert: it tests nothing")
    return {"script": ast.unparse(tree), "expected": expected}


def _plain(x):
    """Tuples as lists at any depth (JSON has no tuples; a returned tuple equals an expected list)."""
    return [_plain(v) for v in x] if isinstance(x, (list, tuple)) else x


def _last_value(stdout: str):
    """The harness's line, read back as a Python literal; raises ValueError if it is not one."""
    line = stdout.rstrip("\n").rsplit("\n", 1)[-1]
    try:
        return ast.literal_eval(line)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        raise ValueError("no literal value") from None


def _is_int(text: str) -> bool:
    try:
        int(text)
        return True
    except ValueError:
        return False


def lines_match(output: str, expected: str) -> bool:
    """LiveCodeBench's lenient stdout comparison (its runner's testing_util): equal once the whole text
    is stripped, or line by line once each line is stripped and empty lines dropped; failing that, when
    both are the same number of one-number lines, not all integers, each pair within numpy.allclose's
    tolerance |a - b| <= 1e-8 + 1e-5 |b|.

        lines_match("3 \n\n4\n", "3\n4") -> True;  lines_match("0.3333333", "0.33333333") -> True;
        lines_match("1 2", "1\n2") -> False (the line structure counts)"""
    if output.strip() == expected.strip():
        return True
    got = [line.strip() for line in output.splitlines() if line.strip()]
    want = [line.strip() for line in expected.split("\n") if line.strip()]
    if got == want:
        return True
    if len(got) != len(want) or all(_is_int(x) and _is_int(y) for x, y in zip(got, want)):
        return False
    try:
        pairs = [(float(x), float(y)) for x, y in zip(got, want)]
    except ValueError:
        return False
    return all(abs(x - y) <= 1e-8 + 1e-5 * abs(y) for x, y in pairs)


def _passes(test: dict, returncode: int | None, stdout: str) -> bool:
    """Compare in the worker (outside the sandbox) what the program printed with what the test expects."""
    if returncode != 0:
        return False
    if "stdin" in test:  # whitespace-separated tokens, as the official grader compares (or LiveCodeBench's lines)
        if test.get("compare") == "lines":
            return lines_match(stdout, test["stdout"])
        return stdout.split() == test["stdout"].split()
    try:
        value = _last_value(stdout)
    except ValueError:
        return False
    if "script" in test:  # every assert of the script, Python's == as the assert itself would compare
        expected = [ast.literal_eval(e) for e in test["expected"]]
        return isinstance(value, list) and len(value) == len(expected) and all(
            got == want for got, want in zip(value, expected))
    if "call" in test:  # TACO stores many expected values wrapped in a one-element list: both match
        got, expected = _plain(value), _plain(json.loads(test["expected"]))
        return got == expected or (isinstance(expected, list) and len(expected) == 1 and got == expected[0])
    if not isinstance(value, list) or len(value) != len(test["calls"]):
        return False
    allowed = {name: getattr(builtins, name) for name in CHECK_BUILTINS}
    try:
        return bool(eval(test["check"], {"__builtins__": allowed, "math": math, "_r": value}))  # noqa: S307
    except Exception:  # noqa: BLE001 (a value of the wrong type makes the check raise: the test fails)
        return False


# Each test runs as a user of its own: uid SANDBOX_UID_BASE + the worker's pid (a worker runs one
# test at a time, and live pids are unique). So RLIMIT_NPROC counts this test's processes only (a
# program holding its 32 cannot starve a sibling graded beside it), and a program cannot signal,
# ptrace or pidfd_getfd another test's processes (they belong to another user). The uid needs no
# /etc/passwd entry.
SANDBOX_UID_BASE = 200_000
INTERPRETER = os.path.realpath(getattr(sys, "_base_executable", sys.executable))  # not a venv's: stdlib only
INTERPRETER_PREFIX = os.path.realpath(sys.base_prefix)


def _test_uid() -> int:
    return SANDBOX_UID_BASE + os.getpid()


def _as_user(uid: int, program: list[str]) -> list[str]:
    """Run `program` as `uid` (group the same), with no way to regain privileges (setpriv, from
    util-linux). setpriv sets the parent-death signal again after the change of user (which clears
    it), so the program dies with the process that started it."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--pdeathsig", "SIGKILL", "--", *program]


# Runs as root inside new PID, network, IPC and mount namespaces, in the test's directory (which
# holds main.py and an empty root/). It builds the filesystem the program will see and runs it there:
# - root/ becomes a fresh tmpfs (64 MB, 2048 inodes), unmounted by the kernel with the namespace, so
#   nothing the program writes outlives the test and nothing is ever removed file by file;
# - the system's programs and libraries (/usr, /lib*, /bin, /sbin, the dynamic loader's cache) and
#   the interpreter's own prefix (which may live under /root or /opt) are bound read-only;
# - /dev holds null, zero, random and urandom; /tmp and /work are empty, on the tmpfs;
# - nothing else: not the checkout, the data, the home directories, /run, /proc or the host's /tmp.
# `sh` stays the namespace's first process (no `exec`): it has unshare's parent-death signal, and when
# it dies the kernel kills every process in the namespace, including those that left the group.
_NAMESPACE_SCRIPT = """
set -e
uid=$1 prefix=$2; shift 2
chroot_bin=$(PATH="/usr/sbin:/sbin:$PATH"; command -v chroot)  # the program keeps SANDBOX_ENV's PATH
root=$PWD/root
mount -t tmpfs -o size=64m,nr_inodes=2048,mode=755 tmpfs "$root"
ro() { mkdir -p "$root$1"; mount --bind "$1" "$root$1"; mount -o remount,bind,ro,nosuid,nodev "$root$1"; }
for d in /usr /lib /lib32 /lib64 /libx32 /bin /sbin; do
  if [ -L "$d" ]; then ln -s "$(readlink "$d")" "$root$d"; elif [ -d "$d" ]; then ro "$d"; fi
done
case "$prefix" in /usr|/usr/*) ;; *) ro "$prefix" ;; esac
mkdir -p "$root/etc" "$root/dev" "$root/tmp" "$root/work"
if [ -f /etc/ld.so.cache ]; then touch "$root/etc/ld.so.cache"; mount --bind /etc/ld.so.cache "$root/etc/ld.so.cache"; fi
for n in null zero random urandom; do touch "$root/dev/$n"; mount --bind "/dev/$n" "$root/dev/$n"; done
chmod 1777 "$root/tmp"
cp main.py "$root/work/main.py"
chown -R "$uid:$uid" "$root/work"
unset PWD OLDPWD
"$chroot_bin" "$root" /usr/bin/env -C /work "$@"
"""


def _sandbox_command(mode: str, program: list[str], uid: int) -> list[str]:
    if mode == "rlimits":
        return program
    if mode == "nobody":
        return _as_user(uid, program)
    return ["unshare", "--pid", "--net", "--ipc", "--mount", "--mount-proc", "--fork", "--kill-child", "--",
            "sh", "-c", _NAMESPACE_SCRIPT, "sh", str(uid), INTERPRETER_PREFIX, *_as_user(uid, program)]


# What each mode leaves open, for train.py's start-up line and the README (tests/test_sandbox.py).
MODE_GAPS = {
    "namespaces": "",
    "nobody": ("no network isolation (127.0.0.1 is reachable), the program can read what any user can "
               "(your checkout, your data) and write to /tmp, /var/tmp and /dev/shm, and it sees other "
               "processes in /proc"),
    "rlimits": ("the program runs as your user: it can read, write and delete your files, reach the "
                "network and signal your processes; only time, memory and process limits hold"),
}


def announce(required: str = "auto") -> str:
    """The line a run that scores code prints at start-up: the mode, and what it leaves open when it
    is weaker than full isolation. required="namespaces" (train.py --sandbox namespaces) raises
    RuntimeError, saying why, when full isolation is not available here."""
    mode = sandbox_mode()
    if required != "auto" and mode != required:
        raise RuntimeError(f"--sandbox {required}: this machine gives the code sandbox '{mode}' only ("
                           + ("not root" if mode == "rlimits" else "unshare/mount namespaces failed: a container "
                              "without CAP_SYS_ADMIN?") + f"). In '{mode}', {MODE_GAPS[mode]}")
    memory = (f"{CODE_TEST_MEMORY_BYTES >> 30} GiB of memory a test (a cgroup)" if _memory_cgroup_root() else
              f"memory limited per process only ({CODE_MEMORY_BYTES >> 30} GiB each, no memory cgroup here)")
    if not MODE_GAPS[mode]:
        return (f"code sandbox: {mode} (each test as its own user, no network, a private tmpfs root with the "
                f"system's programs read-only: it cannot see your files; {memory})")
    return (f"warning: code sandbox: {mode} only: {MODE_GAPS[mode]}; {memory}. Train on code inside a container "
            "or as root.")


@functools.cache

def announce_or_exit(required: str = "auto") -> str:
    """announce(), with a missing isolation that --sandbox namespaces requires stopping the run, saying why."""
    try:
        return announce(required)
    except RuntimeError as error:
        raise SystemExit(str(error)) from None

def sandbox_mode() -> str:
    """"namespaces", "nobody" or "rlimits": the code-sandbox defences available (see the top).

    Found once per process by running a tiny program exactly as real ones are run."""
    if os.geteuid() != 0:
        return "rlimits"
    if not shutil.which("setpriv"):
        raise RuntimeError("code sandbox: we run as root, and without util-linux's `setpriv` "
                           "programs would run as root too; install it (or run as another user)")
    results = []
    for mode in (["namespaces"] if shutil.which("unshare") else []) + ["nobody"]:
        returncode, stdout = _run_sandboxed("import os; print(os.getuid())", None, 60.0, mode)
        if returncode == 0 and stdout.strip() == str(_test_uid()):
            return mode
        results.append(f"{mode}: exit code {returncode}, output {stdout[-200:]!r}")
    # Typically a Python under a directory other users may not enter: every code test would fail.
    raise RuntimeError(f"code sandbox: a test user cannot run {INTERPRETER} ({'; '.join(results)})")


def set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


_reaper = False  # True in a worker: orphans of its sandboxes become its children


def become_reaper() -> None:
    """PR_SET_CHILD_SUBREAPER: processes a sandboxed program leaves behind (double-forked, setsid)
    are re-parented to this worker instead of to init, so `_kill_children` finds them all."""
    global _reaper
    if sys.platform.startswith("linux"):
        _reaper = ctypes.CDLL(None, use_errno=True).prctl(36, 1) == 0  # 36 = PR_SET_CHILD_SUBREAPER


def _kill_children() -> None:
    """SIGKILL and reap every child of this worker. Between tests its only children are what a
    sandboxed program left running; reaping also frees their slots under RLIMIT_NPROC at once."""
    while _reaper:
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    children.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                pass  # it exited while we looked
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def lower_limit(which: int, value: int) -> None:
    """Set soft and hard limit to `value`, or keep the current hard limit if it is lower."""
    hard = resource.getrlimit(which)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


@functools.cache
def _memory_cgroup_root() -> Path | None:
    """This process's own cgroup-v1 memory directory where we may create children in it (root, the
    v1 memory controller mounted, as on this project's machines); None elsewhere."""
    if os.geteuid() != 0:
        return None
    try:
        entry = next(line for line in Path("/proc/self/cgroup").read_text().splitlines()
                     if line.split(":")[1] == "memory")
    except (OSError, StopIteration, IndexError):
        return None
    root = Path("/sys/fs/cgroup/memory") / entry.split(":", 2)[2].lstrip("/")
    return root if (root / "cgroup.procs").exists() and os.access(root, os.W_OK) else None


def _cgroup_path(worker_pid: int) -> Path | None:
    root = _memory_cgroup_root()
    return None if root is None else root / f"verify-test-{worker_pid}"


def _test_cgroup(worker_pid: int) -> Path | None:
    """The memory cgroup a worker's tests run in (one test at a time), made with its limit by the
    worker's first test; later tests find it."""
    path = _cgroup_path(worker_pid)
    if path is None or path.is_dir():
        return path
    for stale in path.parent.glob("verify-test-*"):  # left by workers killed before their sandboxes died
        if not Path("/proc", stale.name.rsplit("-", 1)[1]).exists():
            _remove_test_cgroup(int(stale.name.rsplit("-", 1)[1]))
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(CODE_TEST_MEMORY_BYTES))
        if (path / "memory.memsw.limit_in_bytes").exists():  # no way around it through swap
            (path / "memory.memsw.limit_in_bytes").write_text(str(CODE_TEST_MEMORY_BYTES))
    except OSError:
        return None
    return path


def _remove_test_cgroup(worker_pid: int) -> None:
    """rmdir a worker's test cgroup (empty once the worker and its sandboxes are gone)."""
    path = _cgroup_path(worker_pid)
    if path is not None:
        try:
            path.rmdir()
        except OSError:
            pass


def _limit_sandbox(timeout: float, cgroup: Path | None = None) -> None:
    """Pre-exec hook of a sandbox (runs in the child between fork and exec); children inherit it."""
    if cgroup is not None:  # the test's processes share CODE_TEST_MEMORY_BYTES (the OOM killer stops them there)
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    cpu_seconds = math.ceil(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    lower_limit(resource.RLIMIT_AS, CODE_MEMORY_BYTES)
    lower_limit(resource.RLIMIT_FSIZE, CODE_FILE_BYTES)
    lower_limit(resource.RLIMIT_NPROC, CODE_MAX_PROCESSES)
    lower_limit(resource.RLIMIT_NOFILE, CODE_MAX_OPEN_FILES)
    lower_limit(resource.RLIMIT_CORE, 0)
    set_parent_death_signal()  # if the worker dies, so does the sandbox (unshare, setpriv, python)


def _run_sandboxed(source: str, stdin_text: str | None, timeout: float,
                   mode: str | None = None) -> tuple[int | None, str]:
    """Run a Python program in the sandbox: (exit code, or None on timeout; its stdout)."""
    mode = mode or sandbox_mode()
    workdir = tempfile.mkdtemp(prefix="verify-sandbox-")
    try:
        Path(workdir, "main.py").write_text(source, encoding="utf-8", errors="replace")
        if mode == "namespaces":
            os.mkdir(Path(workdir, "root"))  # the mount point of the program's own root (a tmpfs)
        elif mode == "nobody":
            os.chown(workdir, _test_uid(), _test_uid())  # its only writable directory
        command = _sandbox_command(mode, [INTERPRETER, "-I", "main.py"], _test_uid())
        with tempfile.TemporaryFile() as stdin_file, tempfile.TemporaryFile() as stdout_file:
            stdin_file.write((stdin_text or "").encode("utf-8", errors="replace"))
            stdin_file.seek(0)
            process = subprocess.Popen(
                command, cwd=workdir, env=SANDBOX_ENV,
                stdin=stdin_file if stdin_text is not None else subprocess.DEVNULL,
                stdout=stdout_file,  # a file, capped by RLIMIT_FSIZE: no pipe to fill or drain
                stderr=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=functools.partial(_limit_sandbox, timeout, _test_cgroup(os.getpid())))
            try:
                returncode = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                # Kill the process group (and, in "namespaces", with its first process the whole
                # PID namespace): also whatever the program left running after it exited.
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                process.wait()
            stdout_file.seek(0)
            stdout = stdout_file.read(CODE_FILE_BYTES).decode("utf-8", errors="replace")
        return returncode, stdout
    finally:
        _kill_children()
        remove_tree(workdir, wait=True)


def remove_tree(path: str, wait: bool) -> None:
    """rm -rf, which walks a tree of any depth (shutil.rmtree recurses: a program that made a directory
    3000 deep made it raise RecursionError). wait=False: in the background, so that the caller (the
    trainer's thread, replacing a worker) never waits for a program's thousands of files."""
    if wait:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", path], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        threading.Thread(target=remove_tree, args=(path, True), daemon=True).start()


def run_code_tests(program: str, tests: list[dict], timeout: float, pass_all: bool = False) -> tuple[float, str]:
    """Reward = fraction of tests passed; each test is one sandboxed run of the program, compared
    outside the sandbox (_passes):

    stdin/stdout test: exit code 0 and the same whitespace-separated tokens as expected (or, with
    "compare": "lines", LiveCodeBench's lines_match).
    call-based test: the program, then _CALL_HARNESS (the call; its value's repr as the last line).
    assert test: the program, then _VALUES_HARNESS (the values the assert reads from the program);
    the assert itself is checked in the worker on those values (parse_assert).
    script test: the program, then the whole test script (_SCRIPT_HARNESS), within one `timeout`.
    pass_all (a benchmark's pass/fail): the first failing test ends the run, as the benchmarks' own
    runners stop, so a program that loops costs one time limit, not one a test.
    """
    passed, first_failure = 0, ""
    for k, test in enumerate(tests):
        if "stdin" in test:
            returncode, stdout = _run_sandboxed(program, test["stdin"], timeout)
        else:
            harness = (_CALL_HARNESS.format(name=test["call"], args=test["args"]) if "call" in test else
                       _SCRIPT_HARNESS.format(script=test["script"]) if "script" in test else
                       _VALUES_HARNESS.format(names=test["names"], calls=", ".join(test["calls"])))
            returncode, stdout = _run_sandboxed(f"{program}\n\n{harness}", None, timeout)
        if _passes(test, returncode, stdout):
            passed += 1
        elif not first_failure:
            why = ("timeout" if returncode is None else
                   f"exit code {returncode}" if returncode != 0 else "wrong output")
            first_failure = f"test {k}: {why}"
            if pass_all:
                return 0.0, f"failed test {k} of {len(tests)}: {why}"
    if passed == len(tests):
        return 1.0, "ok"
    return passed / len(tests), f"passed {passed}/{len(tests)}; first failure {first_failure}"


# ---------------------------------------------------------------------------------------------------
# Worker pool (calling process)
# ---------------------------------------------------------------------------------------------------


@dataclass
class _Worker:
    process: subprocess.Popen
    scratch: str                 # its temporary directory (TMPDIR): removed with the worker
    ready: bool = False          # said hello (imports done, warmed up)
    item: int | None = None      # index in the batch of the item it is working on
    deadline: float = 0.0        # time.monotonic() by which it must be ready / answer


_pool: list[_Worker] = []
_pool_owner = 0                  # pid that started _pool (a forked child must not use it)
pool_lock = threading.Lock()    # one batch at a time through the pool
_failed_starts = 0               # workers in a row that died before saying ready
MAX_FAILED_STARTS = 3            # then the environment is broken (e.g. math-verify missing): raise


def _start_worker() -> _Worker:
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r}); import {WORKER_MODULE}; "
            f"{WORKER_MODULE}._worker_main({os.getpid()})")
    # The worker's sandboxes live in here: if it is killed mid-test, we still clean them up.
    scratch = tempfile.mkdtemp(prefix=f"verify-worker-{os.getpid()}-")
    os.chmod(scratch, 0o711)  # the sandbox user must be able to walk through to its directory
    # The worker asks to be killed when the thread that starts it exits (PR_SET_PDEATHSIG): call
    # score_batch from a long-lived thread, or each batch pays for new workers.
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, start_new_session=True,
                               env={**os.environ, "TMPDIR": scratch})
    return _Worker(process, scratch, deadline=time.monotonic() + WORKER_STARTUP_SECONDS)


def _stop_worker(worker: _Worker, kill: bool, wait: bool = False) -> None:
    """Stop a worker and remove its scratch directory: in the background (wait=False) when the
    trainer's thread is replacing it mid-batch, at once when the pool shuts down."""
    if kill:
        worker.process.kill()
    for pipe in (worker.process.stdin, worker.process.stdout):
        try:
            pipe.close()  # closing stdin asks a healthy worker to exit
        except OSError:
            pass
    try:
        worker.process.wait(timeout=2)
    except subprocess.TimeoutExpired:
        worker.process.kill()
        worker.process.wait()
    remove_tree(worker.scratch, wait=wait)
    _remove_test_cgroup(worker.process.pid)


def stop_pool(kill: bool) -> None:
    global _pool
    if _pool_owner == os.getpid():  # a forked child leaves its parent's workers alone
        for worker in _pool:
            _stop_worker(worker, kill, wait=True)
    _pool = []


def shutdown() -> None:
    """Stop the worker pool. Runs at exit; call it yourself to free the workers' memory earlier."""
    with pool_lock:
        stop_pool(kill=False)
    _remove_test_cgroup(os.getpid())  # the one sandbox_mode's probe ran in, here


atexit.register(shutdown)


def _resize_pool(n_workers: int) -> None:
    global _pool, _pool_owner
    if _pool_owner != os.getpid():  # first use, or we are a fork: its workers are not ours
        _pool, _pool_owner = [], os.getpid()
    for worker in [w for w in _pool if w.process.poll() is not None]:  # died between batches
        _pool.remove(worker)
        _stop_worker(worker, kill=True)
    while len(_pool) > n_workers:
        _stop_worker(_pool.pop(), kill=False)
    while len(_pool) < n_workers:
        _pool.append(_start_worker())


def _replace(worker: _Worker) -> None:
    _pool.remove(worker)
    _stop_worker(worker, kill=True)
    _pool.append(_start_worker())  # it warms up in the background; used once it says ready


def default_workers() -> int:
    """The CPUs this process may use, shared among the ranks on this node (torchrun sets
    LOCAL_WORLD_SIZE): 8 ranks on a 64-core node get 8 workers each, not 64."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _item_seconds(job: dict) -> float:
    """The parent's hard deadline for one item."""
    if job["kind"] == "code":  # per test: the timeout plus ~1 s to set up and tear down a sandbox
        return len(job["tests"]) * (job["timeout"] + 1.0) + 2.0
    return job["timeout"]


def run_jobs(jobs: dict[int, dict], n_workers: int) -> dict[int, tuple[float, str]]:
    """Run jobs (batch index -> request) on the pool; returns batch index -> (reward, reason)."""
    global _failed_starts
    _resize_pool(n_workers)
    todo, results, deaths = deque(jobs), {}, Counter()
    while len(results) < len(jobs):
        now = time.monotonic()
        for worker in list(_pool):  # 1. hand an item to every idle, ready worker
            if worker.ready and worker.item is None and todo:
                index = todo.popleft()
                try:
                    worker.process.stdin.write((json.dumps(jobs[index]) + "\n").encode())
                    worker.process.stdin.flush()
                    worker.item, worker.deadline = index, now + _item_seconds(jobs[index])
                except OSError:  # it died while idle: retry the item on another worker
                    todo.appendleft(index)
                    _replace(worker)
        # 2. wait for an answer, a hello, a death, or the next deadline
        waiting = [w for w in _pool if w.item is not None or not w.ready]
        next_deadline = min(w.deadline for w in waiting)
        readable = wait_for_readable([w.process.stdout for w in waiting],
                                     timeout=max(0.0, next_deadline - time.monotonic()))
        for worker in [w for w in waiting if w.process.stdout in readable]:
            line = worker.process.stdout.readline()
            if not line:  # EOF: the worker died
                code = worker.process.wait()
                if worker.item is not None:
                    deaths[worker.item] += 1
                    if deaths[worker.item] == 1:  # maybe not the item's fault (OOM killer...)
                        todo.appendleft(worker.item)
                    else:
                        results[worker.item] = (0.0, "error: verify worker died twice on this "
                                                     f"item (exit code {code})")
                elif not worker.ready:  # killed while starting (OOM killer?), or cannot start
                    _failed_starts += 1
                    if _failed_starts >= MAX_FAILED_STARTS:
                        raise RuntimeError(f"{_failed_starts} verify workers in a row exited while "
                                           f"starting, the last with code {code} (a traceback, if "
                                           "any, is on stderr above)")
                _replace(worker)
                continue
            message = json.loads(line)
            if not worker.ready:
                worker.ready, _failed_starts = True, 0
            else:
                results[worker.item] = (message["reward"], message["reason"])
                worker.item = None
        now = time.monotonic()  # 3. kill whoever is past its deadline
        late = [w for w in _pool if now >= w.deadline and (w.item is not None or not w.ready)]
        for worker in late:
            if not worker.ready:
                raise RuntimeError(f"verify worker not ready after {WORKER_STARTUP_SECONDS} s")
            results[worker.item] = (0.0, "timeout")
            _replace(worker)
    return results
