"""Model registry and architecture families (one family per file)."""

from capsmed.models.common import ModelOutput
from capsmed.models.registry import (
    count_parameters,
    create_model,
    get_model_entry,
    list_models,
    register_model,
)

__all__ = ["ModelOutput", "count_parameters", "create_model", "get_model_entry",
           "list_models", "register_model"]
