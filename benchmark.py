"""Benchmarks: every benchmark the PRIME and PASS papers report, read and scored as each paper's code does.

    BENCHMARKS[name]                      the table: file, kind, prompt, gold, generation cap
    load_benchmark(name, data_dir, limit, files, dates) -> list[Item]   a shipped file, or a release file
    messages(name, item, system_prompt)   the chat messages a model sees for one problem
    grade(name, items, texts, math_grader) -> list[Graded]              one verdict per response
    PANELS[name]                          a paper's table: its benchmarks, in its order, with its protocol

eval.py tells the story (load, generate, grade, report); this module holds what differs from one
benchmark to the next. Three kinds, each graded by verify.py, the grader train.py uses:
    math  the question + "Present the answer in LaTex format: \\boxed{Your answer}"; verify.py's math
          grader (math-verify; `--math-grader official`: the last box). Shipped in benchmarks/.
    code  LeetCode (shipped) and LiveCodeBench (its release file): the code block PRIME's evaluation
          reads (last ```python block holding a `def `), run in train.py's sandbox (sandbox.py) with the
          import header and time limits of the benchmark's own harness; a response passes only if every
          test passes.
    qa    HotpotQA, 2WikiMultihopQA, MuSiQue (their dev release files): labelled context paragraphs and
          sentences, the question and PASS's instruction ("... Final Answer: [Entity]"); SQuAD-normalised
          exact match (PASS's metric) and token F1, each the best over the answer's aliases.
Files that cannot ship (LiveCodeBench's tests, the QA sets with their contexts) are read from the file
their authors release, named with `eval.py --benchmark-file NAME=PATH` (docs/evaluation.md gives the
download commands); a benchmark whose file is missing stops with a message naming where to get it.
"""

import base64
import binascii
import json
import pickletools
import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

import toy_task
import verify
from data import MATH_SUFFIX, QA_SUFFIX, qa_context, read_rows

DATA_DIR = Path(__file__).resolve().parent / "benchmarks"  # the shipped benchmark files, from any cwd
TOY_PROBLEMS = 200          # toy_task.heldout_problems' default size, as in train.py
MATH_BENCHMARKS = ("math500", "gsm8k", "aime24", "amc23", "minerva", "olympiad")

# PRIME's evaluation system prompt (eval/system_prompt.md in github.com/PRIME-RL/PRIME), as its scripts
# read it: the file holds the two characters "\" "n" where a line break was meant, and the scripts pass
# them on unchanged, so this string does too.
PRIME_SYSTEM_PROMPT = (
    r"\nWhen tackling complex reasoning tasks, you have access to the following actions. Use them as needed "
    r"to progress through your thought process.\n\n[ASSESS]\n\n[ADVANCE]\n\n[VERIFY]\n\n[SIMPLIFY]\n\n"
    r"[SYNTHESIZE]\n\n[PIVOT]\n\n[OUTPUT]\n\nYou should strictly follow the format below:\n\n[ACTION NAME]\n\n"
    r"# Your action step 1\n\n# Your action step 2\n\n# Your action step 3\n\n...\n\nNext action: "
    r"[NEXT ACTION NAME]\n")
# PRIME's code benchmarks end the user message with this (evaluate_leetcode.py; LiveCodeBench's
# Qwen25Math/LLaMa3 styles in PRIME's copy of lcb_runner).
CODE_SUFFIX = "\n\nWrite Python code to solve the problem. Present the code in \n```python\nYour code\n```\nat the end."

# The import header each harness puts before the program. LeetCode's (DeepSeek-Coder's IMPORT_HELPER,
# PRIME's eval/utils/evaluation_leetcode.py) also imports numpy: the sandbox runs the base interpreter
# with the standard library only, so a solution that uses numpy fails here and may pass there.
LEETCODE_HEADER = "\n".join(
    f"import {m}" for m in ("math", "re", "sys", "copy", "datetime", "itertools", "collections", "heapq",
                            "functools", "hashlib", "string")) + \
    "\nfrom typing import *\nfrom collections import *\nfrom functools import *"
LEETCODE_SECONDS = 10.0   # evaluate_functional_correctness's timeout: the whole 100-assert suite
# LiveCodeBench's (lcb_runner/evaluation/testing_util.py): star imports, modules, a deep recursion limit.
_LCB_MODULES = ("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random",
                "statistics", "itertools", "functools", "operator", "io", "sys", "json")
LCB_HEADER = ("".join(f"from {m} import *\n" for m in _LCB_MODULES + ("builtins", "typing"))
              + "".join(f"import {m}\n" for m in _LCB_MODULES) + "sys.setrecursionlimit(6*10**5)")
LCB_SECONDS = 6.0         # its --timeout: per test
LCB_V2 = ("2023-05-01", "2024-05-31")   # PRIME's "LiveCodeBench (v2)" window (eval/run.sh), 511 problems


# ---------------------------------------------------------------------------------------------------
# Problems and the benchmark table
# ---------------------------------------------------------------------------------------------------


@dataclass
class Item:
    index: int     # position in the benchmark (0-based, after any row selection), as --limit counts it
    question: str  # the problem text, before any template or suffix (code: the whole user message body)
    gold: str | list | dict  # math: LaTeX; qa: the accepted aliases; code: verify.py's code reference
    id: str = ""   # the benchmark's own id (task_id, question_id, _id), for reading the results


def gold_answer(row: dict) -> str:
    """MATH-500, AIME, AMC: the `answer` field (AMC's is a JSON float such as 27.0, AIME 2025's an int)."""
    return str(row["answer"])


def gold_gsm8k(row: dict) -> str:
    """GSM8K: the text after the final `####` of `answer` ("... #### 1,600" -> "1,600"; math-verify
    reads the thousands separator, so a model writing 1600 is right)."""
    if "####" not in row["answer"]:
        raise ValueError("its 'answer' has no '####' before the final answer")
    return row["answer"].split("####")[-1].strip()


def gold_minerva(row: dict) -> str:
    """Minerva Math has no answer field: the gold is the last \\boxed{} of `solution`."""
    gold = verify.extract_boxed(row["solution"])
    if gold is None:
        raise ValueError("its 'solution' has no closed \\boxed{} to take the gold answer from")
    return gold


def gold_olympiad(row: dict) -> str:
    """OlympiadBench: `final_answer` is a list of one string, which may hold several answers
    ("$69$,$84$" when is_multiple_answer); joined with ", " if a list ever holds more."""
    if not isinstance(row["final_answer"], list) or not row["final_answer"]:
        raise ValueError(f"its 'final_answer' must be a non-empty list, got {row['final_answer']!r}")
    return ", ".join(str(a) for a in row["final_answer"])


# AIME 2025's `prompt` (QwQ's copy) ends with Qwen's instruction, which our suffix replaces.
_QWEN_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def question_aime25(row: dict) -> str:
    prompt = row["prompt"]
    if not prompt.endswith(_QWEN_SUFFIX):
        raise ValueError("its 'prompt' does not end with Qwen's instruction suffix (another copy of the file?)")
    return prompt[:-len(_QWEN_SUFFIX)]


def leetcode_gold(row: dict) -> dict:
    """LeetCode: the row's whole `test` script (a Solution instance, 100 input / assert pairs), run once
    after the program as PRIME's harness runs it: its import header, one process, 10 s for the suite."""
    return {"assert_script": row["test"], "header": LEETCODE_HEADER, "pass_all": True}


@dataclass(frozen=True)
class Benchmark:
    path: str                     # file under --data-dir; "" = a release file (--benchmark-file) or built in code
    kind: str                     # "math", "code" or "qa": how verify.py grades it
    question: Callable[[dict], str]
    gold: Callable[[dict], object]  # row -> gold (a missing field raises KeyError)
    rows: int = 0                 # rows in the shipped file (benchmarks/SOURCES.md), checked by the tests
    max_new_tokens: int = 3072    # default generation cap: the paper's max response length
    suffix: str = MATH_SUFFIX     # after the question in the user message; None = the raw problem text
    keep: Callable[[dict], bool] | None = None  # which rows of the file are the benchmark
    row_id: str = ""              # the field holding the benchmark's own id
    release: str = ""             # where its release file comes from (a release benchmark)


def field_of(name: str) -> Callable[[dict], str]:
    return lambda row: str(row[name])


BENCHMARKS = {
    "math500": Benchmark("math500/test.jsonl", "math", field_of("problem"), gold_answer, 500, row_id="unique_id"),
    "gsm8k": Benchmark("gsm8k/test.jsonl", "math", field_of("question"), gold_gsm8k, 1319),
    "aime24": Benchmark("aime24/test.jsonl", "math", field_of("problem"), gold_answer, 30, row_id="id"),
    "aime25": Benchmark("aime25/test.jsonl", "math", question_aime25, gold_answer, 30),
    "amc23": Benchmark("amc23/test.jsonl", "math", field_of("problem"), gold_answer, 40, row_id="id"),
    "minerva": Benchmark("minerva_math/test.jsonl", "math", field_of("problem"), gold_minerva, 272),
    "olympiad": Benchmark("olympiadbench/test.jsonl", "math", field_of("question"), gold_olympiad, 675, row_id="id"),
    # PRIME's own copies: its 83-problem AMC set is the "AMC" of PRIME's tables; its MATH-500 golds
    # are cleaned renderings of the same 500 answers; its AIME file holds 2022-2024 (90 problems), and
    # its AIME 2024 score is the 30 rows of 2024 (evaluate_aime.py counts 2024_AIME_I and _II).
    "prime_amc": Benchmark("prime_eval/aimo-validation-amc.jsonl", "math", field_of("question"), gold_answer, 83,
                           row_id="url"),
    "prime_aime": Benchmark("prime_eval/aimo-validation-aime.jsonl", "math", field_of("question"), gold_answer, 90,
                            row_id="url"),
    "prime_aime24": Benchmark("prime_eval/aimo-validation-aime.jsonl", "math", field_of("question"), gold_answer, 90,
                              keep=lambda row: "2024_AIME_I" in row["url"], row_id="url"),
    "prime_math500": Benchmark("prime_eval/math_test_cleaned.json", "math", field_of("problem"),
                               lambda row: str(row["expected_answer"]), 500, row_id="unique_id"),
    "leetcode": Benchmark("leetcode/test.jsonl", "code", field_of("prompt_sft"), leetcode_gold, 180,
                          max_new_tokens=8192, suffix=CODE_SUFFIX, row_id="task_id"),
    "livecodebench": Benchmark("", "code", None, None, max_new_tokens=4096, suffix=CODE_SUFFIX, row_id="question_id",
                               release="the `test*.jsonl` files of the Hugging Face dataset "
                                       "livecodebench/code_generation_lite (release_v2 = test.jsonl + test2.jsonl)"),
    "hotpotqa": Benchmark("", "qa", None, None, max_new_tokens=2048, suffix=QA_SUFFIX, row_id="_id",
                          release="hotpot_dev_distractor_v1.json from the HotpotQA site (hotpotqa.github.io)"),
    "2wiki": Benchmark("", "qa", None, None, max_new_tokens=2048, suffix=QA_SUFFIX, row_id="_id",
                       release="dev.json of 2WikiMultihopQA's data release (github.com/Alab-NII/2wikimultihop), "
                               "and its id_aliases.json as 2wiki-aliases"),
    "musique": Benchmark("", "qa", None, None, max_new_tokens=2048, suffix=QA_SUFFIX, row_id="id",
                         release="musique_ans_v1.0_dev.jsonl of MuSiQue's data release (github.com/StonyBrookNLP/musique)"),
    # The embedded default's held-out problems, the ones train.py reports start/end accuracy on.
    "toy": Benchmark("", "math", field_of("prompt"), lambda row: row["answer"], TOY_PROBLEMS, max_new_tokens=96,
                     suffix=None),
}
RELEASE_FILES = ("livecodebench", "hotpotqa", "2wiki", "2wiki-aliases", "musique")  # --benchmark-file names


def check_benchmark_names(text: str) -> list[str]:
    """"math500, gsm8k" -> ["math500", "gsm8k"]; an unknown name fails here, before any loading."""
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    for name in names:
        if name not in BENCHMARKS:
            raise SystemExit(f"--benchmarks: unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    if not names:
        raise SystemExit("--benchmarks: no benchmark named")
    return names


def missing_release(name: str, files: dict) -> str:
    """Why a release benchmark cannot run ("" if it can): its file was not named."""
    if BENCHMARKS[name].release and name not in files:
        return (f"{name} needs its release file: {BENCHMARKS[name].release}; then "
                f"--benchmark-file {name}=PATH (docs/evaluation.md has the download commands)")
    return ""


def load_benchmark(name: str, data_dir: str | Path = DATA_DIR, limit: int = 0, files: dict | None = None,
                   dates: tuple[str, str] = LCB_V2) -> list[Item]:
    """The problems of one benchmark (the first `limit` if limit > 0), each with its gold.

    A shipped benchmark reads its file under data_dir; a release benchmark reads files[name] (a list of
    paths: LiveCodeBench's release comes in several files), keeping LiveCodeBench's problems dated within
    `dates` (inclusive, as its compute_scores). A missing file, a missing field or an unreadable gold
    stops with a message naming the benchmark, the file, the row and the field.
        load_benchmark("gsm8k", DATA_DIR, 1)[0].gold -> "18"
    """
    check_benchmark_names(name)
    bench, files = BENCHMARKS[name], files or {}
    if missing_release(name, files):
        raise SystemExit(f"--benchmarks {name}: " + missing_release(name, files))
    if name == "toy":
        source = "toy_task.heldout_problems"
        rows = [{"prompt": p.prompt, "answer": p.answer} for p in toy_task.heldout_problems(limit or TOY_PROBLEMS)]
    elif bench.release:
        source = ", ".join(files[name])
        rows = RELEASE_READERS[name](files, dates)
    else:
        source = Path(data_dir) / bench.path
        rows = read_rows(source, "--data-dir")
    items = []
    for position, row in enumerate(rows):
        where = f"--benchmarks {name}: {source} row {position + 1}"
        try:
            if bench.keep and not bench.keep(row):
                continue
            if bench.release:  # the readers made each row an Item already
                items.append(Item(len(items), row["question"], row["gold"], row["id"]))
            else:
                items.append(Item(len(items), bench.question(row), bench.gold(row), str(row.get(bench.row_id, ""))))
        except KeyError as error:
            raise SystemExit(f"{where} has no field {error.args[0]!r} (fields: {sorted(row)}); "
                             "benchmarks/SOURCES.md says where each benchmark's gold is") from None
        except ValueError as error:
            raise SystemExit(f"{where}: {error}") from None
        if limit and len(items) == limit:
            break
    if not items:
        raise SystemExit(f"--benchmarks {name}: {source} holds no problems" +
                         (f" dated {dates[0]} to {dates[1]} (--lcb-dates)" if name == "livecodebench" else ""))
    return items


# ---------------------------------------------------------------------------------------------------
# Release files: LiveCodeBench, HotpotQA, 2WikiMultihopQA, MuSiQue, read as their authors publish them
# ---------------------------------------------------------------------------------------------------

# The pickle opcodes a private-test payload may hold: a protocol header, one string (or bytes), its memo
# entry, the end. Anything else (a global, a call, an object) is refused before anything is unpickled.
_STRING_OPS = {"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BINBYTES", "SHORT_BINBYTES",
               "BINBYTES8", "BINSTRING", "SHORT_BINSTRING", "STRING"}
_FRAME_OPS = {"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "STOP"}


def plain_pickled_string(blob: bytes, where: str) -> str:
    """The one string a pickle holds, read from its opcodes without unpickling anything:
    LiveCodeBench stores its private tests as base64(zlib(pickle(<a JSON string>))), and pickle.loads
    on such a file runs whatever callables it names. A payload that is anything but one str or bytes
    stops with an error naming it."""
    try:
        ops = list(pickletools.genops(blob))
    except ValueError as error:  # truncated, or not a pickle at all
        raise SystemExit(f"{where}: its private tests are not a readable pickle ({error})") from None
    strings = [argument for opcode, argument, _ in ops if opcode.name in _STRING_OPS]
    other = [opcode.name for opcode, _, _ in ops if opcode.name not in _STRING_OPS | _FRAME_OPS]
    if other or len(strings) != 1:
        raise SystemExit(f"{where}: its private tests are a pickle that holds "
                         + (f"{', '.join(dict.fromkeys(other))} (a call or an object" if other else
                            f"{len(strings)} strings (")
                         + ", not the one JSON string LiveCodeBench stores): refused, nothing was unpickled")
    value = strings[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def lcb_private_tests(text: str, where: str) -> list[dict]:
    """A release row's `private_test_cases`: JSON (early releases), or base64(zlib(pickle(JSON)))."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        blob = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (binascii.Error, zlib.error, UnicodeEncodeError, ValueError) as error:
        raise SystemExit(f"{where}: private_test_cases is neither JSON nor base64 of zlib data ({error})") from None
    try:
        return json.loads(plain_pickled_string(blob, where))
    except json.JSONDecodeError as error:
        raise SystemExit(f"{where}: private_test_cases' string is not JSON ({error})") from None


def lcb_prompt(row: dict) -> str:
    """LiveCodeBench's generic question template (lcb_runner/prompts/code_generation.py), which PRIME's
    copy puts in the user message before CODE_SUFFIX."""
    text = f"### Question:\n{row['question_content']}\n\n"
    if row["starter_code"]:
        text += ("### Format: You will use the following starter code to write the solution to the problem and "
                 f"enclose your code within delimiters.\n```python\n{row['starter_code']}\n```\n\n")
    else:
        text += ("### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not "
                 "directly test on the sample inputs). Enclose your code within delimiters as follows.\n"
                 "```python\n# YOUR CODE HERE\n```\n\n")
    return text + "### Answer: (use the provided format with backticks)\n\n"


def lcb_reference(row: dict, where: str) -> dict:
    """verify.py's code reference of one LiveCodeBench problem: public and private tests together, each
    test in its own sandboxed run within 6 s, pass only if every test passes. Functional tests call
    Solution().<func_name> (or the program's function) with one JSON value an input line; stdin tests
    compare with LiveCodeBench's lenient line rule (sandbox.lines_match)."""
    tests = json.loads(row["public_test_cases"]) + lcb_private_tests(row["private_test_cases"], where)
    if not tests:
        raise SystemExit(f"{where}: no tests")
    kinds = {t["testtype"] for t in tests}
    if kinds == {"functional"}:
        name = json.loads(row["metadata"]).get("func_name")
        if not name:
            raise SystemExit(f"{where}: functional tests, but metadata names no func_name")
        return {"fn_name": name, "inputs": [[json.loads(line) for line in t["input"].split("\n")] for t in tests],
                "outputs": [json.loads(t["output"]) for t in tests], "header": LCB_HEADER, "pass_all": True}
    if kinds == {"stdin"}:
        return {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests], "compare": "lines",
                "header": LCB_HEADER, "pass_all": True}
    raise SystemExit(f"{where}: test types {sorted(kinds)}; expected all 'functional' or all 'stdin'")


def read_livecodebench(files: dict, dates: tuple[str, str]) -> list[dict]:
    """The problems of LiveCodeBench's release files (jsonl rows as published), dated within `dates`,
    in file order, each once (a later release file repeating a question_id is skipped)."""
    start, end = (datetime.strptime(d, "%Y-%m-%d") for d in dates)
    out, seen = [], set()
    for path in files["livecodebench"]:
        for k, row in enumerate(read_release(path, "--benchmark-file livecodebench"), 1):
            where = f"--benchmark-file livecodebench={path} row {k}"
            try:
                if row["question_id"] in seen or not start <= datetime.fromisoformat(row["contest_date"]) <= end:
                    continue
                seen.add(row["question_id"])
                out.append({"question": lcb_prompt(row), "gold": lcb_reference(row, where), "id": row["question_id"]})
            except KeyError as error:
                raise SystemExit(f"{where} has no field {error.args[0]!r} (a code_generation_lite row?)") from None
            except (ValueError, TypeError) as error:
                raise SystemExit(f"{where}: {error}") from None
    return out


def qa_question(context, question: str) -> str:
    return f"Context:\n{qa_context(context)}\n\nQuestion: {question}"


def read_release(path: str, flag: str) -> list[dict]:
    """The rows of a release file, whatever its name says: one JSON list (HotpotQA, 2Wiki's dev.json) or
    JSON lines (LiveCodeBench, MuSiQue, 2Wiki's id_aliases.json). Errors name the flag, file and line."""
    if not Path(path).exists():
        raise SystemExit(f"{flag}={path}: file not found")
    text = Path(path).read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise SystemExit(f"{flag}={path}: line {number} is not JSON ({error})") from None
    rows = rows if isinstance(rows, list) else [rows]
    if not all(isinstance(row, dict) for row in rows):
        raise SystemExit(f"{flag}={path}: expected JSON objects, one a question")
    return rows


def read_hotpotqa(files: dict, dates=None) -> list[dict]:
    """HotpotQA dev (distractor): [{_id, question, answer, context: [[title, [sentences]]], ...}]."""
    return [{"question": qa_question(r["context"], r["question"]), "gold": [r["answer"]], "id": r["_id"]}
            for path in files["hotpotqa"] for r in read_release(path, "--benchmark-file hotpotqa")]


def read_2wiki(files: dict, dates=None) -> list[dict]:
    """2WikiMultihopQA dev: HotpotQA's layout; a row's `answer_id` keys the aliases of the optional
    id_aliases.json (JSON lines {"Q_id", "aliases", "demonyms"}), as the official script reads them."""
    aliases = {}
    for path in files.get("2wiki-aliases", []):
        for row in read_release(path, "--benchmark-file 2wiki-aliases"):
            aliases[row["Q_id"]] = list(row.get("aliases", [])) + list(row.get("demonyms", []))
    return [{"question": qa_question(r["context"], r["question"]),
             "gold": [r["answer"]] + [a for a in aliases.get(r.get("answer_id"), []) if a != r["answer"]],
             "id": r["_id"]}
            for path in files["2wiki"] for r in read_release(path, "--benchmark-file 2wiki")]


def read_musique(files: dict, dates=None) -> list[dict]:
    """MuSiQue-Ans dev (JSON lines): {id, paragraphs: [{title, paragraph_text, ...}], question, answer,
    answer_aliases, answerable}; an unanswerable row (MuSiQue-Full) is not a question of this benchmark."""
    return [{"question": qa_question(r["paragraphs"], r["question"]),
             "gold": [r["answer"]] + [a for a in r.get("answer_aliases", []) if a != r["answer"]], "id": r["id"]}
            for path in files["musique"] for r in read_release(path, "--benchmark-file musique")
            if r.get("answerable", True)]


RELEASE_READERS = {"livecodebench": read_livecodebench, "hotpotqa": read_hotpotqa, "2wiki": read_2wiki,
                   "musique": read_musique}


# ---------------------------------------------------------------------------------------------------
# Prompts and grading
# ---------------------------------------------------------------------------------------------------


def messages(name: str, item: Item, system_prompt: str = "") -> list[dict] | str:
    """The chat messages of one problem: the question and the benchmark's suffix as the user message,
    after an optional system message (what train.py builds from a data row); the raw text for `toy`."""
    bench = BENCHMARKS[name]
    if bench.suffix is None:
        return item.question
    out = [{"role": "user", "content": item.question + bench.suffix}]
    return ([{"role": "system", "content": system_prompt}] + out) if system_prompt else out


def prime_code(response: str) -> str:
    """The program PRIME's code evaluation reads from a response (evaluate_leetcode.py's match_code, and
    the extract_code of its copy of lcb_runner): the last ```python block that holds a `def `, else the
    last ```python block; else the same over untagged ``` blocks; else the text before the first ```."""
    for pattern in (r"```python(.*?)```", r"```(.*?)```"):
        blocks = re.findall(pattern, response, re.DOTALL)
        if blocks:
            return next((b for b in reversed(blocks) if "def " in b), blocks[-1])
    return response.split("```")[0]


def leetcode_program(response: str) -> str:
    """PRIME's LeetCode program: prime_code, wrapped in `class Solution:` (each line indented) when the
    code has none, as evaluate_leetcode.py does before it runs the tests."""
    code = prime_code(response)
    if "class Solution:" not in code:
        code = "class Solution:\n" + "\n".join("    " + line for line in code.split("\n"))
    return code


@dataclass
class Graded:
    correct: bool         # the benchmark's pass: math right, every code test passed, QA exact match
    format: int           # verify.py's format channel (one box / one code block / one "Final Answer:")
    answer: str | None    # what was read as the answer (the boxed text, the QA answer; None for code)
    reason: str           # verify.py's reason ("ok", "wrong", "passed 3/100; ...", "timeout")
    f1: float | None = None  # QA: SQuAD token F1, best alias


def grade(name: str, items: list[Item], texts: list[str], math_grader: str = "math-verify") -> list[Graded]:
    """One verdict per response; items[i] is the problem texts[i] answers. Every response goes through
    verify.score_batch, the grader train.py uses; code with the benchmark's own extraction, harness
    header and time limit."""
    kind = BENCHMARKS[name].kind
    golds = [item.gold for item in items]
    if kind == "math":
        scores = verify.score_batch(texts, golds, ["math"] * len(texts), math_grader=math_grader,
                                    questions=[item.question for item in items])
        return [Graded(s.reward == 1.0, s.format, verify.extract_boxed(t), s.reason) for s, t in zip(scores, texts)]
    if kind == "qa":
        scores = verify.score_batch(texts, golds, ["qa"] * len(texts))
        answers = [verify.qa_answer(t) for t in texts]
        return [Graded(s.reward == 1.0, s.format, a, s.reason, verify.f1_score(a, g) if a is not None else 0.0)
                for s, a, g in zip(scores, answers, golds)]
    program = leetcode_program if name == "leetcode" else prime_code
    fenced = [f"```python\n{program(t)}\n```" for t in texts]  # what PRIME's scripts hand their runner
    scores = verify.score_batch(fenced, golds, ["code"] * len(texts),
                                timeout=LEETCODE_SECONDS if name == "leetcode" else LCB_SECONDS)
    return [Graded(s.reward == 1.0, verify.code_format(t), None, s.reason) for s, t in zip(scores, texts)]


# ---------------------------------------------------------------------------------------------------
# The papers' tables
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    n: int = 16
    greedy: bool = False
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 0   # 0 = the benchmark's own cap


@dataclass(frozen=True)
class Panel:
    title: str
    members: tuple[tuple[str, str, Protocol], ...]   # (benchmark, the paper's column name, protocol)
    system_prompt: str = ""
    notes: tuple[str, ...] = field(default=())


_GREEDY = Protocol(n=1, greedy=True)
PANELS = {
    # PRIME Table 2: greedy pass@1 with PRIME's system prompt; PRIME's own AIME, AMC and MATH-500 files;
    # caps as its scripts set them (MATH-500 and LeetCode 8192, AIME, AMC and Qwen's 4096);
    # LiveCodeBench with its runner's n = 10, T = 0.2, top-p 0.95, 4096 tokens.
    "prime": Panel("PRIME, Table 2 (greedy pass@1)", (
        ("prime_aime24", "AIME 2024", Protocol(1, True, max_new_tokens=4096)),
        ("prime_amc", "AMC", Protocol(1, True, max_new_tokens=4096)),
        ("prime_math500", "MATH-500", Protocol(1, True, max_new_tokens=8192)),
        ("minerva", "MinervaMath", Protocol(1, True, max_new_tokens=4096)),
        ("olympiad", "OlympiadBench", Protocol(1, True, max_new_tokens=4096)),
        ("leetcode", "LeetCode", Protocol(1, True, max_new_tokens=8192)),
        ("livecodebench", "LiveCodeBench", Protocol(10, False, 0.2, 0.95, 4096))),
        system_prompt=PRIME_SYSTEM_PROMPT,
        notes=("PRIME ran MinervaMath and OlympiadBench through Qwen2.5-Math's evaluation with its own "
               "prompt; here they get PRIME's system prompt and suffix like the other math benchmarks",)),
    # PASS Table 1 (and Table 5's pass@8): T 1.0, top-p 0.95, 2048 tokens; PASS sampled 32 to 128 a problem.
    "pass-math": Panel("PASS, Table 1 (pass@1) and Table 5 (pass@8)", tuple(
        (name, label, Protocol(32, False, 1.0, 0.95, 2048)) for name, label in (
            ("aime24", "AIME24"), ("aime25", "AIME25"), ("amc23", "AMC23"), ("gsm8k", "GSM8K"),
            ("math500", "MATH"), ("minerva", "Minerva"), ("olympiad", "Olympiad")))),
    # PASS Table 3: 16 responses a question at T 1.0, top-p 0.9 (its App. G), exact match.
    "pass-qa": Panel("PASS, Table 3 (exact match, 16 samples)", tuple(
        (name, label, Protocol(16, False, 1.0, 0.9, 2048)) for name, label in (
            ("musique", "MuSiQue"), ("2wiki", "2Wiki"), ("hotpotqa", "HotpotQA")))),
}
