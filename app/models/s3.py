"""Model sources in S3-compatible object storage: ``s3://bucket/prefix``.

Rule: every object under ``prefix/`` is downloaded once per node into
``<models_dir>/s3/<name>-<digest>/`` (``digest`` = sha256 of endpoint and URL, 12 hex),
under the same lock, staging directory, atomic rename and manifest as the embedded
models (:mod:`app.models.store`; a manifest uploaded with the model is left out, this
cache writes its own), so two replicas on one node download once and a
reader never sees half a model. Each object is checked after download:

* its size against the listing, always;
* its SHA-256 against the object's ``ChecksumSHA256`` when the object was uploaded with
  one (a full-object checksum; a multipart ``…-N`` checksum cannot be recomputed from
  the file and is skipped);
* else its MD5 against the ``ETag`` when the ETag is a plain MD5 (single-part uploads
  without KMS encryption; a multipart ``…-N`` ETag is skipped).

A mismatch fails the fetch and nothing is published. The manifest then records every
file's SHA-256, so a later start reuses the directory after a cheap name-and-size check
(``verify=True`` re-hashes it). Progress (bytes done of the total) is reported to a
callback at most every ``progress_every_s`` and once at the end.

Credentials come from the standard AWS chain in the process that fetches (environment,
web identity on Kubernetes, instance profile) and are never logged; the endpoint (for
S3-compatible servers) and the region come from settings. Nothing here talks to a model
hub.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from app.models.store import (
    MANIFEST_NAME,
    Manifest,
    directory_lock,
    file_sha256,
    hash_files,
    publish_directory,
    read_valid_manifest,
    staging_directory,
    write_manifest,
)

log = logging.getLogger(__name__)

SCHEME = "s3://"


class S3SourceError(RuntimeError):
    """A model could not be fetched from object storage; the message says why."""


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/prefix`` plus where the server is (None: AWS's own endpoint)."""

    bucket: str
    prefix: str
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def parse(
        cls, url: str, endpoint_url: str | None = None, region: str | None = None
    ) -> S3Location:
        if not url.startswith(SCHEME):
            raise ValueError(f"{url!r} is not an s3:// URL")
        bucket, _, prefix = url[len(SCHEME) :].partition("/")
        prefix = prefix.strip("/")
        if not bucket or not prefix:
            raise ValueError(f"{url!r}: give s3://BUCKET/PREFIX (the model's folder)")
        if any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ValueError(f"{url!r}: the prefix may not contain empty, '.' or '..' parts")
        return cls(bucket, prefix, endpoint_url, region)

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"

    def cache_dir(self, models_dir: Path) -> Path:
        digest = hashlib.sha256(f"{self.endpoint_url or ''}\n{self.url}".encode()).hexdigest()
        name = PurePosixPath(self.prefix).name
        return models_dir / "s3" / f"{name}-{digest[:12]}"


@dataclass(frozen=True)
class FetchProgress:
    """``done`` of ``total`` bytes of ``source`` are on this node."""

    source: str
    done: int
    total: int


ProgressFn = Callable[[FetchProgress], None]


def _client(location: S3Location) -> Any:
    import boto3  # imported here: only nodes that fetch from S3 need it

    return boto3.session.Session().client(
        "s3", endpoint_url=location.endpoint_url, region_name=location.region
    )


def _objects(client: Any, location: S3Location) -> list[dict[str, Any]]:
    """The objects under the prefix (folder markers left out), sorted by key."""
    paginator = client.get_paginator("list_objects_v2")
    found: list[dict[str, Any]] = []
    for page in paginator.paginate(Bucket=location.bucket, Prefix=location.prefix + "/"):
        found.extend(o for o in page.get("Contents", []) if not o["Key"].endswith("/"))
    return sorted(found, key=lambda o: o["Key"])


def check_object(path: Path, size: int, etag: str | None, sha256_b64: str | None) -> str:
    """How ``path`` was checked against the object's metadata ("sha256", "md5" or
    "size"); raises ``S3SourceError`` on a mismatch."""
    actual = path.stat().st_size
    if actual != size:
        raise S3SourceError(f"{path.name}: {actual} bytes on disk, the object has {size}")
    if sha256_b64 and "-" not in sha256_b64:
        digest = base64.b64encode(bytes.fromhex(file_sha256(path))).decode()
        if digest != sha256_b64:
            raise S3SourceError(f"{path.name}: SHA-256 {digest} != the object's {sha256_b64}")
        return "sha256"
    tag = (etag or "").strip('"')
    if len(tag) == 32 and all(c in "0123456789abcdef" for c in tag):
        with path.open("rb") as handle:
            md5 = hashlib.file_digest(handle, "md5").hexdigest()
        if md5 != tag:
            raise S3SourceError(f"{path.name}: MD5 {md5} != the object's ETag {tag}")
        return "md5"
    return "size"


class _Progress:
    """Thread-safe byte counter that reports at most every ``every_s``."""

    def __init__(self, source: str, total: int, report: ProgressFn | None, every_s: float):
        self._source, self._total, self._report, self._every_s = source, total, report, every_s
        self._done = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self._done += n
            now = time.monotonic()
            if self._report is None or now - self._last < self._every_s:
                return
            self._last = now
            event = FetchProgress(self._source, self._done, self._total)
        self._report(event)

    def finish(self) -> None:
        if self._report is not None:
            self._report(FetchProgress(self._source, self._done, self._total))


def _download(
    client: Any,
    location: S3Location,
    staging: Path,
    progress: _Progress,
    objects: list[dict[str, Any]],
) -> dict[str, str]:
    checks: dict[str, str] = {}
    for obj in objects:
        rel = obj["Key"][len(location.prefix) + 1 :]
        if any(part in ("", ".", "..") for part in rel.split("/")):
            raise S3SourceError(f"object key {obj['Key']!r} does not name a file in the folder")
        dest = staging / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(location.bucket, obj["Key"], str(dest), Callback=progress.add)
        head = client.head_object(Bucket=location.bucket, Key=obj["Key"], ChecksumMode="ENABLED")
        checks[rel] = check_object(
            dest, int(obj["Size"]), head.get("ETag"), head.get("ChecksumSHA256")
        )
    return checks


def fetch_model(
    location: S3Location,
    dest: Path,
    *,
    progress: ProgressFn | None = None,
    progress_every_s: float = 2.0,
    verify: bool = False,
    marker: str = "config.json",
) -> bool:
    """Make ``dest`` (``location.cache_dir(models_dir)``) hold the model at ``location``;
    True when it was downloaded now, False when this node had it. ``marker`` is the file
    the prefix must hold (an HF model's config.json; a PEFT adapter's
    adapter_config.json). Raises ``S3SourceError``."""
    origin = {"source": location.url, "endpoint": location.endpoint_url or ""}
    if read_valid_manifest(dest, location.url, origin, verify=verify) is not None:
        return False
    with directory_lock(dest):
        if read_valid_manifest(dest, location.url, origin, verify=verify) is not None:
            return False  # another replica on this node fetched it meanwhile
        try:
            client = _client(location)
            objects = _objects(client, location)
        except S3SourceError:
            raise
        except Exception as exc:  # botocore's errors name the bucket, never the secret
            raise S3SourceError(f"{location.url}: cannot list the objects: {exc}") from exc
        if not any(o["Key"].endswith(f"/{marker}") for o in objects):
            what = "no HF model" if marker == "config.json" else "not what it should hold"
            raise S3SourceError(f"{location.url}: no {marker} under the prefix ({what})")
        objects = [o for o in objects if o["Key"] != f"{location.prefix}/{MANIFEST_NAME}"]
        total = sum(int(o["Size"]) for o in objects)
        counter = _Progress(location.url, total, progress, progress_every_s)
        log.info("fetching %s: %d objects, %d bytes", location.url, len(objects), total)
        with staging_directory(dest) as staging:
            try:
                checks = _download(client, location, staging, counter, objects)
            except S3SourceError:
                raise
            except Exception as exc:
                raise S3SourceError(f"{location.url}: download failed: {exc}") from exc
            counter.finish()
            checked = {
                kind: sum(1 for c in checks.values() if c == kind) for kind in set(checks.values())
            }
            manifest = Manifest.build(
                location.url,
                origin,
                None,
                {"checked": repr(sorted(checked.items()))},
                hash_files(staging),
            )
            write_manifest(staging, manifest)
            publish_directory(staging, dest)
        log.info("fetched %s into %s (%s)", location.url, dest, checked)
        return True
