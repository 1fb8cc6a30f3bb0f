"""The pydantic bases of every config file Switchyard reads and every body it
validates: an unknown field is refused with its name (a typo in a config file or a
request is an error, never a setting silently ignored). ``StrictFrozen`` also makes
the values immutable once read (settings read once at start-up and passed down)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StrictFrozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
