"""Router evaluation (seed 003 §6.5): static, latency-first, cost-first and
multi-objective routing over pools whose quality was measured, on one request set, in
one run.

Pools. One Switchyard app serves SmolLM2-135M-Instruct three ways on the vLLM CPU
engine, one replica each, all priced at ``--hourly`` $/h: ``bf16`` (the shipped
weights), ``w8a8`` and ``w4a16`` (quantized here by ``switchyard models quantize``).
The request set is the shipped eval sets (``app/eval/sets``: 100 general, 50 Korean,
50 service items, each graded), sent at concurrency ``-c``.

Phase 1, each pool alone: the set through the pool's own name. Its graded answers are
the pool's eval report (the JSON ``quality: {measured: …}`` reads); its ledger records
give its throughput and TTFT/TPOT; the cost model turns the throughput into its price
(``router_eval_report.price``).

Phase 2, the policies: ``routes.yaml`` is rewritten with the measured qualities, the
prices and the measured p95 latencies (the gateways hot-reload it), and the same set
goes through four aliases in turn (``POLICIES``). Each request carries
``x-client-request-id: <arm>.<set>.<item>`` so its ledger record joins its grade.

Usage: python -m benchmarks.router_eval [-c 4] [--limit N] [--hourly 0.10]
[--ttft-x 2] [--tpot-x 1.5] [--quick] [--tag T]
writes docs/benchmarks/router-eval-<date>[-quick][-T].json/.md/.png.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.eval import report as eval_report
from app.eval.runner import Result, run
from app.eval.sets import LAYERS, load
from benchmarks import router_eval_report as rep
from benchmarks import scaffold
from benchmarks.quantization import _wait_model, prepare, serve_config
from benchmarks.serving_lib import MODEL_ID, Server, _free_port, environment, prepared_model_dir
from benchmarks.serving_tax import _env, stop

POOLS = {"bf16": MODEL_ID, "w8a8": "smol-w8a8", "w4a16": "smol-w4a16"}
REFERENCE = "bf16"
ADMIN = "router-eval-admin-token"
QUALITY_FLOOR = 0.4
POLICIES: dict[str, dict[str, Any]] = {
    "static": {},  # an alias to the reference pool's model: what a config without routing does
    "latency-first": {"weights": {"quality": 0, "latency": 1, "cost": 0}},
    "cost-first": {"weights": {"quality": 0, "latency": 0, "cost": 1}},
    "multi-objective": {"weights": {"quality": 0.5, "latency": 0.3, "cost": 0.2},
                        "quality_floor": QUALITY_FLOOR},
}  # fmt: skip
DESCRIBED = {
    "static": f"an alias to `{MODEL_ID}` (the `{REFERENCE}` pool) for every request",
    "latency-first": "policy over the three pools, weights {latency: 1}: the lowest "
    "estimated latency (live p95 TTFT + p95 ITL × max_tokens, the measured profile until "
    "20 live samples)",
    "cost-first": "policy, weights {cost: 1}: the lowest estimated cost at the cost-model "
    "prices",
    "multi-objective": f"policy, weights {{quality: 0.5, latency: 0.3, cost: 0.2}}, quality "
    f"floor {QUALITY_FLOOR} (the seed's weights; scores normalised 0–1 over the survivors)",
}


def log(message: str) -> None:
    print(f"[router-eval] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def routes(pools: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The routes file: each pool's model with its profile (phase 1's measurements when
    given), and the four policy aliases once there is something to route on."""
    out: dict[str, Any] = {"pools": {}, "models": {}, "default_model": MODEL_ID}
    for name, model in POOLS.items():
        out["pools"][name] = {"kind": "local", "model": model}
        profile: dict[str, Any] = {"max_context": 2048}
        if pools is not None:
            got = pools[name]
            m = got["measure"]
            profile |= got["price"] | {"quality": {"measured": got["report"]}}
            profile |= {"p95_ttft_ms": round(m["ttft_p95_s"] * 1000, 1),
                        "p95_itl_ms": round(m["tpot_p95_s"] * 1000, 2)}  # fmt: skip
        out["models"][model] = {"pool": name, "profile": profile}
    if pools is not None:
        aliases: dict[str, Any] = {}
        for arm, policy in POLICIES.items():
            aliases[arm] = (MODEL_ID if not policy else
                            {"policy": {"candidates": list(POOLS.values()), **policy}})  # fmt: skip
        out["aliases"] = aliases
    return out


def app_config(source: Path, port: int, routes_file: Path, hourly: float) -> dict[str, Any]:
    config = serve_config(list(POOLS), source, port)
    args = config["applications"][0]["args"]
    args["routes_file"] = str(routes_file)
    for model in args["models"]:
        model["gpu_hourly_usd"] = hourly
    return config


async def _ask(base: str, model: str, arm: str, limit: int | None, c: int) -> list[Result]:
    sets = [load(name) for name in LAYERS]
    done = [0]
    total = sum(min(len(s.items), limit or len(s.items)) for s in sets)

    def progress(r: Result) -> None:
        done[0] += 1
        if done[0] % 25 == 0 or done[0] == total:
            log(f"  {arm}: {done[0]}/{total}")

    async with httpx.AsyncClient(base_url=base, timeout=180) as client:
        return await run(client, sets, model, c, limit, progress, id_prefix=arm)


def ledger(base: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/admin/usage", params={"group": "records"},
                  headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)  # fmt: skip
    r.raise_for_status()
    data: list[dict[str, Any]] = r.json()["data"]
    return data


def _wait_routes(base: str, timeout_s: float = 60) -> None:
    """Until the gateways read the rewritten routes file: the policy alias answers."""
    body = {"model": "multi-objective", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}  # fmt: skip
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=60)
        if r.status_code == 200 and "class=" in r.headers.get("x-switchyard-route", ""):
            return
        time.sleep(1)
    raise RuntimeError("the rewritten routes file was not picked up")


def _eval_doc(results: list[Result], model: str, args: Any) -> dict[str, Any]:
    meta = {
        "model": model,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": environment()["git_commit"],
        "command": scaffold.command("router_eval"),
        "sets": [load(name).label for name in LAYERS],
        "concurrency": args.c,
        "limit": args.limit,
    }
    return eval_report.document(results, meta)


def measure(args: Any, work: Path) -> dict[str, Any]:
    source = prepared_model_dir()
    prepare(source)
    port = _free_port()
    routes_file = work / "routes.yaml"
    routes_file.write_text(yaml.safe_dump(routes()))
    config = work / "router-eval.yaml"
    config.write_text(yaml.safe_dump(app_config(source, port, routes_file, args.hourly)))
    cmd = [str(Path(sys.executable).parent / "switchyard"), "serve", str(config)]
    env = _env(work) | {"SWITCHYARD_ADMIN_TOKEN": ADMIN, "SWITCHYARD_DATA_DIR": str(work)}
    server = Server("router-eval-app", cmd, port, work, env)
    server.start()
    try:
        server.wait_ready()
        base = server.base_url
        for model in POOLS.values():
            _wait_model(base, model)
        pools: dict[str, dict[str, Any]] = {}
        for name, model in POOLS.items():
            log(f"phase 1: {name} ({model}) alone")
            t0 = time.monotonic()
            results = asyncio.run(_ask(base, model, f"pool-{name}", args.limit, args.c))
            wall = time.monotonic() - t0
            doc = _eval_doc(results, model, args)
            (work / f"eval-{name}.json").write_text(json.dumps(doc))
            table = rep.rows(f"pool-{name}", results, ledger(base))
            m = rep.pool_measure(table, wall)
            pools[name] = {"model": model, "report": f"eval-{name}.json", "measure": m,
                           "price": rep.price(m, args.hourly), "quality": doc["overall"],
                           "rows": table, "eval": doc}  # fmt: skip
            log(f"  score {doc['overall']['score']:.3f}, {m['output_tokens_per_s']:.1f} tok/s")
        routes_file.write_text(yaml.safe_dump(routes(pools)))
        _wait_routes(base)
        arms: dict[str, list[dict[str, Any]]] = {}
        walls: dict[str, float] = {}
        for arm in POLICIES:
            log(f"phase 2: {arm}")
            t0 = time.monotonic()
            results = asyncio.run(_ask(base, arm, arm, args.limit, args.c))
            walls[arm] = time.monotonic() - t0
            time.sleep(2)  # the last settlements
            arms[arm] = rep.rows(arm, results, ledger(base))
        return {"pools": pools, "arms": arms, "walls": walls}
    finally:
        stop(server)


def main(argv: list[str] | None = None) -> None:
    p = scaffold.parser(__doc__, quick=True)
    p.add_argument("-c", type=int, default=4, help="requests in flight")
    p.add_argument("--limit", type=int, default=None, help="the first N items of each set")
    p.add_argument("--hourly", type=float, default=0.10, help="$/hour of the machine")
    p.add_argument("--ttft-x", type=float, default=2.0, help="SLO: × the reference's p50 TTFT")
    p.add_argument("--tpot-x", type=float, default=1.5, help="SLO: × the reference's p50 TPOT")
    args = p.parse_args(argv)
    if args.quick and args.limit is None:
        args.limit = 10
    with tempfile.TemporaryDirectory(prefix="router-eval-") as tmp:
        got = measure(args, Path(tmp))
    slo = rep.slo_targets(got["pools"][REFERENCE]["measure"], args.ttft_x, args.tpot_x)
    env = environment(prepared_model_dir())
    items = len(next(iter(got["arms"].values())))
    stem = scaffold.stem("router-eval", args, env["date"])
    for name, pool in got["pools"].items():  # each pool's eval report, as switchyard eval writes it
        pool["report"] = f"{stem}-eval-{name}.json"
        eval_report.write(pool["eval"], args.out, f"{stem}-eval-{name}")
    doc = {
        "command": scaffold.command("router_eval", argv),
        "environment": env,
        "stem": stem,
        "parameters": {"concurrency": args.c, "limit": args.limit, "hourly": args.hourly,
                       "ttft_x": args.ttft_x, "tpot_x": args.tpot_x, "reference": REFERENCE},
        "items": items,
        "slo": slo,
        "policies": DESCRIBED,
        "routes": routes(got["pools"]),  # its reports beside it: it loads from args.out
        "pools": {n: {k: v for k, v in g.items() if k not in ("rows", "eval")}
                  for n, g in got["pools"].items()},
        "arms": {arm: rep.summarise(table, slo, got["walls"][arm], args.hourly)
                 for arm, table in got["arms"].items()},
        "rows": {"pools": {n: g["rows"] for n, g in got["pools"].items()}, "arms": got["arms"]},
    }  # fmt: skip
    scaffold.finish(args, doc["stem"], doc, rep.markdown(doc), lambda path: rep.plot(doc, path))


if __name__ == "__main__":
    main()
