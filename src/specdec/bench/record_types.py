"""The types of the fields the report reads, per record type of a results file.

A results file is data: it may come from another machine, an older version or an editor.
``record_problem`` says what is wrong with a record whose fields have the right names but
the wrong types (``"k": "x"``, ``"reached": {"a": 1}``, ``"time_split": [1]``); the reader
counts such a record as unreadable, as it does one with missing fields, instead of the
report failing deep inside with a TypeError.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _num(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (_int(x) or isinstance(x, float)) and math.isfinite(x)


def _opt(check: Check) -> Check:
    return lambda x: x is None or check(x)


def _str(x: Any) -> bool:
    return isinstance(x, str)


def _list_of(check: Check) -> Check:
    return lambda x: isinstance(x, list) and all(check(v) for v in x)


def _dict_of(check: Check) -> Check:
    return lambda x: (
        isinstance(x, dict) and all(isinstance(k, str) and check(v) for k, v in x.items())
    )


def _dict(x: Any) -> bool:
    return isinstance(x, dict)


def _any(x: Any) -> bool:
    return True


_OPT_NUM = _opt(_num)
_NONNEG_INT: Check = lambda x: _int(x) and x >= 0  # noqa: E731

MEASUREMENT: Mapping[str, Check] = {
    "config": _str,
    "mode": _str,
    "prompt_id": _str,
    "repeat": _NONNEG_INT,
    "k": _NONNEG_INT,
    "category": _str,
    "fine_category": _opt(_str),
    "tokens_per_second": _OPT_NUM,
    "speedup": _OPT_NUM,
    "plain_tokens_per_second": _OPT_NUM,
    "predicted_speedup": _OPT_NUM,
    "ttft": _OPT_NUM,
    "t_total": _OPT_NUM,
    "t_prefill": _OPT_NUM,
    "t_decode": _OPT_NUM,
    "n_tokens": _opt(_NONNEG_INT),
    "prompt_tokens": _opt(_NONNEG_INT),
    "rounds": _opt(_NONNEG_INT),
    "drafted": _opt(_NONNEG_INT),
    "mean_accepted_per_round": _OPT_NUM,
    "mean_tokens_per_round": _OPT_NUM,
    "reached": _opt(_list_of(_NONNEG_INT)),
    "accepted": _opt(_list_of(_NONNEG_INT)),
    "draft_lengths": _opt(_list_of(_num)),
    "time_split": _opt(_dict_of(_OPT_NUM)),
    "tokens": _opt(_list_of(_int)),
    "drafter": _opt(_str),
    "finish_reason": _opt(_str),
}
PROFILE: Mapping[str, Check] = {
    "config": _str,
    "context_tokens": _opt(_int),
    "verify_n": _opt(_list_of(_int)),
    "verify_s": _opt(_list_of(_OPT_NUM)),
    "verify_ratio": _opt(_list_of(_OPT_NUM)),
    "target_step_s": _OPT_NUM,
    "draft_step_s": _OPT_NUM,
    "c": _OPT_NUM,
    "c_flops": _OPT_NUM,
    "draft_kind": _opt(_str),
}
HEADER: Mapping[str, Check] = {
    "session": _opt(_int),
    "started": _opt(_str),
    "argv": _opt(_list_of(_str)),
    "machine": _opt(_dict),
    "versions": _opt(_dict),
    "git": _opt(_dict),
    "plan": _opt(_dict),
    "prompts": _any,
}
SKIP: Mapping[str, Check] = {
    "config": _str,
    "prompt_id": _opt(_str),
    "category": _opt(_str),
    "reason": _opt(_str),
}
TYPES: Mapping[str, Mapping[str, Check]] = {
    "measurement": MEASUREMENT,
    "profile": PROFILE,
    "header": HEADER,
    "skip": SKIP,
}


def record_problem(rec: Mapping[str, Any]) -> str | None:
    """The first field of ``rec`` whose value has the wrong type (None when all are right;
    fields the report does not read are not checked)."""
    checks = TYPES.get(str(rec.get("type")), {})
    for name, ok in checks.items():
        if name in rec and not ok(rec[name]):
            return name
    if rec.get("type") == "measurement":
        reached, accepted = rec.get("reached"), rec.get("accepted")
        lists = isinstance(reached, list) and isinstance(accepted, list)
        if lists and len(reached) != len(accepted):  # type: ignore[arg-type]
            return "accepted"
    if rec.get("type") == "header":
        plan = rec.get("plan")
        if isinstance(plan, dict) and not _plan_ok(plan):
            return "plan"
    return None


def _plan_ok(plan: Mapping[str, Any]) -> bool:
    configs = plan.get("configs", [])
    return isinstance(configs, list) and all(
        isinstance(c, dict) and isinstance(c.get("label", ""), str) for c in configs
    )
