"""What the client can send at once, checked before a run starts.

Every request in flight holds a connection, and every connection a file descriptor. A
process that may open 1,024 files (a common default of ``ulimit -n``) cannot hold 3,000
connections: without this check the run failed part-way with "Too many open files" from
inside the HTTP client. The soft limit is raised to what the run needs when the hard limit
allows it (an ordinary thing for a process to do); otherwise the run is refused with the
numbers. ``MAX_CONCURRENCY`` is the stated maximum of requests in flight per server (bench's
clients, certify's --concurrency).
"""

from __future__ import annotations

from specdec.errors import ConfigError

RESERVED_FDS = 64  # standard streams, the results file, the interpreter's own, a margin
MAX_CONCURRENCY = 4096  # requests in flight at once per server, the stated maximum


def ensure_open_files(connections: int, what: str) -> None:
    """Make sure the process may hold ``connections`` sockets besides RESERVED_FDS other
    files: raise the soft limit within the hard one, else a ConfigError naming both."""
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to check
        return
    need = connections + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (ValueError, OSError):
            pass
    allowed = max(0, (hard if hard != resource.RLIM_INFINITY else soft) - RESERVED_FDS)
    raise ConfigError(
        f"{what} needs {connections:,} connections at once, one open file each, but this "
        f"process may open at most {hard:,} files (ulimit -n), {allowed:,} of them for "
        "connections: raise the limit or ask for fewer"
    )
