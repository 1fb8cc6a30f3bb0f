"""Stage 1, authenticate: who is calling (an API key, a JWT or the anonymous tenant;
``app.gateway``), refused with 503 ``shutting_down`` while the replica drains."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.api.errors import shutting_down
from app.api.flow import Call
from app.gateway.gatekeeper import Gatekeeper
from app.request import Caller
from app.state.records import Principal


@dataclass(frozen=True)
class Identity:
    caller: Caller
    principal: Principal  # the key's or the token's record: the plan's limits


async def authenticate(
    call: Call, headers: Mapping[str, str], gatekeeper: Gatekeeper, draining: bool
) -> Identity:
    if draining:
        raise shutting_down()
    caller, principal = await gatekeeper.identify(headers)
    call.tenant = caller.tenant
    return Identity(caller, principal)
