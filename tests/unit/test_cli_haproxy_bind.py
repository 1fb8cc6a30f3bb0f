"""The HAProxy wrapper moves exactly Serve's stats and metrics bind lines to loopback,
on the bind lines of Ray's own template, and runs the real binary with the same args."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE

from app.cli.haproxy_bind import real_haproxy, write_wrapper

STATS, METRICS, API = 8404, 9101, 8000


def _ray_bind_lines(frontend_host: str) -> list[str]:
    """Ray's template's bind lines with the values Ray fills in."""
    values = {
        "config.stats_port": str(STATS),
        "config.metrics_port": str(METRICS),
        "config.frontend_host": frontend_host,
        "config.frontend_port": str(API),
    }
    template = HAPROXY_CONFIG_TEMPLATE.splitlines()
    lines = [line for line in template if line.strip().startswith("bind ")]
    return [re.sub(r"{{ (\S+) }}", lambda m: values.get(m.group(1), m.group(0)), x) for x in lines]


def test_ray_still_binds_stats_and_metrics_on_every_interface() -> None:
    """What the wrapper rewrites: if Ray changes these lines, revisit the wrapper."""
    lines = [line.strip() for line in _ray_bind_lines("*")]
    assert f"bind *:{STATS}" in lines
    assert f"bind :{METRICS}" in lines


def test_wrapper_rewrites_only_the_side_listeners(tmp_path: Path) -> None:
    fake = tmp_path / "real-haproxy"
    fake.write_text('#!/bin/sh\necho "$@"\ncat "$3"\n')
    fake.chmod(0o700)
    wrapper = write_wrapper(tmp_path, str(fake), (STATS, METRICS))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text("\n".join(_ray_bind_lines("*")) + "\n")
    out = subprocess.run(
        [str(wrapper), "-db", "-f", str(cfg), "-sf", "42"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert out[0] == f"-db -f {cfg} -sf 42"  # the real binary got the same arguments
    binds = sorted(line.strip() for line in out[1:] if line.strip().startswith("bind"))
    assert f"bind 127.0.0.1:{STATS}" in binds
    assert f"bind 127.0.0.1:{METRICS}" in binds
    assert f"bind *:{API}" in binds  # the API frontend follows http_options.host
    assert not any(b.endswith(f"*:{STATS}") or b.endswith(f" :{METRICS}") for b in binds)


def test_the_real_binary_is_rays_bundled_haproxy() -> None:
    path = real_haproxy()
    assert Path(path).name == "haproxy"
    version = subprocess.run([path, "-v"], capture_output=True, text=True, check=True)
    assert "HAProxy version" in version.stdout
