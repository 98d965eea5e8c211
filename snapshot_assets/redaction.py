"""Secrets never leave the process: the one function that removes them from text, and what feeds it.

Text leaves the process through error messages (the project's errors, the CLI's one line), logs
(every handler, Dagster's included), `snapshotter status`, metrics and Dagster metadata. Each of
those paths calls `redact` (the errors in their constructors, logs through a record factory,
status when a table's status is assembled), so a secret is removed once, here, whatever the path.

Two ways a secret is recognised:

- by its context, whatever its value: the password of a URL's user info (`scheme://user:PW@host`),
  a `password=...` (libpq DSNs, query strings, `key: value` and `key = value` forms), AWS secret
  keys and session tokens in any of their spellings, a Spark Connect `;token=...`, and a PEM
  private key block (even a truncated one);
- by its value, wherever it appears: values registered with `register_secret` when they are
  loaded — every DSN password of the configuration (`register_dsn`, also from DSNs libpq cannot
  parse), and `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_SECURITY_TOKEN`, `PGPASSWORD` from
  the environment (`register_environment`). Values shorter than 4 characters are recognised only
  by context: replacing every "ab" in every message would destroy the messages, not protect them.

libpq's own DSN syntax errors quote pieces of the DSN (`missing "=" after "cret"`, a piece of a
password); `dsn_problem` explains a bad DSN without any of them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

REDACTED = "***"
#: Shorter registered values are only redacted by context (see the module docstring).
MIN_SECRET_CHARS = 4
SECRET_ENVIRONMENT = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "PGPASSWORD")

_KEYS = (r"password|passwd|pwd|(?:aws_)?secret_access_key|secretaccesskey|secret_key|(?:aws_)?session_token"
         r"|sessiontoken|(?:aws_)?security_token")
_VALUE = r"""("(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|[^\s,;&}\])'"]+)"""
_CONTEXTS = (
    # user info of a URL: the password runs to the last "@" before the path
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)[^\s/]*@"), rf"\1{REDACTED}@"),
    # keyword forms: password=x, password = 'x y', "SecretAccessKey": "x", aws_session_token: x
    (re.compile(rf"""(?i)(["']?\b(?:{_KEYS})["']?\s*[:=]\s*){_VALUE}"""), rf"\1{REDACTED}"),
    # a Spark Connect connection string's bearer token
    (re.compile(r"(?i)([;?&]token=)[^\s;&]+"), rf"\1{REDACTED}"),
    # a PEM private key, ended or cut off
    (re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S),
     rf"-----BEGIN \1PRIVATE KEY----- {REDACTED} -----END \1PRIVATE KEY-----"),
)
_KEYWORD_PASSWORD = re.compile(rf"""(?i)\bpassword\s*=\s*{_VALUE}""")
_URI_PASSWORD = re.compile(r"(?i)^[a-z][a-z0-9+.-]*://[^/\s:@]*:([^\s/]*)@")
_LIBPQ_QUOTED = re.compile(r'"([^"]*)"')


_lock = threading.Lock()
_kept: set[str] = set()  # registered for the life of the process
_slots: dict[str, set[str]] = {}  # registered under a name, replaced by the next value of that name
_values: tuple[str, ...] = ()  # all of them, longest first, so a secret containing another goes whole


def register_secret(value: str | None, *, slot: str | None = None) -> None:
    """Remove `value` (and its JSON-escaped, percent-encoded and repr spellings) from all redacted text.

    `slot` names a secret that is replaced over time (the session token of an assumed role, renewed
    every hour): registering a new value under the same slot forgets the old one, so a process that
    runs for months does not collect every token it ever held.
    """
    global _values
    if not value or len(value) < MIN_SECRET_CHARS:
        return
    forms = {value, json.dumps(value)[1:-1], quote(value, safe=""), repr(value)[1:-1]}
    with _lock:
        if slot is None:
            _kept.update(forms)
        else:
            _slots[slot] = forms
        _values = tuple(sorted(_kept.union(*_slots.values()), key=len, reverse=True))


def register_environment(env: Mapping[str, str] | None = None) -> None:
    """Register the secret values of the environment (AWS keys and tokens, libpq's PGPASSWORD)."""
    env = os.environ if env is None else env
    for name in SECRET_ENVIRONMENT:
        register_secret(env.get(name))


def register_dsn(dsn: str) -> None:
    """Register the password of a libpq DSN (keyword or URI form), also when libpq cannot parse it."""
    for pattern in (_KEYWORD_PASSWORD, _URI_PASSWORD):
        for match in pattern.finditer(dsn):
            register_secret(match.group(1).strip("'\""))
    try:
        import psycopg2.extensions

        register_secret(psycopg2.extensions.parse_dsn(dsn).get("password"))
    except Exception:  # unparseable: the patterns above got what can be got
        return


def dsn_problem(dsn: str) -> str | None:
    """Why libpq cannot parse `dsn` (None when it can), without quoting any piece of it."""
    import psycopg2
    import psycopg2.extensions

    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else "cannot be parsed"
        text = text.removeprefix("invalid dsn:").strip()
        return f"not a valid libpq connection string: {_LIBPQ_QUOTED.sub(_unquoted_piece, text)}"
    return None


def _unquoted_piece(match: re.Match[str]) -> str:
    """A piece of a DSN that libpq quoted in its message, replaced (its syntax words like "=" kept)."""
    return match.group(0) if match.group(1) == "=" else f'"{REDACTED}"'


def redact(text: str) -> str:
    """`text` without any secret this module can recognise (see the module docstring)."""
    for pattern, replacement in _CONTEXTS:
        text = pattern.sub(replacement, text)
    for value in _values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text


# --- logs --------------------------------------------------------------------------------------

_installed = False


def install_log_redaction() -> None:
    """Redact every log record of this process when it is made (message, arguments, traceback).

    A record factory, not a handler filter: filters only see records of the logger or handler
    they sit on, while every record of every logger (Dagster's included) is made by the factory.
    Idempotent; also registers the environment's secrets.
    """
    global _installed
    register_environment()
    with _lock:
        if _installed:
            return
        _installed = True
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)
