"""Which band and share a request gets (app.fairness.bands): the most specific level
wins; a request may lower its band, and raise it only where its level allows."""

from __future__ import annotations

import pytest

from app.fairness.bands import service_class
from app.state.records import Limits, Priority

KEY_BATCH = Limits(priority="batch")
TENANT_INTERACTIVE = Limits(priority="interactive", share=2.0)
MAY_RAISE = Limits(raise_priority=True)
NEVER_RAISE = Limits(raise_priority=False)

CASES: list[tuple[str, list[Limits], Priority | None, bool, tuple[Priority, float]]] = [
    ("nothing set", [], None, False, ("standard", 1.0)),
    ("the tenant's band and share", [TENANT_INTERACTIVE], None, False, ("interactive", 2.0)),
    ("the key wins over the tenant", [KEY_BATCH, TENANT_INTERACTIVE], None, False,
     ("batch", 2.0)),
    ("a request lowers its band", [TENANT_INTERACTIVE], "standard", False, ("standard", 2.0)),
    ("batch work asks for batch", [], None, True, ("batch", 1.0)),
    ("the header wins over batch work", [], "interactive", True, ("standard", 1.0)),
    ("no raising by default", [KEY_BATCH], "interactive", False, ("batch", 1.0)),
    ("raising where the level allows", [MAY_RAISE, KEY_BATCH], "interactive", False,
     ("interactive", 1.0)),
    ("the most specific raise_priority wins", [NEVER_RAISE, MAY_RAISE, KEY_BATCH], "standard",
     False, ("batch", 1.0)),
]  # fmt: skip


@pytest.mark.parametrize(("levels", "asked", "batch", "want"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])  # fmt: skip
def test_service_class(
    levels: list[Limits], asked: Priority | None, batch: bool, want: tuple[Priority, float]
) -> None:
    assert service_class(levels, asked, batch) == want
