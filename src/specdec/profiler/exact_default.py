"""Whether exact numerics are the default for a llama.cpp target on this machine: decided once
per machine, llama.cpp build, model and thread count, in seconds, and cached.

Exact numerics (``models.exact``) make speculative output plain decoding's token for token.
Where the installed llama.cpp is the patched build (``make install``:
``patches/ggml-cpu-repack-row-invariant.patch``) they cost a few per cent at most on the CPUs
the patch covers, and they are the default unless ``profiler.exact_price`` measures one of the
plain step, a short verify pass and prefill more than ``DEFAULT_MAX_COST`` (3 %) dearer than
llama.cpp's own numerics in every round: two to four rounds of short worker processes, about a
minute for the 1.5B on 2 cores, the first time a target is loaded without ``exact`` said
either way. The
verdict and its figures are cached (``profiler.cache``, keyed by the machine, the package
versions, the SHA-256 of the libggml-cpu that would run, the model and the threads), so later
loads decide at once; a full ``specdec profile`` decides the same way and its decision wins.

Where the build has no row-invariant mode (the stock llama.cpp, or a user's own build), exact
numerics move llama.cpp's fast batched kernels off and cost about 20 % here: they stay a mode
(``--exact``) and one line says why, once (that verdict is cached too). A cached entry that
is not a verdict (damaged, another version) is ignored and the decision made again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specdec.errors import SpecdecError
from specdec.profiler import cache
from specdec.profiler.exact_price import (
    DEFAULT_MAX_COST,
    VERIFY_ROWS,
    ExactPrice,
    measure_exact_price,
)
from specdec.util import cpuload
from specdec.util.printable import printable

Log = Callable[[str], None]
FORMAT = 2  # of the cached entry (2: per-round figures, the every-round rule; 1 is decided again)


@dataclass(frozen=True)
class ExactDefault:
    """The decision and why: ``exact`` the default or not, ``reason`` one line, ``price`` the
    measured figures (None where nothing was measured: a build without the mode)."""

    exact: bool
    reason: str
    price: ExactPrice | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "exact": self.exact,
            "reason": self.reason,
            "price": None if self.price is None else self.price.to_dict(),
        }

    @staticmethod
    def from_dict(data: object) -> ExactDefault | None:
        """The decision a cache entry holds, or None where it holds none (then it is made
        again)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        exact, reason, price = data.get("exact"), data.get("reason"), data.get("price")
        if not isinstance(exact, bool) or not isinstance(reason, str):
            return None
        measured: ExactPrice | None = None
        if price is not None:
            try:
                measured = ExactPrice.from_dict(price)  # every figure a number > 0
            except ValueError:
                return None
            if measured.default != exact:  # figures and verdict disagree: not ours
                return None
        # the reason is printed: a file's string, escaped (no terminal escape reaches stderr)
        return ExactDefault(exact, printable(reason, 500), measured)


NO_MODE = (
    "exact numerics are not the default here: this llama.cpp build has no row-invariant mode "
    "(the stock library), where they cost about 20 %; `make install` builds the patched one "
    "(`--exact` forces them, `--no-exact` keeps this)"
)


def decide(price: ExactPrice) -> ExactDefault:
    """The decision from measured figures (pure): the default when every figure costs at most
    ``DEFAULT_MAX_COST``."""
    if price.default:
        why = (
            "exact numerics are the default here (no figure costs more than "
            f"{DEFAULT_MAX_COST:.0%} in every round)"
        )
    else:
        why = (
            f"exact numerics are not the default here: they cost more than "
            f"{DEFAULT_MAX_COST:.0%} in every round (`--exact` forces them)"
        )
    return ExactDefault(price.default, f"{why}: {price.sentence()}", price)


def summary(exact: bool, decision: ExactDefault | None, why: str = "") -> str:
    """One line for a user: whether exact numerics are on, what they cost here and why
    (``why``: a reason that overrides the decision's, e.g. a load that refused them)."""
    if exact:
        head = "exact numerics on: speculative output is plain decoding's, token for token"
    else:
        head = "exact numerics off: speculative output follows the target's distribution"
    if why:
        return f"{head} ({why})"
    if decision is None:
        return head + " (as asked)"
    p = decision.price
    if p is None or p.verify_cost is None:
        return f"{head} ({decision.reason})"
    cost = (
        f"plain step {p.decode_cost:+.1%}, {VERIFY_ROWS}-token verify {p.verify_cost:+.1%}, "
        f"prefill {p.prefill_cost:+.1%} time here"
    )
    if exact == decision.exact:
        return f"{head} ({cost}; measured once, cached)"
    return f"{head} (as asked; exact numerics cost {cost})"


def cached_decision(model: str, n_threads: int | None) -> ExactDefault | None:
    """The cached decision for ``model`` (a store name or a GGUF path), or None: nothing is
    measured here."""
    from specdec.models.llamacpp import build_identity

    ident = build_identity()
    if ident is None:
        return None
    return ExactDefault.from_dict(cache.load_cached(default_key(model, n_threads, *ident)))


def _cached(key: str, log: Log) -> ExactDefault | None:
    """The decision cached under ``key``; a damaged entry is None with one line to ``log``."""
    entry = cache.load_cached(key, log=log)
    hit = ExactDefault.from_dict(entry)
    if hit is None and entry is not None:
        where = cache.profile_dir() / f"{key}.json"
        log(f"ignoring the damaged exact-numerics decision {where}: deciding again")
    return hit


def default_key(model: str, n_threads: int | None, lib_sha256: str, version: int) -> str:
    settings = {
        "kind": "exact-default",
        "format": FORMAT,
        # None runs on every core (models.llamacpp): one decision for both spellings
        "n_threads": n_threads or max(1, os.cpu_count() or 1),
        "lib": lib_sha256,
        "row_invariant": version,
        "max_cost": DEFAULT_MAX_COST,
    }
    return cache.profile_key(target=model, drafts=(), settings=settings, prompts=[])


Measure = Callable[[str, int | None], ExactPrice]


def exact_default(
    model: str,
    path: str,
    n_threads: int | None,
    *,
    log: Log = lambda _: None,
    measure: Measure | None = None,
    identity: tuple[str, int] | None = None,
) -> ExactDefault:
    """The decision for the GGUF at ``path`` (``model``: its store name or path, for the key):
    cached, else made now (``log`` hears it once, with the figures when measured). A "no"
    measured while other processes kept the machine busy (``util.cpuload``: their share of
    the CPUs over the measurement, the measurement's own worker processes not counted, above
    ``$SPECDEC_BUSY_SHARE``, a quarter by default) serves this run and is not cached: a busy
    machine's noise exceeds the 3 % rule's margin, and a cached no would cost the user
    exactness for good; it is measured again at the next use. A "yes" is cached however busy
    the machine was (its error costs speed, not exactness), and so is a build's failure to
    run them. A cache that cannot be written leaves the decision to this run, in one line.
    ``measure`` and ``identity`` replace the measurement and the build's identity (tests)."""
    if identity is None:
        from specdec.models.llamacpp import build_identity

        identity = build_identity()
    ident = identity
    if ident is None:
        return ExactDefault(False, "exact numerics: llama-cpp-python is not installed")
    lib_sha, version = ident
    key = default_key(model, n_threads, lib_sha, version)
    hit = _cached(key, log)
    if hit is not None:
        return hit
    if version <= 0:
        decision = ExactDefault(False, NO_MODE)
    else:
        log(
            "exact numerics (speculative output = plain decoding, token for token): measuring "
            "what they cost on this machine, once (about a minute)"
        )
        before = cpuload.sample()
        try:
            decision = decide((measure or _measure)(path, n_threads))
        except SpecdecError as e:  # exact numerics do not even load here (NotExactError...)
            decision = ExactDefault(
                False,
                f"exact numerics are not the default here: they failed to run ({printable(e)})",
            )
        else:
            share = cpuload.others_share(before, cpuload.sample())
            if not decision.exact and cpuload.under_load(share):
                assert share is not None
                log(decision.reason)
                log(
                    f"(measured while the machine was busy: other processes used {share:.0%} "
                    "of the CPUs; this no serves this run, is not cached and is measured "
                    "again at the next use)"
                )
                return decision
    log(decision.reason)
    try:
        cache.save(key, decision.to_dict())
    except (OSError, SpecdecError) as e:  # decided for this run; said once, in one line
        log(f"could not cache the exact-numerics decision in {cache.profile_dir()}: {printable(e)}")
    return decision


def _measure(path: str, n_threads: int | None) -> ExactPrice:
    return measure_exact_price(path, n_threads, rounds=2)
