"""The code sandbox and the worker pool behind verify.py: where untrusted programs and slow math run.

    run_jobs(jobs, n_workers) -> {i: (reward, reason)}   every job in a pool of worker processes
    run_code_tests(program, tests, timeout)            (in a worker) each test in its own sandbox
    sandbox_mode() -> str                               which defences this machine allows
    shutdown()                                          stop the pool (also runs at exit)

verify.py holds the reward functions and the worker's side of the protocol (`verify._worker_main`,
one job at a time, JSON lines on stdin/stdout); this module starts, feeds, times and replaces the
workers, and runs each code test as a sandboxed process. verify.py's docstring ("Design", 2-5)
describes the time limits and the sandbox's modes and what each protects against.
"""

import atexit
import ctypes
import functools
import json
import math
import os
import pwd
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
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# Appended to the program for a call-based test. Like the APPS/TACO graders: a `class Solution`
# (LeetCode style) is instantiated and its method called, else the plain function; a returned tuple
# equals a list (JSON has no tuples; here at any depth), and an expected value wrapped in a
# one-element list (as TACO stores many) also matches the unwrapped one. No float tolerance.
_CALL_HARNESS = """
import json as _json
def _lists(x):
    return [_lists(v) for v in x] if isinstance(x, (list, tuple)) else x
_target = Solution().{name} if "Solution" in globals() and hasattr(Solution, {name!r}) else {name}
_out = _lists(_target(*_json.loads({args!r})))
_expected = _json.loads({expected!r})
if _out == _expected or (isinstance(_expected, list) and len(_expected) == 1 and _out == _expected[0]):
    print({token!r})
"""


def _sandbox_user() -> tuple[int, int]:
    """(uid, gid) of `nobody`, the user sandboxed programs run as when we are root."""
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _as_nobody(program: list[str]) -> list[str]:
    """Run `program` as `nobody`, with no way to regain privileges (setpriv, from util-linux).

    setpriv sets the parent-death signal again after the change of user (which clears it), so the
    program dies with the process that started it.
    """
    uid, gid = _sandbox_user()
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
            "--pdeathsig", "SIGKILL", "--", *program]


# Runs as root inside the new namespaces: give the program empty private temporary directories,
# then run it (as `nobody`, via setpriv). `sh` stays the namespace's first process (no `exec`): it
# has unshare's parent-death signal, and when it dies the kernel kills every process in the
# namespace, including those that left the process group.
_NAMESPACE_SCRIPT = """
work=$PWD
for d in /tmp /var/tmp /dev/shm; do
  if [ -d "$d" ]; then mount -t tmpfs -o size=16m,mode=1777 tmpfs "$d" || exit 125; fi
done
if [ ! -d "$work" ]; then  # it was under a masked directory: bind it back at the same path
  mkdir -p "$work" && mount --no-canonicalize --bind . "$work" || exit 125
fi
cd "$work" && unset PWD OLDPWD || exit 125
"$@"
exit $?
"""


def _sandbox_command(mode: str, program: list[str]) -> list[str]:
    if mode == "rlimits":
        return program
    if mode == "nobody":
        return _as_nobody(program)
    return ["unshare", "--pid", "--net", "--mount", "--mount-proc", "--fork", "--kill-child", "--",
            "sh", "-c", _NAMESPACE_SCRIPT, "sh", *_as_nobody(program)]


@functools.cache
def sandbox_mode() -> str:
    """"namespaces", "nobody" or "rlimits": the code-sandbox defences available (see the top).

    Found once per process by running a tiny program exactly as real ones are run.
    """
    if os.geteuid() != 0:
        return "rlimits"
    if not shutil.which("setpriv"):
        raise RuntimeError("code sandbox: we run as root, and without util-linux's `setpriv` "
                           "programs would run as root too; install it (or run as another user)")
    uid = str(_sandbox_user()[0])
    probe = [sys.executable, "-I", "-c", "import os; print(os.getuid())"]
    run = functools.partial(subprocess.run, capture_output=True, timeout=60, env=SANDBOX_ENV,
                            cwd="/", stdin=subprocess.DEVNULL)
    if shutil.which("unshare"):
        try:
            result = run(_sandbox_command("namespaces", probe))
            if result.returncode == 0 and result.stdout.decode().strip() == uid:
                return "namespaces"
        except (OSError, subprocess.SubprocessError):
            pass  # e.g. a container without CAP_SYS_ADMIN
    result = run(_sandbox_command("nobody", probe))
    if result.returncode == 0 and result.stdout.decode().strip() == uid:
        return "nobody"
    # Typically a Python under /root, which `nobody` may not enter: every code test would fail.
    raise RuntimeError(f"code sandbox: user 'nobody' cannot run {sys.executable}: "
                       f"{result.stderr.decode(errors='replace')[-300:]}")


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


def _limit_sandbox(timeout: float) -> None:
    """Pre-exec hook of a sandbox (runs in the child between fork and exec); children inherit it."""
    cpu_seconds = math.ceil(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    lower_limit(resource.RLIMIT_AS, CODE_MEMORY_BYTES)
    lower_limit(resource.RLIMIT_FSIZE, CODE_FILE_BYTES)
    lower_limit(resource.RLIMIT_NPROC, CODE_MAX_PROCESSES)
    lower_limit(resource.RLIMIT_NOFILE, CODE_MAX_OPEN_FILES)
    lower_limit(resource.RLIMIT_CORE, 0)
    set_parent_death_signal()  # if the worker dies, so does the sandbox (unshare, setpriv, python)


def _run_sandboxed(source: str, stdin_text: str | None, timeout: float) -> tuple[int | None, str]:
    """Run a Python program in the sandbox: (exit code, or None on timeout; its stdout)."""
    mode = sandbox_mode()
    workdir = tempfile.mkdtemp(prefix="verify-sandbox-")
    try:
        Path(workdir, "main.py").write_text(source, encoding="utf-8", errors="replace")
        if mode != "rlimits":
            os.chown(workdir, *_sandbox_user())  # its only writable directory
        command = _sandbox_command(mode, [sys.executable, "-I", "main.py"])
        with tempfile.TemporaryFile() as stdin_file, tempfile.TemporaryFile() as stdout_file:
            stdin_file.write((stdin_text or "").encode("utf-8", errors="replace"))
            stdin_file.seek(0)
            process = subprocess.Popen(
                command, cwd=workdir, env=SANDBOX_ENV,
                stdin=stdin_file if stdin_text is not None else subprocess.DEVNULL,
                stdout=stdout_file,  # a file, capped by RLIMIT_FSIZE: no pipe to fill or drain
                stderr=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=functools.partial(_limit_sandbox, timeout))
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
        shutil.rmtree(workdir, ignore_errors=True)


def run_code_tests(program: str, tests: list[dict], timeout: float) -> tuple[float, str]:
    """Reward = fraction of tests passed; each test is one sandboxed run of the program.

    stdin/stdout test: exit code 0 and the same whitespace-separated tokens as expected.
    assert test: the program, then the assert, then a print of a random token; passes on exit
    code 0 with the token as the last line (so `exit(0)` at the top does not pass every test).
    call-based test: the program, then `_CALL_HARNESS` (call, compare, print the token); the same rule.
    """
    passed, first_failure = 0, ""
    for k, test in enumerate(tests):
        if "call" in test or "assert" in test:  # the program, then a check that prints a random token
            token = os.urandom(8).hex()
            if "call" in test:  # call-based: a call of its function and a comparison
                source = program + "\n" + _CALL_HARNESS.format(name=test["call"], args=test["args"],
                                                               expected=test["expected"], token=token)
            else:
                source = f"{program}\n\n{test['assert']}\nprint({token!r})\n"
            returncode, stdout = _run_sandboxed(source, None, timeout)
            lines = stdout.strip().splitlines()
            ok_output = bool(lines) and lines[-1].strip() == token
        else:
            returncode, stdout = _run_sandboxed(program, test["stdin"], timeout)
            ok_output = stdout.split() == test["stdout"].split()
        if returncode == 0 and ok_output:
            passed += 1
        elif not first_failure:
            why = ("timeout" if returncode is None else
                   f"exit code {returncode}" if returncode != 0 else "wrong output")
            first_failure = f"test {k}: {why}"
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


def _stop_worker(worker: _Worker, kill: bool) -> None:
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
    shutil.rmtree(worker.scratch, ignore_errors=True)


def stop_pool(kill: bool) -> None:
    global _pool
    if _pool_owner == os.getpid():  # a forked child leaves its parent's workers alone
        for worker in _pool:
            _stop_worker(worker, kill)
    _pool = []


def shutdown() -> None:
    """Stop the worker pool. Runs at exit; call it yourself to free the workers' memory earlier."""
    with pool_lock:
        stop_pool(kill=False)


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
