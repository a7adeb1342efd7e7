"""softmaxbook.attention.linear_recurrent: linear attention and the gated delta rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._dynamo

from softmaxbook.attention.linear_recurrent import gated_delta_rule, linear_attention

B, H, L, DK, DV = 2, 3, 7, 4, 5


def _qkv(seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, DK, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, H, L, DK, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, H, L, DV, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def _gates(seed: int = 0):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.rand(B, H, L, generator=g, dtype=torch.float64)


def _numpy_linear(q, k, v, lam=None):
    """o_t = sum_{j<=t} (prod_{l=j+1}^{t} lam_l) (q_t . k_j) v_j, in NumPy loops."""
    q, k, v = (t.numpy() for t in (q, k, v))
    lam = np.ones(q.shape[:-1]) if lam is None else lam.numpy()
    out = np.zeros(v.shape)
    for idx in np.ndindex(*q.shape[:-2]):
        for t in range(q.shape[-2]):
            for j in range(t + 1):
                w = np.prod(lam[idx][j + 1 : t + 1]) * (q[idx][t] @ k[idx][j])
                out[idx][t] += w * v[idx][j]
    return out


def _numpy_gated_delta(q, k, v, alpha, beta):
    """S_t = S_{t-1} (alpha_t (I - beta_t k k^T)) + beta_t v k^T, the paper's form."""
    q, k, v, a, b = (t.numpy() for t in (q, k, v, alpha, beta))
    out = np.zeros(v.shape)
    for idx in np.ndindex(*q.shape[:-2]):
        s = np.zeros((v.shape[-1], k.shape[-1]))
        for t in range(q.shape[-2]):
            kt = k[idx][t]
            trans = a[idx][t] * (np.eye(k.shape[-1]) - b[idx][t] * np.outer(kt, kt))
            s = s @ trans + b[idx][t] * np.outer(v[idx][t], kt)
            out[idx][t] = s @ q[idx][t]
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("decayed", [False, True])
def test_linear_attention_forms_agree_with_numpy_sum(seed, decayed):
    q, k, v = _qkv(seed)
    lam = _gates(seed) if decayed else None
    want = _numpy_linear(q, k, v, lam)
    for form in ("recurrent", "parallel"):
        got = linear_attention(q, k, v, decay=lam, form=form).numpy()
        assert np.abs(got - want).max() <= 1e-12 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("decayed", [False, True])
def test_linear_attention_states_and_initial_state_agree(decayed):
    q, k, v = _qkv(1)
    lam = _gates(1) if decayed else None
    s0 = torch.randn(B, H, DV, DK, dtype=torch.float64)
    o_r, s_r = linear_attention(q, k, v, decay=lam, initial_state=s0, return_state=True)
    o_p, s_p = linear_attention(
        q, k, v, decay=lam, initial_state=s0, return_state=True, form="parallel"
    )
    assert (o_r - o_p).abs().max() <= 1e-12
    assert (s_r - s_p).abs().max() <= 1e-12
    # splitting the sequence and carrying the state gives the same outputs
    o1, s1 = linear_attention(
        q[..., :3, :],
        k[..., :3, :],
        v[..., :3, :],
        decay=None if lam is None else lam[..., :3],
        initial_state=s0,
        return_state=True,
    )
    o2 = linear_attention(
        q[..., 3:, :],
        k[..., 3:, :],
        v[..., 3:, :],
        decay=None if lam is None else lam[..., 3:],
        initial_state=s1,
    )
    assert (torch.cat([o1, o2], dim=-2) - o_r).abs().max() <= 1e-12


@pytest.mark.parametrize("seed", range(3))
def test_gated_delta_rule_agrees_with_the_papers_matrix_form(seed):
    q, k, v = _qkv(seed)
    k = k / k.norm(dim=-1, keepdim=True)
    alpha, beta = _gates(seed), _gates(seed + 7)
    want = _numpy_gated_delta(q, k, v, alpha, beta)
    got = gated_delta_rule(q, k, v, alpha, beta).numpy()
    assert np.abs(got - want).max() <= 1e-12 * max(1.0, np.abs(want).max())


def test_gated_delta_rule_with_beta_zero_keeps_only_the_decayed_initial_state():
    q, k, v = _qkv(2)
    s0 = torch.randn(B, H, DV, DK, dtype=torch.float64)
    out, s = gated_delta_rule(q, k, v, 0.5, 0.0, initial_state=s0, return_state=True)
    assert (s - 0.5**L * s0).abs().max() <= 1e-14
    assert (
        out[..., 0, :] - 0.5 * (s0 @ q[..., 0, :, None]).squeeze(-1)
    ).abs().max() <= 1e-13


def test_delta_rule_overwrites_a_unit_key_and_stays_bounded():
    g = torch.Generator().manual_seed(3)
    k = torch.randn(200, DK, generator=g, dtype=torch.float64)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(200, DV, generator=g, dtype=torch.float64)
    _, s = gated_delta_rule(k, k, v, 1.0, 1.0, return_state=True)
    assert (s @ k[-1] - v[-1]).abs().max() <= 1e-12  # the last write is read back
    # each step projects k_t out and writes one rank-1 term: no growth with t
    assert torch.linalg.matrix_norm(s, ord=2) <= v.norm(dim=-1).max() * DK
    _, s_lin = linear_attention(k, k, v, return_state=True)
    assert torch.linalg.matrix_norm(s_lin, ord=2) > torch.linalg.matrix_norm(s, ord=2)


def test_gradcheck_float64():
    q, k, v = (t[:1, :1, :4].clone().requires_grad_() for t in _qkv(4))
    lam = _gates(4)[:1, :1, :4].clone().requires_grad_()
    beta = _gates(5)[:1, :1, :4].clone().requires_grad_()
    for form in ("recurrent", "parallel"):
        assert torch.autograd.gradcheck(
            lambda q, k, v, lam, form=form: linear_attention(
                q, k, v, decay=lam, form=form
            ),
            (q, k, v, lam),
        )
    assert torch.autograd.gradcheck(
        lambda q, k, v, a, b: gated_delta_rule(q, k, v, a, b), (q, k, v, lam, beta)
    )


def test_float32_inputs_give_float32():
    q, k, v = _qkv(0, torch.float32)
    assert linear_attention(q, k, v).dtype == torch.float32
    assert gated_delta_rule(q, k, v, 0.9, 0.5).dtype == torch.float32


def test_bad_inputs_name_the_argument():
    q, k, v = _qkv(0)
    with pytest.raises(TypeError, match="q must be"):
        linear_attention(q.numpy(), k, v)
    with pytest.raises(TypeError, match="floating"):
        linear_attention(q, k.long(), v)
    with pytest.raises(ValueError, match="q and k"):
        linear_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="v must"):
        linear_attention(q, k, v[..., :3, :])
    with pytest.raises(ValueError, match="form"):
        linear_attention(q, k, v, form="chunked")
    with pytest.raises(ValueError, match="decay"):
        linear_attention(q, k, v, decay=1.5)
    with pytest.raises(ValueError, match="alpha"):
        gated_delta_rule(q, k, v, -0.1, 0.5)
    with pytest.raises(ValueError, match="beta"):
        gated_delta_rule(q, k, v, 0.5, torch.full((B, H, L), 2.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="beta must broadcast"):
        gated_delta_rule(q, k, v, 0.5, torch.rand(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="initial_state"):
        gated_delta_rule(q, k, v, 0.5, 0.5, initial_state=torch.zeros(DK, DV))


def test_compiles_fullgraph_and_matches_eager():
    torch._dynamo.reset()
    q, k, v = (t[:1, :1, :5].clone().requires_grad_() for t in _qkv(6))
    lam = _gates(6)[:1, :1, :5]

    def f(q, k, v):
        a = linear_attention(q, k, v, decay=lam)
        b = linear_attention(q, k, v, decay=lam, form="parallel")
        return a + b + gated_delta_rule(q, k, v, lam, 0.5)

    eager = f(q, k, v)
    (g_eager,) = torch.autograd.grad(eager.sum(), q)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    (g_comp,) = torch.autograd.grad(compiled.sum(), q)
    assert (compiled - eager).abs().max() <= 1e-12
    assert (g_comp - g_eager).abs().max() <= 1e-12
