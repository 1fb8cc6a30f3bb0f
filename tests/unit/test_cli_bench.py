"""``switchyard bench``: run (options, config file, validation), compare, crosscheck
and the goodput option syntax — against a simulated endpoint in a background thread."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from app.bench import selfcheck
from app.bench.simserver import SimServerConfig, serve_in_background
from app.cli.bench import parse_goodput
from app.cli.main import app
from app.engine.simulated import SimulationProfile
from app.settings import Settings

RUNNER = CliRunner()
FAST = SimServerConfig(
    profile=SimulationProfile(
        decode_base_s=0.002, decode_s_per_seq=0.0, prefill_s_per_token=0.0, max_batch_size=512
    )
)


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    ready: list[str] = []
    stop = threading.Event()

    async def serve() -> None:
        async with serve_in_background(FAST) as url:
            ready.append(url)
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    while not ready:
        thread.join(0.05)
    yield ready[0]
    stop.set()
    thread.join(10)


@pytest.fixture(autouse=True)
def lenient_self_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check the CLI, not this machine's scheduling: a loaded box must not turn
    a run INVALID (exit 3). The verdict itself is tested with a threshold no run can meet."""
    monkeypatch.setattr(selfcheck, "MAX_LAG_P99_S", 60.0)


def test_an_invalid_run_still_writes_its_report_and_exits_3(
    sim_url: str, tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(selfcheck, "MAX_LAG_P99_S", -1.0)
    out = tmp_path / "out"
    result = RUNNER.invoke(
        app,
        ["bench", "run", "--url", sim_url, "--rate", "20", "--warmup", "0", "--duration",
         "0.2", "--input-tokens", "8", "--output-tokens", "2", "--out", str(out), "--name",
         "bad", "--quiet"],
        obj=settings,
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "INVALID (schedule lag p99" in result.stdout
    data = json.loads((out / "bad.json").read_text())
    assert data["self_check"]["valid"] is False
    assert "INVALID (schedule lag p99" in (out / "bad.md").read_text()


def test_run_writes_the_report_and_prints_the_headline(
    sim_url: str, tmp_path: Path, settings: Settings
) -> None:
    out = tmp_path / "out"
    result = RUNNER.invoke(
        app,
        ["bench", "run", "--url", sim_url, "--rate", "40", "--warmup", "0.1", "--duration",
         "0.4", "--input-tokens", "16", "--output-tokens", "4", "--goodput", "ttft:5000",
         "--out", str(out), "--name", "r1", "--quiet"],
        obj=settings,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (out / "r1.json").exists() and (out / "r1.md").exists()
    assert len(list(out.glob("r1-*.png"))) == 5
    data = json.loads((out / "r1.json").read_text())
    assert data["config"]["rate"] == 40 and data["config"]["slo"]["ttft_s"] == 5.0
    assert data["config"]["workload"]["input_tokens"] == 16
    assert "valid" in result.stdout and "goodput" in result.stdout
    assert str(out / "r1.json") in result.stdout


def test_options_override_the_config_file(sim_url: str, tmp_path: Path, settings: Settings) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({
        "base_url": sim_url, "mode": "closed", "concurrency": 2, "warmup_s": 0.0,
        "duration_s": 5.0, "workload": {"kind": "fixed", "input_tokens": 8, "output_tokens": 2},
    }))  # fmt: skip
    result = RUNNER.invoke(
        app,
        ["bench", "run", "--config", str(config), "--duration", "0.3", "-c", "3",
         "--out", str(tmp_path), "--name", "r2", "--quiet"],
        obj=settings,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "r2.json").read_text())
    assert data["config"]["duration_s"] == 0.3 and data["config"]["concurrency"] == 3
    assert data["config"]["workload"]["output_tokens"] == 2
    assert data["stages"][0]["label"] == "c=3"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "sideways"], "mode"),
        (["--workload", "nope"], "workload"),
        (["--rate", "-1"], "rate"),
    ],
)
def test_invalid_configuration_exits_2_with_the_field(
    args: list[str], message: str, tmp_path: Path, settings: Settings
) -> None:
    result = RUNNER.invoke(app, ["bench", "run", *args, "--out", str(tmp_path)], obj=settings)
    assert result.exit_code == 2
    assert "invalid configuration" in result.output and message in result.output


def test_unknown_config_file_keys_are_refused(tmp_path: Path, settings: Settings) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("rate: 5\nraet: 6\n")
    result = RUNNER.invoke(app, ["bench", "run", "--config", str(config)], obj=settings)
    assert result.exit_code == 2 and "raet" in result.output


def test_compare_and_crosscheck_of_two_runs(
    sim_url: str, tmp_path: Path, settings: Settings
) -> None:
    for name, rate in (("a", "20"), ("b", "40")):
        result = RUNNER.invoke(
            app,
            ["bench", "run", "--url", sim_url, "--rate", rate, "--warmup", "0", "--duration",
             "0.4", "--input-tokens", "8", "--output-tokens", "3", "--out", str(tmp_path),
             "--name", name, "--quiet"],
            obj=settings,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    cmp = RUNNER.invoke(
        app, ["bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], obj=settings
    )
    assert cmp.exit_code == 0, cmp.output
    assert "request_throughput" in cmp.stdout and "B/A" in cmp.stdout
    check = RUNNER.invoke(app, ["bench", "crosscheck", str(tmp_path / "a.json")], obj=settings)
    assert check.exit_code == 0, check.output
    assert "MISMATCH" not in check.stdout and "ttft.p99" in check.stdout


def test_compare_refuses_a_file_that_is_not_a_result(tmp_path: Path, settings: Settings) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    result = RUNNER.invoke(app, ["bench", "compare", str(bad), str(bad)], obj=settings)
    assert result.exit_code == 2 and "not a switchyard bench result" in result.output


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["ttft:500"], {"ttft_s": 0.5}),
        (["ttft:200", "tpot:50", "e2el:10000"], {"ttft_s": 0.2, "tpot_s": 0.05, "e2e_s": 10.0}),
    ],
)
def test_goodput_option_is_vllm_syntax_in_ms(items: list[str], expected: dict[str, float]) -> None:
    assert parse_goodput(items) == pytest.approx(expected)


@pytest.mark.parametrize("item", ["ttft", "latency:5", "tpot:"])
def test_goodput_option_refuses_bad_items(item: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_goodput([item])


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path, settings: Settings) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("base_url: http://127.0.0.1:9\nready_timeout_s: 0.2\n")
    result = RUNNER.invoke(
        app, ["bench", "run", "--config", str(config), "--out", str(tmp_path)], obj=settings
    )
    assert result.exit_code == 2
    assert "cannot benchmark http://127.0.0.1:9" in result.output
    assert not list(tmp_path.glob("*.json"))


def test_a_bad_slo_option_is_a_configuration_error(tmp_path: Path, settings: Settings) -> None:
    result = RUNNER.invoke(app, ["bench", "run", "--p95-metric", "latency"], obj=settings)
    assert result.exit_code == 2 and "p95_metric" in result.output
