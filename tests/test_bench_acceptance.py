"""`python -m benchmarks.acceptance`: the acceptance rule's error rates on FakeRunner."""

from __future__ import annotations

from benchmarks import acceptance


def test_a_gain_scenario_counts_the_kept_gain_and_the_false_acceptances():
    big = acceptance.Scenario("a 1.6x gain", 1.6, 0.02, 0.0)
    report = acceptance.run(1, (big,))
    row = report["scenarios"][0]
    assert row["kept"] == 1 and row["false"] == 0 and row["decided"] >= 1
    assert "| a 1.6x gain | 2% | 0% | 0 of" in acceptance.to_markdown(report)


def test_a_placebo_scenario_has_no_gain_to_keep():
    row = acceptance.run(1, (acceptance.Scenario("placebo", 1.0, 0.02, 0.0),))["scenarios"][0]
    assert row["kept"] is None and row["false"] == len(row["false_changes"])


def test_runs_below_one_are_refused(capsys):
    assert acceptance.main(["--runs", "0"]) == 2
    assert "--runs 0" in capsys.readouterr().err
