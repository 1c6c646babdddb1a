"""Opening the study storage while another process creates the same tables: PostgreSQL
refuses the slower CREATE, and the opener tries again instead of failing the run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import sqlalchemy

from autotune import storage
from autotune.errors import UserError

PG = os.environ.get("AUTOTUNE_TEST_POSTGRES")


def _race() -> Exception:
    return sqlalchemy.exc.IntegrityError("CREATE TABLE studies", {}, Exception(
        'duplicate key value violates unique constraint "pg_type_typname_nsp_index"'))


def test_a_schema_race_is_opened_again_and_another_failure_is_not(monkeypatch):
    calls = []

    def flaky(url, shared):
        calls.append(url)
        if len(calls) < 3:
            raise _race()
        return "opened"

    monkeypatch.setattr(storage, "_open", flaky)
    monkeypatch.setattr(storage.time, "sleep", lambda s: None)
    assert storage.open_storage("postgresql://u:secret@h/db", shared=True) == "opened" and len(calls) == 3

    def refused(url, shared):
        calls.append(url)
        raise sqlalchemy.exc.OperationalError("connect", {}, Exception("password authentication failed"))

    calls.clear()
    monkeypatch.setattr(storage, "_open", refused)
    with pytest.raises(UserError, match="cannot be opened") as exc:
        storage.open_storage("postgresql://u:secret@h/db")
    assert len(calls) == 1 and "secret" not in str(exc.value)


def test_a_race_that_does_not_end_is_reported(monkeypatch):
    monkeypatch.setattr(storage, "_open", lambda url, shared: (_ for _ in ()).throw(_race()))
    monkeypatch.setattr(storage.time, "sleep", lambda s: None)
    with pytest.raises(UserError, match="IntegrityError"):
        storage.open_storage("postgresql://u@h/db")


@pytest.mark.slow
def test_processes_opening_an_empty_postgresql_schema_at_once_all_open_it():
    """Four processes open a fresh schema together, as a coordinator and its workers do on
    a new database; each must open it (the tables are created once, by whichever wins)."""
    if not PG:
        pytest.skip("AUTOTUNE_TEST_POSTGRES is unset (.ci/run starts a PostgreSQL server and sets it)")
    schema = f"race_{uuid.uuid4().hex[:8]}"
    engine = sqlalchemy.create_engine(PG)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    url = f"{PG}{'&' if '?' in PG else '?'}options=-csearch_path%3D{schema}"
    start = time.time() + 3
    code = ("import sys, time; from autotune.storage import open_storage\n"
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
            "open_storage(sys.argv[1], shared=True); print('opened')")
    try:
        procs = [subprocess.Popen([sys.executable, "-c", code, url, str(start)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 and "opened" in out for p, (out, _) in zip(procs, outs)), [e for _, e in outs]
        with engine.begin() as conn:
            tables = conn.execute(sqlalchemy.text(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = :s"), {"s": schema}).scalar()
        assert tables and tables > 5, "Optuna's tables were created in the fresh schema"
    finally:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()
