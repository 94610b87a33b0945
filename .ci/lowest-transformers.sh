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
    # what that version needs and the venv's packages do not satisfy (tokenizers, hub, ...)
    needs=$(PYTHONPATH="$dir" "$PY" - "$dir" <<'PYEOF'
import sys
from importlib import metadata
from packaging.requirements import Requirement
dist = next(d for d in metadata.distributions(path=[sys.argv[1]]) if d.name == "transformers")
for raw in dist.requires or []:
    req = Requirement(raw)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        print(f"{req.name}{req.specifier}")
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
