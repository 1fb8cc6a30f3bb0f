"""The dated API price table ``switchyard cost`` compares against (``prices.yaml``).

A row: provider, model, input/output (and optionally cached-input) USD per 1M tokens,
the date its source stated the price, and the source. A row without a date or a source,
or with a negative price, is refused with a message naming the row; so is a table with
two rows for the same provider, model and date.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from app.schema import StrictFrozen


class PriceRow(StrictFrozen):
    provider: str = Field(min_length=1)
    model: str = Field(min_length=1)
    input_per_1m: float = Field(ge=0)
    output_per_1m: float = Field(ge=0)
    cached_input_per_1m: float | None = Field(default=None, ge=0)
    date: dt.date
    source: str = Field(min_length=1)
    note: str | None = None

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"


class PriceTable(StrictFrozen):
    rows: tuple[PriceRow, ...] = Field(min_length=1)

    def find(self, name: str) -> PriceRow:
        """The newest row for ``provider/model`` or ``model``."""
        found = [r for r in self.rows if name in (r.name, r.model)]
        if not found:
            raise KeyError(f"no price for {name!r}; known: {', '.join(r.name for r in self.rows)}")
        return max(found, key=lambda r: r.date)


def _label(index: int, raw: Any) -> str:
    if isinstance(raw, dict):
        return f"price row {index + 1} ({raw.get('provider', '?')}/{raw.get('model', '?')})"
    return f"price row {index + 1}"


def parse_prices(data: Any, origin: str = "prices") -> PriceTable:
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{origin}: expected a mapping with a list of `rows`")
    unknown = set(data) - {"rows"}
    if unknown:
        raise ValueError(f"{origin}: unknown key(s) {sorted(unknown)}")
    rows, seen = [], set()
    for i, raw in enumerate(data["rows"]):
        try:
            row = PriceRow.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"{origin}: {_label(i, raw)}: {problems}") from None
        key = (row.provider, row.model, row.date)
        if key in seen:
            raise ValueError(
                f"{origin}: {_label(i, raw)}: a second row for {row.name} on {row.date}"
            )
        seen.add(key)
        rows.append(row)
    return PriceTable(rows=tuple(rows))


def load_prices(path: Path) -> PriceTable:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"price table {str(path)!r} cannot be read: {exc.strerror}") from None
    return parse_prices(data, str(path))
