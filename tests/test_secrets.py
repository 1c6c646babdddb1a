"""A storage password never reaches the terminal, a message or a file autotune writes.

`redact` hides it wherever it sits in a URL (the user information, even with an unencoded
`@`, and secret query parameters); `AUTOTUNE_STORAGE` carries the URL when `--storage` is
not given, so it stays out of `ps` and the shell history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.errors import UserError
from autotune.storage import ENV_VAR, default_url, redact, scrub, storage_url
from workloads import write_target

SECRET = "hunter2"
FAST = ["--device", "cpu", "--windows", "2", "--steps", "2", "--warmup", "0", "--trials", "1"]


# --- redact -------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:hunter2@h/db", "postgresql://u:***@h/db"),
    ("postgresql://user:hunter2@127.0.0.1:1/db", "postgresql://user:***@127.0.0.1:1/db"),
    ("postgresql+psycopg2://user:hunter2@[::1]:5432/db", "postgresql+psycopg2://user:***@[::1]:5432/db"),
    ("mysql+pymysql://u:hunter2@h:3306/db?charset=utf8mb4", "mysql+pymysql://u:***@h:3306/db?charset=utf8mb4"),
    ("redis://:hunter2@h:6379/0", "redis://:***@h:6379/0"),
    # an unencoded @ in the password: everything up to the last @ is the user information
    ("postgresql://u:hunter2@x@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:hun?ter2@x@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:hun/ter2@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:hun#ter2@h/db", "postgresql://u:***@h/db"),
    # %-encoded
    ("postgresql://u:hunter%402@h/db", "postgresql://u:***@h/db"),
    # the query
    ("postgresql://u@h/db?password=hunter2", "postgresql://u@h/db?password=***"),
    ("postgresql://h/db?sslmode=require&pass=hunter2", "postgresql://h/db?sslmode=require&pass=***"),
    ("postgresql://h/db?PASSWORD=hunter2&user=u", "postgresql://h/db?PASSWORD=***&user=u"),
    ("postgresql://h/db?sslpassword=hunter2;application_name=x", None),
    ("postgresql://h/db?token=hunter2", "postgresql://h/db?token=***"),
    ("postgresql://u:hunter2@h/db?email=a@b&password=hunter2", None),
    ("weird+scheme://u:hunter2@h/db?password=hunter2", None),
    ("postgresql://u:hunter2@h/db#frag", None),
    # nothing to hide: shown as given
    ("sqlite:///runs/input/study.db", "sqlite:///runs/input/study.db"),
    ("sqlite:////tmp/a@b/study.db", "sqlite:////tmp/a@b/study.db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
])
def test_redact_hides_every_password(url, shown):
    out = redact(url)
    assert SECRET not in out and "p@ss" not in out and ":pw@" not in out
    assert "hun" not in out.replace("hunter", "")  # no part of a split password either
    if shown is not None:
        assert out == shown
    assert "***" in out or SECRET not in url


def test_scrub_hides_the_password_in_a_driver_message():
    url = "postgresql://user:hunter2@127.0.0.1:1/db"
    msg = f'connection to "127.0.0.1" failed for {url}: password "hunter2" rejected'
    assert SECRET not in scrub(msg, url) and "127.0.0.1" in scrub(msg, url)


# --- where the URL comes from -------------------------------------------------------------


def test_storage_url_flag_then_environment_then_default(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert storage_url(None, tmp_path) == default_url(tmp_path)
    monkeypatch.setenv(ENV_VAR, "sqlite:///from-env.db")
    assert storage_url(None, tmp_path) == "sqlite:///from-env.db"
    assert storage_url("sqlite:///from-flag.db", tmp_path) == "sqlite:///from-flag.db"
    monkeypatch.setenv(ENV_VAR, "  ")
    assert storage_url(None, tmp_path) == default_url(tmp_path)
    with pytest.raises(UserError, match="--storage is empty"):
        storage_url("", tmp_path)


def test_storage_help_names_the_environment_variable(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert ENV_VAR in capsys.readouterr().out


# --- a run with a storage that cannot be opened --------------------------------------------

URLS = [
    "postgresql://user:hunter2@127.0.0.1:1/db",
    "postgresql://user@127.0.0.1:1/db?password=hunter2",
    "postgresql://user:hunter2@x@127.0.0.1:1/db",
    "mysql+pymysql://user:hunter2@127.0.0.1:1/db",
]


@pytest.mark.parametrize("via", ["flag", "env"])
@pytest.mark.parametrize("url", URLS)
def test_tune_never_shows_the_password(tmp_path, capfd, monkeypatch, url, via):
    target = write_target(tmp_path, "tiny.py", "def workload():\n    return make()\n")
    out = tmp_path / "out"
    argv = ["tune", str(target), "--out", str(out), *FAST]
    monkeypatch.delenv(ENV_VAR, raising=False)
    if via == "flag":
        argv += ["--storage", url]
    else:
        monkeypatch.setenv(ENV_VAR, url)
    code = main(argv)
    stdout, stderr = capfd.readouterr()
    assert code == 2, stderr
    named = "--storage" if via == "flag" else f"${ENV_VAR}"
    assert stderr.startswith(f"error: {named} ") and "cannot be opened" in stderr and "***" in stderr, stderr
    assert "Traceback" not in stderr
    for text in (stdout, stderr):
        assert SECRET not in text, text
    written = [p for p in Path(out).rglob("*") if p.is_file()]
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
