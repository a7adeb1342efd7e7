r"""Linear attention as a recurrence: a fixed-size state instead of a KV cache.

Causal linear attention (Katharopoulos et al., 2020) drops the softmax, so the
output of query :math:`t` is a sum over the keys before it that can be kept
as a running matrix, the *state* :math:`S_t \in \mathbb{R}^{d_v \times d_k}`:

.. math::

    S_t = \lambda_t S_{t-1} + v_t k_t^\top, \qquad o_t = S_t q_t ,

with an optional per-step decay :math:`\lambda_t \in [0, 1]` (``decay``;
:math:`\lambda_t = 1` is plain linear attention). Unrolled, the same outputs
are a masked matrix product, the *parallel* form used for training:

.. math::

    O = \big( (Q K^\top) \odot D \big) V, \qquad
    D_{tj} = \textstyle\prod_{l=j+1}^{t} \lambda_l \ \ (j \le t), \quad 0 \ (j > t).

The *gated delta rule* of Gated DeltaNet (Yang, Kautz and Hatamizadeh, ICLR
2025) makes each write a correction: before writing :math:`v_t` under
:math:`k_t` it removes what the (decayed) state already returns for
:math:`k_t`,

.. math::

    S_t &= \alpha_t S_{t-1} \big(I - \beta_t k_t k_t^\top\big) + \beta_t v_t k_t^\top \\
        &= \alpha_t S_{t-1} + \beta_t \big(v_t - \alpha_t S_{t-1} k_t\big) k_t^\top ,
    \qquad o_t = S_t q_t ,

with a decay gate :math:`\alpha_t \in [0, 1]` and a write strength
:math:`\beta_t \in [0, 1]`. This is the recurrence that
``torch_recurrent_gated_delta_rule`` in Hugging Face transformers'
``models/qwen3_next/modeling_qwen3_next.py`` computes (there the state is
stored transposed, :math:`d_k \times d_v`, :math:`\alpha_t = e^{g_t}`, the
query is scaled by :math:`1/\sqrt{d_k}`, and Qwen3-Next has the function
L2-normalize queries and keys first, ``use_qk_l2norm_in_kernel=True``).

Both functions here are the recurrent forms, one step per position, written
for reading and for checking (float64), not for speed.
"""

from __future__ import annotations

from numbers import Real

import torch
from torch import Tensor

from .._validate import check_float, check_qkv

__all__ = ["linear_attention", "gated_delta_rule"]

_FORMS = ("recurrent", "parallel")


def _check_qkv(q: object, k: object, v: object) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as attention takes them (one floating dtype and device, ``(..., L,
    d_k)``, ``(..., L, d_k)``, ``(..., L, d_v)``), with one more rule: a recurrence
    pairs query t with key t, so q and k have the same shape, and v k's batch and
    length (no broadcasting)."""
    q, k, v = check_float(q, "q"), check_float(k, "k"), check_float(v, "v")
    check_qkv(q, k, v)
    if q.shape != k.shape:
        raise ValueError(
            f"q and k must have the same shape (..., L, d_k), got {tuple(q.shape)} "
            f"and {tuple(k.shape)}"
        )
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(
            f"v must have shape (..., L, d_v) with the batch and length of k "
            f"{tuple(k.shape[:-1])}, got {tuple(v.shape)}"
        )
    return q, k, v


def _check_gate(g: object, name: str, like: Tensor) -> Tensor:
    """A gate in [0, 1]: a number or a tensor broadcastable to (..., L)."""
    if isinstance(g, Real) and not isinstance(g, bool):
        t = torch.full(like.shape[:-1], float(g), dtype=like.dtype, device=like.device)
    else:
        t = check_float(g, name)
        try:
            t = t.to(like.dtype).expand(like.shape[:-1])
        except RuntimeError:
            raise ValueError(
                f"{name} must broadcast to (..., L) = {tuple(like.shape[:-1])}, "
                f"got {tuple(t.shape)}"
            ) from None
    if torch.compiler.is_compiling():  # no reading values into Python in a graph
        return t
    if bool(torch.isnan(t).any()) or bool(((t < 0) | (t > 1)).any()):
        raise ValueError(f"{name} must lie in [0, 1]")
    return t


def _check_state(state: object, k: Tensor, v: Tensor) -> Tensor:
    want = (*k.shape[:-2], v.shape[-1], k.shape[-1])
    s = check_float(state, "initial_state")
    if tuple(s.shape) != want:
        raise ValueError(
            f"initial_state must have shape (..., d_v, d_k) = {want}, "
            f"got {tuple(s.shape)}"
        )
    return s.to(k.dtype)


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    decay: Tensor | float | None = None,
    form: str = "recurrent",
    initial_state: Tensor | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Causal linear attention, unnormalized, as a recurrence or a masked product.

    .. math::

        S_t = \lambda_t S_{t-1} + v_t k_t^\top, \quad o_t = S_t q_t

    or, all positions at once,

    .. math::

        O = \big((Q K^\top) \odot D\big) V + (\text{initial state term}),

    :math:`D_{tj} = \prod_{l=j+1}^{t} \lambda_l` for :math:`j \le t` and 0
    above the diagonal. With no decay, :math:`o_t = \sum_{j \le t}
    (q_t \cdot k_j)\, v_j`: softmax attention's weights replaced by the raw
    dot products, without a normalizing sum (the normalized form of
    Katharopoulos et al. divides by :math:`\sum_{j \le t} q_t \cdot k_j`;
    call this once with a column of ones appended to ``v`` to get it).
    Any feature map :math:`\phi` is applied by the caller to ``q`` and ``k``.

    Parameters
    ----------
    q, k : Tensor
        ``(..., L, d_k)``, queries and keys (after any feature map).
    v : Tensor
        ``(..., L, d_v)``, values.
    decay : Tensor or float, optional
        :math:`\lambda_t \in [0, 1]`, broadcastable to ``(..., L)``; ``None``
        (the default) is 1.
    form : str
        ``"recurrent"`` (the default), one step per position with a
        ``(..., d_v, d_k)`` state, or ``"parallel"``, the masked
        :math:`L \times L` product. Same function; they
        differ by rounding.
    initial_state : Tensor, optional
        ``(..., d_v, d_k)``, the state before the first position (zeros).
    return_state : bool
        Also return the state after the last position.

    Returns
    -------
    Tensor or (Tensor, Tensor)
        ``(..., L, d_v)`` outputs, and the final state ``(..., d_v, d_k)`` if
        ``return_state``.

    Examples
    --------
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 5, 3, generator=g, dtype=torch.float64)
    >>> a = linear_attention(q, k, v, form="recurrent")
    >>> b = linear_attention(q, k, v, form="parallel")
    >>> bool((a - b).abs().max() < 1e-12)
    True
    """
    q, k, v = _check_qkv(q, k, v)
    if form not in _FORMS:
        raise ValueError(f"form must be one of {_FORMS}, got {form!r}")
    lam = None if decay is None else _check_gate(decay, "decay", k)
    s0 = None if initial_state is None else _check_state(initial_state, k, v)
    length = k.shape[-2]
    if form == "parallel":
        scores = q @ k.transpose(-1, -2)  # (..., L, L)
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        if lam is None:
            d = causal.to(q.dtype)
            carry = torch.ones_like(k[..., 0])  # prod_{l <= t} lambda_l = 1
        else:
            carry = torch.cumprod(lam, dim=-1)  # (..., L): prod_{l <= t} lambda_l
            # m[l, j] = lambda_l where l > j, else 1; its cumulative product down
            # l is prod_{l=j+1}^{t} lambda_l at row t (no division, so lambda may be 0)
            idx = torch.arange(length, device=q.device)
            later = idx.view(-1, 1) > idx.view(1, -1)
            lam_lj = lam.unsqueeze(-1).expand(*lam.shape, length)
            m = torch.where(later, lam_lj, torch.ones_like(lam_lj))
            d = torch.where(causal, torch.cumprod(m, dim=-2), torch.zeros_like(m))
        out = (scores * d) @ v
        state = None
        if s0 is not None:
            out = out + carry.unsqueeze(-1) * (q @ s0.transpose(-1, -2))
        if return_state:
            weights = d[..., -1, :]  # prod_{l=j+1}^{L} lambda_l
            state = (v * weights.unsqueeze(-1)).transpose(-1, -2) @ k
            if s0 is not None:
                state = state + carry[..., -1, None, None] * s0
            return out, state
        return out
    state = (
        s0.clone()
        if s0 is not None
        else torch.zeros(
            *k.shape[:-2], v.shape[-1], k.shape[-1], dtype=k.dtype, device=k.device
        )
    )
    outs = []
    for t in range(length):
        if lam is not None:
            state = lam[..., t, None, None] * state
        state = state + v[..., t, :, None] * k[..., t, None, :]
        outs.append((state @ q[..., t, :, None]).squeeze(-1))
    out = torch.stack(outs, dim=-2) if outs else v.new_zeros(v.shape)
    return (out, state) if return_state else out


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: Tensor | float,
    beta: Tensor | float,
    *,
    initial_state: Tensor | None = None,
    return_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""The gated delta rule (Gated DeltaNet), recurrent form.

    .. math::

        S_t = \alpha_t S_{t-1}\big(I - \beta_t k_t k_t^\top\big) + \beta_t v_t k_t^\top,

        o_t = S_t q_t .

    :math:`\alpha_t = 1` is DeltaNet's delta rule; :math:`\beta_t = 1` with a
    unit key overwrites what the state stored under :math:`k_t` by
    :math:`v_t` (then :math:`S_t k_t = v_t` exactly). The models that use it
    L2-normalize queries and keys first; with unit keys and
    :math:`\alpha_t, \beta_t \in [0, 1]` the transition
    :math:`\alpha_t (I - \beta_t k_t k_t^\top)` has spectral norm at most 1,
    so it never amplifies what the state holds. That alone does not bound the
    state (linear attention's transition, the identity, has norm 1 too, and
    its state grows like :math:`\sqrt{t}` on random pairs); what keeps the
    delta rule's state from growing so is that a write replaces the content
    under :math:`k_t`. With a unit key and :math:`\beta_t = 1`,

    .. math::

        \lVert S_t \rVert_F^2 = \alpha_t^2 \big(\lVert S_{t-1} \rVert_F^2
        - \lVert S_{t-1} k_t \rVert^2\big) + \lVert v_t \rVert^2 .

    This function does not normalize the keys: that is the caller's choice.

    Parameters
    ----------
    q, k : Tensor
        ``(..., L, d_k)``, queries and keys.
    v : Tensor
        ``(..., L, d_v)``, values.
    alpha : Tensor or float
        The decay gate :math:`\alpha_t \in [0, 1]`, broadcastable to ``(..., L)``.
    beta : Tensor or float
        The write strength :math:`\beta_t \in [0, 1]`, broadcastable to ``(..., L)``.
    initial_state : Tensor, optional
        ``(..., d_v, d_k)``, the state before the first position (zeros).
    return_state : bool
        Also return the state after the last position.

    Returns
    -------
    Tensor or (Tensor, Tensor)
        ``(..., L, d_v)`` outputs, and the final state ``(..., d_v, d_k)`` if
        ``return_state``.

    Examples
    --------
    >>> k = torch.eye(3, dtype=torch.float64)[[0, 0]]  # the same key twice
    >>> v = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    >>> _, s = gated_delta_rule(k, k, v, alpha=1.0, beta=1.0, return_state=True)
    >>> (s @ k[0]).tolist()  # the second write replaced the first
    [0.0, 2.0]
    """
    q, k, v = _check_qkv(q, k, v)
    a = _check_gate(alpha, "alpha", k)
    b = _check_gate(beta, "beta", k)
    state = (
        _check_state(initial_state, k, v).clone()
        if initial_state is not None
        else torch.zeros(
            *k.shape[:-2], v.shape[-1], k.shape[-1], dtype=k.dtype, device=k.device
        )
    )
    outs = []
    for t in range(k.shape[-2]):
        kt, vt = k[..., t, :], v[..., t, :]
        state = a[..., t, None, None] * state
        read = (state @ kt.unsqueeze(-1)).squeeze(-1)  # what S returns for k_t
        delta = b[..., t, None] * (vt - read)
        state = state + delta.unsqueeze(-1) * kt.unsqueeze(-2)
        outs.append((state @ q[..., t, :, None]).squeeze(-1))
    out = torch.stack(outs, dim=-2) if outs else v.new_zeros(v.shape)
    return (out, state) if return_state else out
