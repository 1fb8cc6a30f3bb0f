"""The alert rules (grafana/alerts/switchyard.rules.yaml): valid for Prometheus
(``promtool check rules``), each proven by its unit tests (``promtool test rules``), and
naming only metrics and labels that app.observability.catalog defines."""

from __future__ import annotations

import re
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
    expr = rule["expr"]
    series = catalog.series_names()
    names = set(re.findall(r"\bswitchyard_\w+", expr))
    assert names, expr
    unknown = names - set(series)
    assert not unknown, f"not in app.observability.catalog: {unknown}"
    labels = {"le"} | {label for n in names for label in series[n].labels}
    matchers = {m for block in re.findall(r"\{([^}]*)\}", expr)
                for m in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", block)}  # fmt: skip
    grouped = {g.strip() for block in re.findall(r"\bby\s*\(([^)]*)\)", expr)
               for g in block.split(",")}  # fmt: skip
    assert matchers | grouped <= labels, (matchers | grouped) - labels


def test_every_alert_has_a_unit_test_that_makes_it_fire() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fired = {case["alertname"] for test in doc["tests"]
             for case in test["alert_rule_test"] if case["exp_alerts"]}  # fmt: skip
    assert fired == {rule["alert"] for rule in _rules()}
