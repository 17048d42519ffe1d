"""deploy/prometheus/alerts.yaml: valid for Prometheus, unit-tested, and about our metrics.

`promtool check rules` and `promtool test rules` (Debian's `prometheus` package; .ci/run
installs it) run the rules against the series in alerts.test.yaml: each alert fires where it
should and stays silent beside it. A copy with one threshold moved must fail those tests, so
they can fail. Every rule names exported metrics with their labels and carries a summary, a
runbook and a severity; the issue's list of alerts is all there, each one tested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO
from tests.support.metric_names import exported, query_labels

RULES = REPO / "deploy" / "prometheus" / "alerts.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "alerts.test.yaml"
REQUIRED = {
    "MemoryFoldsFailingForAnHour",  # the backoff at its cap
    "MemoryFoldLagGrowing",
    "MemoryEventsAtRiskOfTrimming",
    "MemoryEventsLost",
    "MemoryJobsDeadLettered",
    "MemorySettingsDisagree",
    "MemoryFinalizeFailureRateHigh",
}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":  # .ci/run installs it: missing there is a failure
            pytest.fail("promtool not found: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not found (apt-get install prometheus)")
    return found


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    checked = _run("check", "rules", RULES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _run("test", "rules", RULE_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("> 0.01", "> 0.1"),  # the finalize failure rate: its 5 % case would stay silent
        ("for: 1h", "for: 2h"),  # folds failing: not firing at 95 min
        ("> 50000", "> 70000"),  # events at risk: the 60 000 lag would not fire
    ],
)
def test_the_unit_tests_fail_when_a_threshold_moves(
    tmp_path: Path, before: str, after: str
) -> None:
    text = RULES.read_text()
    assert before in text
    (tmp_path / "alerts.yaml").write_text(text.replace(before, after, 1))
    shutil.copy(RULE_TESTS, tmp_path / "alerts.test.yaml")
    tested = _run("test", "rules", tmp_path / "alerts.test.yaml")
    assert tested.returncode != 0, tested.stdout


def test_every_rule_names_exported_metrics_and_says_what_to_do() -> None:
    known = exported()
    rules = _rules()
    for rule in rules:
        name = rule["alert"]
        query_labels(rule["expr"], known, name)
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["annotations"]["summary"].strip(), name
        assert len(rule["annotations"]["runbook"].split()) >= 20, f"{name}: a runbook, please"
    assert {rule["alert"] for rule in rules} >= REQUIRED


def test_every_alert_has_a_unit_test_that_sees_it_fire() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        check["alertname"]
        for case in cases
        for check in case.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }
    assert {rule["alert"] for rule in _rules()} == fired
