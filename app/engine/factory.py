"""Engine configurations (a discriminated union on ``kind``) and the one factory
that turns a configuration into an ``Engine``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from app.engine.kv_publisher import ZmqKvPublisher
from app.engine.protocol import Engine
from app.engine.simulated import SimulatedEngine, SimulationProfile
from app.engine.tokenizer import HFPromptTokenizer, PromptTokenizer, SimulatedPromptTokenizer
from app.engine.vllm_engine import VLLMEngine, VLLMEngineConfig
from app.schema import StrictFrozen


class SimulatedEngineConfig(StrictFrozen):
    """A simulated engine: no weights, a calibrated timing model."""

    kind: Literal["simulated"] = "simulated"
    served_name: str
    task: Literal["generate", "embed"] = "generate"
    profile: SimulationProfile = Field(default_factory=SimulationProfile)
    # Publish the prefix cache's KV events (a router in precise mode follows them).
    publish_kv_events: bool = False
    # US dollars per hour of this replica's accelerators: its engine seconds' price.
    hourly_usd: float = 0.0


EngineConfig = Annotated[VLLMEngineConfig | SimulatedEngineConfig, Field(discriminator="kind")]


def build_engine(
    config: VLLMEngineConfig | SimulatedEngineConfig,
    kv_events_port: int | None = None,
    side_channel: tuple[str, int] | None = None,
) -> Engine:
    """``kv_events_port``: where the engine publishes its KV-cache events (ZMQ PUB on
    every interface), when its config asks it to; ``side_channel``: where a vLLM
    engine with a KV connector listens for its peers' handshakes."""
    if isinstance(config, SimulatedEngineConfig):
        publisher = None
        if config.publish_kv_events and kv_events_port is not None:
            publisher = ZmqKvPublisher(kv_events_port)
        return SimulatedEngine(config.profile, task=config.task, kv_publisher=publisher)
    return VLLMEngine(
        config,
        kv_events_port=kv_events_port if config.publish_kv_events else None,
        side_channel=side_channel,
    )


def build_tokenizer(config: VLLMEngineConfig | SimulatedEngineConfig) -> PromptTokenizer:
    """The prompt tokenizer of the engine ``config`` describes, without the engine."""
    if isinstance(config, SimulatedEngineConfig):
        return SimulatedPromptTokenizer(config.profile.vocab_size)
    return HFPromptTokenizer.from_path(config.model_path)
