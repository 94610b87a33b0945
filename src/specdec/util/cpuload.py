"""How much of the machine other processes used while this one measured something.

A cost measured while another job keeps the cores busy is that job's, not this machine's
(prefill measured at 21.7 tok/s on a busy machine against 244 quiet, and then cached for
good). The criterion is direct: the kernel's count of busy CPU time over all cores
(``/proc/stat``: user, nice, system, irq, softirq and steal, the time a hypervisor gave to
other machines) less this process's own CPU time and that of its children it has waited for
(``os.times``: a measurement's worker processes, such as exact_price's, are its own work, not
other load), as a share of the cores' wall time over the measurement. Above ``BUSY_SHARE``
(a quarter of the machine: half a core of two), the measurement is called taken under load.
Where ``/proc/stat`` cannot be read (not Linux), nothing can be told (``None``).

``$SPECDEC_BUSY_SHARE`` sets the share (1 turns the check off: the test suite, which runs
beside other jobs, sets it so).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import ConfigError

BUSY_SHARE = 0.25
BUSY_SHARE_ENV = "SPECDEC_BUSY_SHARE"


@dataclass(frozen=True)
class CpuSample:
    """One reading: wall clock, all cores' busy and total time, this process's CPU time (its
    waited-for children's included)."""

    wall_s: float
    busy_s: float
    total_s: float
    own_s: float


def sample(stat: Path = Path("/proc/stat")) -> CpuSample | None:
    """Now, or None where the kernel's counts cannot be read."""
    try:
        first = stat.read_text().splitlines()[0].split()
        ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if first[0] != "cpu" or len(ticks) < 8 or hz <= 0:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    busy = user + nice + system + irq + softirq + steal
    own = os.times()
    return CpuSample(
        wall_s=time.monotonic(),
        busy_s=busy / hz,
        total_s=(busy + idle + iowait) / hz,
        own_s=own.user + own.system + own.children_user + own.children_system,
    )


def others_share(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """The share (0..1) of all cores' time between two samples that other processes used;
    None when it cannot be told (a sample missing, or too short an interval to count)."""
    if before is None or after is None:
        return None
    total = after.total_s - before.total_s
    if total <= 0.05:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return min(1.0, max(0.0, others / total))


def busy_limit() -> float:
    """``$SPECDEC_BUSY_SHARE`` or BUSY_SHARE; a bad value is a ConfigError naming it."""
    raw = os.environ.get(BUSY_SHARE_ENV, "").strip()
    if not raw:
        return BUSY_SHARE
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 1):
        raise ConfigError(f"${BUSY_SHARE_ENV} must be a share in (0, 1], got {raw!r}")
    return value


def under_load(share: float | None) -> bool:
    """Whether a measurement during which others used ``share`` of the machine was taken under
    load (False when that cannot be told, or with the check off)."""
    limit = busy_limit()
    return share is not None and limit < 1 and share > limit
