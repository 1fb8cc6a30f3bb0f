"""Model sources resolved where the replica runs: an ``s3://`` model is downloaded by
its LLMServer replica (its own Ray worker process) from a real S3-compatible server on
127.0.0.1 into the node's cache, then served by the real vLLM CPU engine; the routes
file is read by the ModelRouter replica, not by the builder."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI
from ray import serve

from app.models.s3 import S3Location
from app.models.store import MANIFEST_NAME, read_valid_manifest
from tests.integration.conftest import Deploy
from tests.s3_server import upload_folder

URL = "s3://switchyard-models/tiny/llama"


def test_an_s3_model_is_fetched_by_its_replica_and_served(
    deploy: Deploy, s3_endpoint: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    upload_folder(s3_endpoint, tiny_model_dir, "switchyard-models", "tiny/llama", sha256=True)
    cache = tmp_path_factory.mktemp("s3-node-cache")
    model = {"id": "tiny-s3", "source": URL, "max_model_len": 512,
             "kv_cache_memory_bytes": 64 * 1024**2, "max_num_seqs": 4}  # fmt: skip
    gw = deploy(
        "s3src",
        {"models": [model], "gateway": {"anonymous_tenant": "s3-t"}},
        s3_endpoint_url=s3_endpoint,
        cache_dir=cache,
    )
    try:
        client = OpenAI(base_url=gw.v1, api_key=gw.api_key)
        out = client.chat.completions.create(
            model="tiny-s3", messages=[{"role": "user", "content": "hello"}],
            max_tokens=4, temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert out.usage is not None and out.usage.completion_tokens == 4
        assert out.usage.prompt_tokens > 0  # counted by the replica (no tokenizer here)
        dest = S3Location.parse(URL, s3_endpoint).cache_dir(cache / "models")
        manifest = read_valid_manifest(dest, URL, {"source": URL}, verify=True)
        assert manifest is not None and manifest.converter == {
            "checked": repr([("sha256", len(manifest.files))])
        }
        uploaded = sorted(
            p.relative_to(tiny_model_dir).as_posix()
            for p in tiny_model_dir.rglob("*")
            if p.is_file() and p.name != MANIFEST_NAME
        )
        assert [f.path for f in manifest.files] == uploaded
        assert (dest / MANIFEST_NAME).is_file()
    finally:
        serve.delete("s3src")


def test_the_routes_file_is_read_where_the_router_runs(
    deploy: Deploy, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Built with an absolute routes_file this process cannot see yet (as on a cluster,
    where it is mounted on the router's node), the application serves the file's
    models once the router, starting after the build, reads it."""
    folder = tmp_path_factory.mktemp("router-node")
    routes = folder / "routes.yaml"
    args = {
        "models": [{"id": "rf-sim", "engine": "simulated"}],
        "routes_file": str(routes),
        "gateway": {"anonymous_tenant": "rf-t"},
    }

    def mount() -> None:  # the file appears "on the router's node" after the build
        routes.write_text(
            "pools: {main: {kind: local, model: rf-sim}}\nmodels: {public-chat: {pool: main}}\n"
        )

    gw = deploy("routesfile", args, before_run=mount)
    try:
        client = OpenAI(base_url=gw.v1, api_key=gw.api_key)
        assert [m.id for m in client.models.list().data] == ["public-chat"]
        out = client.chat.completions.create(
            model="public-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert out.usage is not None and out.usage.completion_tokens == 2
    finally:
        serve.delete("routesfile")
