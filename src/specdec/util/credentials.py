"""API keys: read from a flag, a file or an environment variable; never written anywhere.

``specdec serve`` and ``specdec bench/certify --endpoint`` take a key as ``--api-key KEY``
(visible to other users in the process list), ``--api-key-file FILE`` (the first line of the
file) or ``$SPECDEC_API_KEY``. Whatever specdec records about a run (a results file's header,
a certificate's command line) goes through ``redact_argv`` / ``redact_url`` first, so no key
and no password inside a URL reaches a file or a log.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from specdec.errors import ConfigError
from specdec.util.textfiles import read_bytes

API_KEY_ENV = "SPECDEC_API_KEY"
SECRET_FLAGS = ("--api-key",)  # flags whose value is a secret
REDACTED = "<redacted>"
_MAX_KEY_FILE = 64 << 10
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")


def read_api_key(key: str | None, key_file: str | None, *, env: str = API_KEY_ENV) -> str | None:
    """The API key: ``--api-key``, else ``--api-key-file``, else ``$env``, else None. A key
    that is empty, given both as a flag and as a file, or not fit for an HTTP header
    (``check_api_key``) is a ConfigError."""
    if key is not None and key_file is not None:
        raise ConfigError("give --api-key or --api-key-file, not both")
    if key_file is not None:
        key = _first_line(key_file)
        if not key:
            raise ConfigError(f"the API key file {key_file} holds no key")
    elif key is None:
        key = os.environ.get(env) or None
        if key is None:
            return None
    key = key.strip()
    if not key:
        raise ConfigError("--api-key is empty")
    check_api_key(key)
    return key


def check_api_key(key: str) -> None:
    """A ConfigError unless ``key`` can travel in ``Authorization: Bearer KEY``: printable
    ASCII only. A header is bytes, and neither side agrees on how to encode 'é' (the client
    failed with UnicodeEncodeError, and a server given such a key started but no client could
    authenticate). The message gives the position, never the key."""
    for i, c in enumerate(key):
        code = ord(c)
        if code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF:
            raise ConfigError("the API key holds control characters or bytes that are not UTF-8")
        if code > 0x7E:
            raise ConfigError(
                f"the API key holds a character that is not ASCII (character {i + 1} of "
                f"{len(key)}): an HTTP header carries ASCII only, so no client could send it"
            )


def _first_line(path: str) -> str:
    raw = read_bytes(path, "the API key file", _MAX_KEY_FILE)  # a FIFO: an error, not a wait
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"the API key file {path} is not UTF-8 text") from e
    return text.splitlines()[0].strip() if text.strip() else ""


def redact_url(url: str) -> str:
    """``url`` without a user name and password (``http://user:pw@host`` -> ``http://<redacted>@host``)."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", url)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to record: the value of every secret flag replaced, in both forms
    (``--api-key KEY`` and ``--api-key=KEY``), and passwords in URLs removed."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_url(arg))
    return out
