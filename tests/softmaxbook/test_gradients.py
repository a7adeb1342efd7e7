"""Tests of softmaxbook.gradients: the Jacobian, the VJP and the custom autograd
Function."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import softmaxbook as sb
from softmaxbook import reference

RUNNING = [1.0, 0.5, 2.5, -0.1]

rows = arrays(
    np.float64,
    st.integers(1, 12),
    elements=st.floats(-50, 50, allow_nan=False, allow_infinity=False),
)


def _autograd_jacobian(x: torch.Tensor) -> torch.Tensor:
    return torch.autograd.functional.jacobian(lambda z: torch.softmax(z, -1), x)


# ---------------------------------------------------------------- public names
def test_public_names():
    for name in [
        "softmax_jacobian",
        "softmax_backward",
        "SoftmaxFunction",
        "softmax_with_custom_backward",
    ]:
        assert name in sb.__all__
        assert getattr(sb, name) is getattr(sb.gradients, name)


# ---------------------------------------------------------------- the Jacobian
def test_jacobian_running_example_matches_autograd():
    x = torch.tensor(RUNNING, dtype=torch.float64)
    s = torch.softmax(x, -1)
    J = sb.softmax_jacobian(s)
    assert J.shape == (4, 4)
    torch.testing.assert_close(J, _autograd_jacobian(x))


def test_jacobian_kronecker_form_against_numpy_reference():
    x = np.array(RUNNING)
    s = reference.softmax(x)
    expected = np.array(
        [[s[i] * ((i == j) - s[j]) for j in range(4)] for i in range(4)]
    )
    J = sb.softmax_jacobian(torch.from_numpy(s)).numpy()
    np.testing.assert_allclose(J, expected, rtol=1e-12, atol=1e-15)


def test_jacobian_batched_matches_autograd_per_row():
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    J = sb.softmax_jacobian(torch.softmax(x, -1))
    assert J.shape == (2, 3, 5, 5)
    for b in range(2):
        for h in range(3):
            torch.testing.assert_close(J[b, h], _autograd_jacobian(x[b, h]))


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_jacobian_dim_moves_that_axis_to_the_end(dim):
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    s = torch.softmax(x, dim)
    J = sb.softmax_jacobian(s, dim=dim)
    rows = x.movedim(dim, -1)  # (..., N): each row is one softmax along dim
    assert J.shape == rows.shape + (x.shape[dim],)
    for index in np.ndindex(*rows.shape[:-1]):
        torch.testing.assert_close(J[index], _autograd_jacobian(rows[index]))


@settings(max_examples=50, deadline=None)
@given(rows)
def test_jacobian_rows_sum_to_zero_symmetric_psd(x):
    s = torch.softmax(torch.from_numpy(x), -1)
    J = sb.softmax_jacobian(s)
    n = len(x)
    torch.testing.assert_close(
        J.sum(-1), torch.zeros(n, dtype=torch.float64), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(J, J.T, atol=0, rtol=0)
    eig = torch.linalg.eigvalsh(J)
    assert float(eig.min()) >= -1e-12  # positive semidefinite
    assert float(eig.max()) <= 0.5 + 1e-12  # spectral norm at most 1/2
    # The all-ones direction is in the null space: shifting every score changes nothing.
    torch.testing.assert_close(
        J @ torch.ones(n, dtype=torch.float64),
        torch.zeros(n, dtype=torch.float64),
        atol=1e-12,
        rtol=0,
    )


def test_jacobian_spectral_norm_half_is_attained():
    # Two equal scores: J = [[1/4, -1/4], [-1/4, 1/4]], eigenvalues 0 and 1/2.
    J = sb.softmax_jacobian(torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(
        torch.linalg.matrix_norm(J, ord=2), torch.tensor(0.5, dtype=torch.float64)
    )


def test_jacobian_one_hot_and_zero_rows_are_zero():
    for s in ([0.0, 1.0, 0.0], [0.0, 0.0, 0.0]):
        J = sb.softmax_jacobian(torch.tensor(s))
        assert torch.equal(J, torch.zeros(3, 3))


def test_jacobian_size_one_and_empty():
    assert torch.equal(sb.softmax_jacobian(torch.tensor([1.0])), torch.zeros(1, 1))
    assert sb.softmax_jacobian(torch.empty(2, 0)).shape == (2, 0, 0)
    assert sb.softmax_jacobian(torch.empty(0, 3)).shape == (0, 3, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_jacobian_low_precision(dtype):
    s = torch.softmax(torch.tensor(RUNNING), -1).to(dtype)
    J = sb.softmax_jacobian(s)
    assert J.dtype == dtype
    s64 = s.double()  # the same rounded weights
    diag, outer = torch.diag(s64), torch.outer(s64, s64)
    # In dtype: each of s_i s_j and the difference is rounded once.
    bound = torch.finfo(dtype).eps * (diag + outer)
    assert ((J.double() - (diag - outer)).abs() <= bound).all()


# ---------------------------------------------------------------- the VJP
@settings(max_examples=50, deadline=None)
@given(rows, st.integers(0, 2**31 - 1))
def test_backward_matches_autograd_and_jacobian(x, seed):
    x = torch.from_numpy(x).requires_grad_()
    g = torch.randn(
        x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    s = torch.softmax(x, -1)
    (expected,) = torch.autograd.grad(s, x, g)
    got = sb.softmax_backward(s.detach(), g)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got, sb.softmax_jacobian(s.detach()) @ g)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_backward_dim(dim):
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 4, 5, dtype=torch.float64)
    s = torch.softmax(x, dim)
    (expected,) = torch.autograd.grad(s, x, g)
    torch.testing.assert_close(sb.softmax_backward(s.detach(), g, dim=dim), expected)


def test_backward_of_constant_gradient_is_zero():
    # Adding c to every g_i adds c * s * (1 - sum s) = 0: the sum constraint.
    s = torch.softmax(torch.tensor(RUNNING, dtype=torch.float64), -1)
    torch.testing.assert_close(
        sb.softmax_backward(s, torch.full((4,), 3.7, dtype=torch.float64)),
        torch.zeros(4, dtype=torch.float64),
        atol=1e-15,
        rtol=0,
    )


def test_backward_zero_weights_get_zero_gradient():
    s = torch.tensor([0.0, 0.25, 0.75, 0.0])
    g = torch.tensor([5.0, 1.0, -2.0, 1e4])
    out = sb.softmax_backward(s, g)
    assert out[0] == 0 and out[3] == 0
    assert torch.isfinite(out).all()


def test_backward_infinite_upstream_gradient_as_documented():
    """softmax_backward's docstring: an infinite entry of g makes s . g infinite, the
    masked entries nan and the others nan or infinite, not the whole row nan; and a
    finite g whose g_i - s . g overflows gives nan at a masked entry."""
    inf = float("inf")
    out = sb.softmax_backward(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([inf, 0, 0]))
    assert torch.isnan(out[0]) and out[1] == -inf and torch.isnan(out[2])
    out = sb.softmax_backward(torch.tensor([1.0, 0.0]), torch.tensor([-3e38, 3e38]))
    assert out[0] == 0 and torch.isnan(out[1])
    # In float16 the arithmetic runs in float32: float16's largest g cannot overflow.
    big = torch.tensor([-65504.0, 65504.0], dtype=torch.float16)
    out = sb.softmax_backward(torch.tensor([1.0, 0.0], dtype=torch.float16), big)
    assert out.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_low_precision(dtype):
    x = torch.randn(4, 64, dtype=torch.float64)
    s, g = torch.softmax(x, -1).to(dtype), torch.randn(4, 64).to(dtype)
    got = sb.softmax_backward(s, g)
    assert got.dtype == dtype
    # Computed in float32 from the rounded inputs, then rounded once: within half
    # an ulp of the float64 result (plus float32's error, 1e-6 of the largest).
    s64, g64 = s.double(), g.double()
    expected = s64 * (g64 - (s64 * g64).sum(-1, keepdim=True))
    bound = torch.finfo(dtype).eps / 2 * expected.abs() + 1e-6 * expected.abs().max()
    assert ((got.double() - expected).abs() <= bound).all()


def test_backward_dtype_promotion_and_nan():
    s = torch.softmax(torch.randn(5), -1)
    assert (
        sb.softmax_backward(s, torch.randn(5, dtype=torch.float64)).dtype
        == torch.float64
    )
    g = torch.tensor([1.0, float("nan"), 0.0, 0.0, 0.0])
    assert torch.isnan(sb.softmax_backward(s, g)).all()  # a nan gradient is not hidden


def test_backward_empty_and_size_one():
    assert sb.softmax_backward(torch.empty(3, 0), torch.empty(3, 0)).shape == (3, 0)
    out = sb.softmax_backward(torch.ones(2, 1), torch.randn(2, 1))
    assert torch.equal(out, torch.zeros(2, 1))


# ---------------------------------------------------------------- the autograd Function
def test_custom_forward_equals_torch_softmax():
    x = torch.randn(2, 3, 7)
    for dim in (0, 1, -1):
        torch.testing.assert_close(
            sb.softmax_with_custom_backward(x, dim), torch.softmax(x, dim)
        )
    torch.testing.assert_close(sb.SoftmaxFunction.apply(x, -1), torch.softmax(x, -1))


@pytest.mark.parametrize("dim", [0, -1])
def test_custom_gradcheck(dim):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z: sb.softmax_with_custom_backward(z, dim), (x,)
    )


def test_custom_gradgradcheck():
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(sb.softmax_with_custom_backward, (x,))


def test_custom_gradcheck_with_neg_inf_entries():
    base = torch.randn(3, 5, dtype=torch.float64)
    removed = torch.tensor(
        [
            [False, True, False, False, True],
            [False] * 5,
            [True, True, True, True, False],
        ]
    )

    def f(z):
        return sb.softmax_with_custom_backward(z.masked_fill(removed, float("-inf")))

    x = base.clone().requires_grad_()
    assert torch.autograd.gradcheck(f, (x,))
    out = f(x)
    (grad,) = torch.autograd.grad(out, x, torch.randn_like(out))
    assert torch.isfinite(grad).all()
    assert torch.equal(
        grad[removed], torch.zeros(int(removed.sum()), dtype=torch.float64)
    )


def test_custom_matches_torch_gradient_with_neg_inf():
    x = torch.tensor([[1.0, float("-inf"), 2.5, -0.1]], requires_grad=True)
    y = x.detach().clone().requires_grad_()
    g = torch.tensor([[0.3, -1.0, 2.0, 0.5]])
    sb.softmax_with_custom_backward(x).backward(g)
    torch.softmax(y, -1).backward(g)
    torch.testing.assert_close(x.grad, y.grad)
    assert x.grad[0, 1] == 0


def test_custom_fully_neg_inf_row_gives_zeros_forward_and_backward():
    x = torch.tensor(
        [[float("-inf")] * 3, [0.0, 1.0, float("-inf")]], requires_grad=True
    )
    s = sb.softmax_with_custom_backward(x)
    assert torch.equal(s[0], torch.zeros(3))
    torch.testing.assert_close(s[1].sum(), torch.tensor(1.0))
    s.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.equal(x.grad[0], torch.zeros(3))


def test_custom_extreme_and_nan_inputs():
    x = torch.tensor([[1e4, -1e4, 0.0], [1e4, 1e4, 1e4]], requires_grad=True)
    s = sb.softmax_with_custom_backward(x)
    torch.testing.assert_close(
        s, torch.tensor([[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    )
    s[:, 0].sum().backward()
    assert torch.isfinite(x.grad).all()
    nan_row = sb.softmax_with_custom_backward(torch.tensor([0.0, float("nan"), 1.0]))
    assert torch.isnan(nan_row).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_custom_low_precision(dtype):
    x32 = torch.randn(4, 32)
    g = torch.randn(4, 32)
    x = x32.to(dtype).requires_grad_()
    s = sb.softmax_with_custom_backward(x)
    assert s.dtype == dtype
    s.backward(g.to(dtype))
    assert x.grad.dtype == dtype
    ref = x32.to(dtype).double().requires_grad_()
    s64 = torch.softmax(ref, -1)
    g64 = g.to(dtype).double()
    s64.backward(g64)
    # s is stored in dtype (eps/2 relative), the backward runs in float32 and is
    # rounded once: the error is at most eps times the size of the terms of
    # s * (g - s.g), plus float32's own.
    s64 = s64.detach()
    dot = (s64 * g64).sum(-1, keepdim=True)
    terms = s64 * ((g64 - dot).abs() + (s64 * g64.abs()).sum(-1, keepdim=True))
    bound = torch.finfo(dtype).eps * terms + 1e-6 * ref.grad.abs().max()
    assert ((x.grad.double() - ref.grad).abs() <= bound).all()


def test_custom_size_one_and_empty():
    x = torch.randn(3, 1, requires_grad=True)
    s = sb.softmax_with_custom_backward(x)
    assert torch.equal(s, torch.ones(3, 1))
    s.sum().backward()
    assert torch.equal(x.grad, torch.zeros(3, 1))
    assert sb.softmax_with_custom_backward(torch.empty(2, 0)).shape == (2, 0)


# ---------------------------------------------------------------- bad input
def test_errors():
    with pytest.raises(TypeError, match=r"s must be a torch.Tensor"):
        sb.softmax_jacobian([0.5, 0.5])
    with pytest.raises(TypeError, match="s must be a floating-point tensor"):
        sb.softmax_jacobian(torch.tensor([1, 0]))
    with pytest.raises(IndexError, match="dim=2 is out of range"):
        sb.softmax_jacobian(torch.rand(2, 3), dim=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        sb.softmax_jacobian(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"grad_output must be a torch.Tensor"):
        sb.softmax_backward(torch.rand(3), [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="grad_output must be a floating-point tensor"):
        sb.softmax_backward(torch.rand(3), torch.tensor([1, 2, 3]))
    with pytest.raises(
        ValueError, match=r"grad_output must have the shape of s, \(2, 3\)"
    ):
        sb.softmax_backward(torch.rand(2, 3), torch.rand(3, 2))
    with pytest.raises(IndexError, match="dim=-3 is out of range"):
        sb.softmax_backward(torch.rand(2, 3), torch.rand(2, 3), dim=-3)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        sb.softmax_with_custom_backward(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        sb.softmax_with_custom_backward(np.zeros(3))
    with pytest.raises(TypeError, match="dim must be an int"):
        sb.softmax_with_custom_backward(torch.rand(3), dim=1.0)


# ---------------------------------------------------------------- torch.func
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_custom_function_composes_with_torch_func(dim):
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    x[0, 1] = float("-inf")  # a removed key along every dim
    x[1, :, 2] = float("-inf")
    f = sb.softmax_with_custom_backward
    batched = torch.func.vmap(lambda t: f(t, dim))(x)
    looped = torch.stack([f(t, dim) for t in x])
    torch.testing.assert_close(batched, looped, atol=1e-15, rtol=1e-13)
    # jacrev (reverse mode), jacfwd (forward mode) and grad agree with torch.softmax.
    row = torch.randn(3, 6, dtype=torch.float64)
    expected = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, dim), row)
    torch.testing.assert_close(torch.func.jacrev(lambda t: f(t, dim))(row), expected)
    torch.testing.assert_close(torch.func.jacfwd(lambda t: f(t, dim))(row), expected)
    w = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(
        torch.func.grad(lambda t: (f(t, dim) * w).sum())(row),
        torch.func.grad(lambda t: (torch.softmax(t, dim) * w).sum())(row),
    )
    # Second order through the hand-written backward: the Hessian of a weighted sum.
    torch.testing.assert_close(
        torch.func.hessian(lambda t: (f(t, -1) * w[0]).sum())(row[0]),
        torch.func.hessian(lambda t: (torch.softmax(t, -1) * w[0]).sum())(row[0]),
    )
