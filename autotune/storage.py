"""Where trials and decisions are stored: Optuna storage URLs, opened with clear errors,
shown without passwords, and the study name a workload gets by default.

A URL may carry a password; `AUTOTUNE_STORAGE` keeps it out of `ps` and the shell history.
Every message and report shows `redact(url)`, never the URL itself.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path

import optuna

from .errors import UserError

__all__ = ["ENV_VAR", "default_url", "open_storage", "redact", "storage_url", "study_name"]

ENV_VAR = "AUTOTUNE_STORAGE"
HIDDEN = "***"
# Query parameters whose value is a secret, by name (case-insensitive, anywhere in the name):
# password, passwd, pass, pwd, secret, token, api_key, auth, credentials, sslpassword, ...
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|cred|sig", re.IGNORECASE)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)(.*)$", re.DOTALL)
_QUERY_PAIR = re.compile(r"([?&;])([^=&;#]*)=([^&;]*)")
_MAX_STUDY_NAME = 128


def default_url(out_dir: Path) -> str:
    """A SQLite file in the output folder."""
    return f"sqlite:///{(Path(out_dir) / 'study.db').resolve()}"


def storage_url(flag_value: str | None, out_dir: Path) -> str:
    """The storage URL a run uses: `--storage`, else `$AUTOTUNE_STORAGE`, else SQLite in `out_dir`.

    Args:
        flag_value: The `--storage` flag, or None when it was not given.
        out_dir: The output folder, for the default SQLite file.

    Returns:
        The URL (with any password in it: show it only through `redact`).

    Raises:
        UserError: The flag or the variable is set but empty.
    """
    if flag_value is not None:
        if not flag_value.strip():
            raise UserError("--storage is empty; give an Optuna storage URL, or leave the flag out "
                            f"for ${ENV_VAR} or the SQLite file in --out.")
        return flag_value
    env = os.environ.get(ENV_VAR)
    if env is not None and env.strip():
        return env
    return default_url(out_dir)


def _hide_query(query: str) -> str:
    """`?user=x&password=y` with every secret-looking parameter's value hidden."""
    return _QUERY_PAIR.sub(lambda m: f"{m[1]}{m[2]}={HIDDEN}" if _SECRET_PARAM.search(m[2]) else m[0], query)


def _redact_fallback(url: str) -> str:
    """Hide the password of `scheme://user:password@host/...` without a parser, erring on
    the side of hiding: the user information runs to the last `@` before the query (or, with
    no `@` there, the last `@` at all), so a password with an unencoded `@`, `/` or `?` is
    hidden whole, even when that hides part of the host too."""
    m = _SCHEME.match(url)
    if not m:  # not a URL at all: hide everything after the first colon
        head, sep, _ = url.partition(":")
        return f"{head}{sep}{HIDDEN}" if sep else _hide_query(url)
    scheme, rest = m.groups()
    before_query = rest.split("?", 1)[0]
    at = before_query.rfind("@")
    if at < 0:
        at = rest.rfind("@")
    if at >= 0:
        userinfo, rest = rest[:at], rest[at:]
        user, colon, _ = userinfo.partition(":")
        rest = (f"{user}:{HIDDEN}" if colon else userinfo) + rest
    main, q, query = rest.partition("?")
    return scheme + main + (q + _hide_query("?" + query)[1:] if q else "")


def redact(url: str) -> str:
    """The URL with every password hidden, for messages and reports.

    The password of the user information (`postgresql://u:pw@h/db`) and the values of
    secret-looking query parameters (`?password=...`, `&pass=...`, `&token=...`) become
    `***`. SQLAlchemy's URL parser does it where it parses the URL unambiguously; a URL it
    cannot parse, or one with more than one `@` (a password holding an unencoded `@`),
    goes through a regular expression that hides more rather than less.
    """
    url = str(url)
    m = _SCHEME.match(url)
    ambiguous = m is None or m.group(2).count("@") > 1 or "#" in url
    if not ambiguous:
        try:
            from sqlalchemy.engine import make_url

            parsed = make_url(url)
            # Without a password the URL is shown as typed; with one, as SQLAlchemy renders it
            # with the password hidden. Secret query values are hidden in the text either way.
            shown = url if parsed.password is None else parsed.render_as_string(hide_password=True)
            shown = _hide_query(shown)
            secret = "" if parsed.password is None else str(parsed.password)
            if secret and (secret in shown.replace(HIDDEN, "") or parsed.host and "@" in parsed.host):
                raise ValueError("the password is not cleanly separated")  # leave it to the fallback
            return shown
        except Exception:  # noqa: BLE001 - not a SQLAlchemy URL: the fallback hides what it can
            pass
    return _redact_fallback(url)


def _secrets(url: str) -> list[str]:
    """The secret strings in a URL (password, secret query values), raw and %-decoded,
    so that a driver's message that quotes one can be scrubbed."""
    from urllib.parse import unquote

    found = []
    m = _SCHEME.match(url)
    if m:
        rest = m.group(2)
        before_query = rest.split("?", 1)[0]
        at = before_query.rfind("@") if "@" in before_query else rest.rfind("@")
        if at >= 0:
            _, colon, password = rest[:at].partition(":")
            if colon and password:
                found.append(password)
    found += [v for _, k, v in _QUERY_PAIR.findall(url) if _SECRET_PARAM.search(k) and v]
    found += [unquote(s) for s in found]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` (an error message) with the URL and every secret in it hidden."""
    text = str(text).replace(url, redact(url))
    for secret in _secrets(url):
        text = text.replace(secret, HIDDEN)
    return text


JOURNAL = "journal:///"  # journal:///path/to/file.log: Optuna's journal file, for several processes on one machine


def _open(url: str, shared: bool) -> optuna.storages.BaseStorage:
    if url.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        return JournalStorage(JournalFileBackend("/" + url[len(JOURNAL):].lstrip("/")))
    if not shared:
        return optuna.storages.get_storage(url)
    from .heartbeat import storage_kwargs

    # SQLite serialises writers: wait for a lock rather than fail at once.
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    with warnings.catch_warnings():  # Optuna marks the heartbeat arguments experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine, **storage_kwargs())


SCHEMA_TRIES = 8  # opening attempts (0.2 s more wait each) while another process is creating the same tables


def _schema_race(exc: BaseException) -> bool:
    """Another process creating Optuna's tables in the same empty database at this moment:
    PostgreSQL refuses the slower CREATE ("duplicate key value violates unique constraint
    pg_type_typname_nsp_index", "already exists"). Opened again, the tables are there. A
    coordinator and its first worker opening a fresh database together hit it in CI."""
    text = str(exc)
    return type(exc).__name__ in ("IntegrityError", "ProgrammingError") and (
        "duplicate key" in text or "already exists" in text)


def open_storage(url: str, shared: bool = False) -> optuna.storages.BaseStorage:
    """The storage behind `url`; `shared` (workers in other processes) turns on the
    heartbeat that finds trials whose worker died."""
    try:
        for attempt in range(1, SCHEMA_TRIES + 1):
            try:
                return _open(url, shared)
            except Exception as exc:  # noqa: BLE001 - sorted below
                if attempt == SCHEMA_TRIES or not _schema_race(exc):
                    raise
                time.sleep(0.2 * attempt)
    except Exception as exc:  # noqa: BLE001 - any failure to open storage is the URL's
        msg = scrub(str(exc), url)
        first = msg.splitlines()[0][:300] if msg.strip() else "no detail"
        named = f"${ENV_VAR}" if os.environ.get(ENV_VAR) == url else "--storage"
        raise UserError(
            f"{named} {redact(url)!r} cannot be opened ({type(exc).__name__}: {first}); "
            "give an Optuna storage URL such as sqlite:///path/study.db, postgresql://user:pass@host/db or "
            "journal:///path/journal.log "
            f"(by --storage or ${ENV_VAR})."
        ) from None


def study_name(workload_name: str) -> str:
    """A study name derived from the workload's name."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(workload_name)).strip("-")[:_MAX_STUDY_NAME].strip("-")
    return name or "workload"


def failure_message(exc: BaseException, url: str | None) -> str | None:
    """A message for a study storage that refused to work (read-only, locked, gone), or None."""
    kinds = [type(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None]
    if not any(k.__module__.startswith(("optuna.storages", "optuna.exceptions", "sqlalchemy")) for k in kinds):
        return None
    cause = exc.__cause__ or exc.__context__ or exc
    detail = str(cause).splitlines()[0][:300] if str(cause) else type(cause).__name__
    detail = scrub(detail, url) if url else detail
    return (f"the study storage failed ({type(exc).__name__}: {detail}); make sure --storage (or "
            "$AUTOTUNE_STORAGE) names a database this process can read and write, then rerun the same command: "
            "what was measured before is kept there and in the report.")
