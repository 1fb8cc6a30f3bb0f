"""Process settings, read once at start-up (environment variables ``SWITCHYARD_*``)
and passed down explicitly. Nothing below ``app.builders`` and the CLI reads the
environment."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("switchyard"))


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("switchyard"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWITCHYARD_", extra="forbid")

    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Where prepared models and engine caches live.",
    )
    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Where the embedded state store (SQLite) lives.",
    )
    journal_dir: Path = Field(
        default_factory=lambda data: data["data_dir"] / "journal",
        description="Where an ingress replica journals settlements the state store did not "
        "take, until it does (one file per replica); default: data_dir/journal.",
    )
    state_url: str | None = Field(
        default=None,
        description="sqlite:///PATH (one node) or redis://HOST:PORT/DB (several ingress "
        "replicas); default: sqlite under data_dir.",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="Bearer token for /admin/...; unset, the admin API is absent."
    )
    jwt_jwks: str | None = Field(
        default=None, description="JWKS file path or URL; unset, JWTs are not accepted."
    )
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_algorithms: tuple[str, ...] = ("RS256", "ES256")
    jwt_tenant_claim: str = "tenant"
    jwt_team_claim: str | None = "team"
    jwt_user_claim: str | None = "sub"
    log_level: str = "INFO"
    proxy_max_body_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="The proxy guard answers 413 above this body size, before any replica "
        "sees the request (the serve config's max_body_bytes may be smaller).",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="A request body must arrive within this (else 408)."
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A new connection must complete its first request's headers within "
        "this, or the proxy closes it.",
    )
    s3_endpoint_url: str | None = Field(
        default=None,
        description="Endpoint of an S3-compatible server for s3:// model sources (MinIO, "
        "Ceph …); unset, AWS S3. Credentials come from the standard AWS chain "
        "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, web identity, instance profile).",
    )
    s3_region: str | None = Field(default=None, description="Region for s3:// sources.")

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def vllm_cache_dir(self) -> Path:
        return self.cache_dir / "vllm"

    @property
    def resolved_state_url(self) -> str:
        return self.state_url or f"sqlite:///{self.data_dir / 'state.db'}"


def load_settings() -> Settings:
    """The one place the environment is read."""
    return Settings()
