"""The alert rules (grafana/alerts/switchyard.rules.yaml): valid for Prometheus
(``promtool check rules``), each proven by its unit tests (``promtool test rules``), and
naming only metrics and labels that app.observability.catalog defines."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.observability import catalog

ALERTS = Path(__file__).resolve().parents[2] / "grafana" / "alerts"
RULES = ALERTS / "switchyard.rules.yaml"
RULE_TESTS = ALERTS / "switchyard.rules.test.yaml"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: `make services` installs Debian's prometheus")
    return found


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("command", ["check", "test"])
def test_promtool_accepts_the_rules_and_their_unit_tests_pass(command: str) -> None:
    target = RULES if command == "check" else RULE_TESTS
    done = subprocess.run(
        [_promtool(), f"{command}", "rules", target.name],
        cwd=ALERTS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r["alert"])
def test_each_rule_names_only_catalog_metrics_and_their_labels(rule: dict[str, Any]) -> None:
    assert catalog.problems(rule["expr"]) == []


def test_every_alert_has_a_unit_test_that_makes_it_fire() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fired = {case["alertname"] for test in doc["tests"]
             for case in test["alert_rule_test"] if case["exp_alerts"]}  # fmt: skip
    assert fired == {rule["alert"] for rule in _rules()}
