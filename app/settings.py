"""Process settings, read once at start-up (environment variables ``SWITCHYARD_*``)
and passed down explicitly. Nothing below ``app.builders`` and the CLI reads the
environment."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("switchyard"))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWITCHYARD_", extra="forbid")

    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Where prepared models and engine caches live.",
    )
    log_level: str = "INFO"

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def vllm_cache_dir(self) -> Path:
        return self.cache_dir / "vllm"


def load_settings() -> Settings:
    """The one place the environment is read."""
    return Settings()
