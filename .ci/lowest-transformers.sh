#!/usr/bin/env bash
# The transformers backend's tests at the LOWEST transformers version pyproject.toml allows.
#
# Why: the backend must work across the whole allowed range, and transformers changes quietly
# (5.x renamed the forward's `past_key_values` to `cache`, and an unknown keyword is swallowed
# by **kwargs, so a wrong name gives garbage without an error). The project's venv holds the
# newest version; this installs the floor into a separate directory (with the few
# dependencies the venv's versions do not satisfy for it) and runs the backend's tests with
# that directory first on PYTHONPATH. Needs the package index; a few minutes on 2 cores.
#
# Usage: .ci/lowest-transformers.sh [PYTHON]   (default: .venv/bin/python)
#        LOWEST_TF_DIR=DIR keeps the install in DIR (reused when present).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
floor=$("$PY" - <<'PYEOF'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(d for d in deps if re.match(r"transformers\b", d))
m = re.search(r">=\s*([0-9][0-9a-z.]*)", spec)
assert m, f"no lower bound in {spec!r}"
print(m.group(1))
PYEOF
)
dir=${LOWEST_TF_DIR:-}
if [[ -z "$dir" ]]; then
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
fi
if [[ ! -f "$dir/.done-$floor" ]]; then
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" \
        "transformers==$floor"
    # what that version needs and the venv's packages do not satisfy (tokenizers, hub, ...).
    # Also what the venv's newer transformers pulled in that this version only knows as an
    # optional integration, at a version its extra does not allow: 5.25 requires `kernels`,
    # and 5.0 imports any kernels present, which from 0.15 on fails at import ("Either a
    # revision or a version must be specified"); a user of 5.0 has no kernels, or its pin.
    needs=$(PYTHONPATH="$dir" "$PY" - "$dir" <<'PYEOF'
import sys
from importlib import metadata
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
floor_dir = Path(sys.argv[1]).resolve()
def plain(dist):  # its requirements without an extra
    reqs = [Requirement(r) for r in dist.requires or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]
tfs = [d for d in metadata.distributions() if canon(d.name) == "transformers"]
floor = next(d for d in tfs if Path(d.locate_file("")).resolve() == floor_dir)
newer = [d for d in tfs if d is not floor]
pulled = {canon(r.name) for d in newer for r in plain(d)}
required = {canon(r.name) for r in plain(floor)}
out = {}
for raw in floor.requires or []:
    req = Requirement(raw)
    name = canon(req.name)
    if name in out or (name not in required and name not in pulled):
        continue
    if req.marker is not None and not any(
        req.marker.evaluate({"extra": e}) for e in [""] + (floor.metadata.get_all("Provides-Extra") or [])
    ):
        continue  # another platform's or Python's requirement
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        have = None
    if name in required and have is None:
        out[name] = f"{req.name}{req.specifier}"
    elif have is not None and not req.specifier.contains(have, prereleases=True):
        out[name] = f"{req.name}{req.specifier}"
print(" ".join(out.values()))
PYEOF
)
    if [[ -n "$needs" ]]; then
        # shellcheck disable=SC2086  # one requirement per word
        "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" $needs
    fi
    touch "$dir/.done-$floor"
fi
got=$(PYTHONPATH="$dir" "$PY" -c "import transformers; print(transformers.__version__)")
if ! "$PY" -c "import sys; from packaging.version import Version as V; \
sys.exit(V(sys.argv[1]) != V(sys.argv[2]))" "$got" "$floor"; then
    echo "expected transformers $floor first on the path, got $got" >&2
    exit 1
fi
echo "transformers backend tests at the lowest allowed transformers ($got)"
PYTHONPATH="$dir:src${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_backend_hf.py
