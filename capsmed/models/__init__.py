"""Model registry and architecture families (one family per file).

timm's pattern: the registry imports no model file; this package imports every family
once, after the registry, and each family's ``@register_model`` decorators fill it.
"""

from capsmed.models.common import ModelOutput
from capsmed.models.registry import (
    count_parameters,
    create_model,
    get_model_entry,
    list_models,
    register_model,
)

# isort: split
# The families, imported for their registrations (after the registry they use).
from capsmed.models import (  # noqa: F401
    capsnet,
    convnets,
    em_capsnet,
    lenet,
    parallel,
    recon_convnets,
    resnext,
)

__all__ = ["ModelOutput", "count_parameters", "create_model", "get_model_entry",
           "list_models", "register_model"]
