r"""Attention: every entry point, sharing one argument resolver.

- ``softmaxbook.attention.sdpa``: :func:`scaled_dot_product_attention` with a
  pluggable normalizer, a drop-in for torch's;
- :mod:`~softmaxbook.attention.online`: the online softmax and the merge of
  partial results;
- :mod:`~softmaxbook.attention.flash`: FlashAttention, forward and backward;
- :mod:`~softmaxbook.attention.flex`: FlexAttention-style score and mask functions;
- :mod:`~softmaxbook.attention.decode`: decoding with a KV cache, grouped-query
  heads, split-K;
- :mod:`~softmaxbook.attention.ring`: ring attention between processes;
- :mod:`~softmaxbook.attention.differential`,
  :mod:`~softmaxbook.attention.selective`, :mod:`~softmaxbook.attention.capping`:
  differential and selective attention, bounded logits;
- :mod:`~softmaxbook.attention.latent`: Multi-head Latent Attention against a
  cached latent, naive or with the up-projections absorbed;
- :mod:`~softmaxbook.attention.linear_recurrent`: causal linear attention and the
  gated delta rule, the recurrent layers that hybrid stacks put beside softmax.

The softmax entry points read their arguments (``mask``/``attn_mask``,
``is_causal``, ``scale``, ``enable_gqa``, ``sinks``, ``dropout_p``) through the
one resolver, ``softmaxbook.attention._args``.
"""

# Each module is an attribute of the package (``sb.attention.flash``).
from . import (  # noqa: F401
    capping,
    decode,
    differential,
    flash,
    flex,
    latent,
    linear_recurrent,
    online,
    ring,
    sdpa,
    selective,
)
from .sdpa import NORMALIZERS, scaled_dot_product_attention

__all__ = ["scaled_dot_product_attention", "NORMALIZERS"]
