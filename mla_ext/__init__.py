"""mla_ext: CUDA kernels for Multi-head Latent Attention (DeepSeek V2/V3/V3.2/V4).

Importing the package loads the compiled library (the ``torch.ops.mla_ext`` schemas and CUDA
kernels) and registers, for every op, the reference as its CPU implementation and a fake for
``torch.compile``. The functions here are typed wrappers that validate their inputs.
"""

from . import _library  # noqa: F401  (loads torch.ops.mla_ext before the registrations below)
from . import reference
from ._validate import MlaInputError
from .absorb import AbsorbWeights, prepare_absorb_weights, q_absorb, v_up
from .cache import concat_and_cache_mla
from .decode import DecodePlan, decode_mla, get_decode_plan
from .sparse import compressed_slot_mapping, sparse_compressed_indices, sparse_decode_mla, sparse_indices_to_slots
from .sparse import sparse_topk_to_slots
from .v4 import concat_and_cache_mla_v4, sparse_decode_mla_v4
from .formats import (
    DS_MLA_ROW_BYTES,
    KV_LORA_RANK,
    LATENT_DIM,
    ROPE_DIM,
    empty_kv_cache,
)

__version__ = "0.1.0"

__all__ = [
    "AbsorbWeights",
    "prepare_absorb_weights",
    "q_absorb",
    "v_up",
    "DS_MLA_ROW_BYTES",
    "KV_LORA_RANK",
    "LATENT_DIM",
    "ROPE_DIM",
    "MlaInputError",
    "compressed_slot_mapping",
    "concat_and_cache_mla",
    "concat_and_cache_mla_v4",
    "DecodePlan",
    "decode_mla",
    "get_decode_plan",
    "empty_kv_cache",
    "reference",
    "sparse_compressed_indices",
    "sparse_decode_mla",
    "sparse_decode_mla_v4",
    "sparse_indices_to_slots",
    "sparse_topk_to_slots",
]
