"""Where an adapter's files are on this node: a directory source as it is, an ``s3://``
source downloaded once per node into ``<models dir>/adapters`` (the same fetch, manifest
and lock as an ``s3://`` model, requiring ``adapter_config.json`` under the prefix).
Credentials come from the environment (boto3's chain) and are never logged."""

from __future__ import annotations

from pathlib import Path

from app.models.s3 import SCHEME, S3Location, S3SourceError, fetch_model
from app.state.records import AdapterRecord


def is_s3(source: str) -> bool:
    return source.startswith(SCHEME)


def location(record: AdapterRecord) -> S3Location:
    return S3Location.parse(record.source, record.s3_endpoint_url, record.s3_region)


def local_dir(record: AdapterRecord, adapters_dir: Path | None) -> Path:
    """The directory holding ``record``'s files on this node, fetched first when its
    source is object storage (blocking: run it on a thread). Raises ``S3SourceError``."""
    if not is_s3(record.source):
        return Path(record.source)
    if adapters_dir is None:
        raise S3SourceError(f"{record.source}: no local directory to fetch adapters into")
    where = location(record)
    dest = where.cache_dir(adapters_dir)
    fetch_model(where, dest, marker="adapter_config.json")
    return dest
