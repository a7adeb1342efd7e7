"""The contract of a normalizer, checked on every one that sinks, length and
stickbreaking add (and on sink_softmax).

Removed keys (-inf) get weight 0 and gradient 0, a row with nothing left gives
zeros forward and backward in every dtype, half precision is computed in float32
and rounded once, large scores do not overflow, nan propagates, empty and
size-one inputs work, dim may be any dimension, float64 gradcheck passes, and
torch.func (vmap, grad, jacrev) agrees with loops and autograd. Each map is also
usable by name in attention and in the case study's model.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

import softmaxbook as sb
from random_inputs import scores, vjp

MAPS = {
    "softpick": sb.softpick,
    "clipped_softmax": sb.clipped_softmax,
    "relu_attention": sb.relu_attention,
    "scalable_softmax": sb.scalable_softmax,
    "stick_breaking": sb.stick_breaking,
    "adaptive_temperature": sb.adaptive_temperature_softmax,
    "sink_softmax": functools.partial(sb.sink_softmax, sink=0.5),
}
# Maps whose value on a row changes when a removed key is dropped from it.
REGISTERED = [
    "softpick",
    "clipped_softmax",
    "relu_attention",
    "scalable_softmax",
    "stick_breaking",
]


def test_the_registered_names():
    for name in REGISTERED:
        assert sb.NORMALIZERS[name] is getattr(sb, name)


@pytest.mark.parametrize("name", list(MAPS))
def test_minus_inf_entries_are_removed_keys(name):
    f = MAPS[name]
    x = scores((4, 7))
    x[:, 0] = 3.0  # every row keeps a positive score
    removed = torch.zeros_like(x, dtype=torch.bool)
    removed[:, [2, 5]] = True
    p, g = vjp(f, x.masked_fill(removed, float("-inf")))
    assert (p[removed] == 0).all() and (g[removed] == 0).all()
    assert torch.isfinite(p).all() and torch.isfinite(g).all()
    # A removed key is as if it were not there.
    torch.testing.assert_close(p[:, ~removed[0]], f(x[:, ~removed[0]]))


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("name", list(MAPS))
def test_fully_removed_rows_give_zeros_forward_and_backward(name, dtype):
    x = scores((3, 5), dtype=dtype)
    x[1] = float("-inf")
    p, g = vjp(MAPS[name], x)
    assert (p[1] == 0).all() and (g[1] == 0).all()
    assert torch.isfinite(p).all() and torch.isfinite(g).all()
    assert p.dtype == dtype and g.dtype == dtype


def _rounded_once(got, exact, dtype):
    """Largest error in units of one rounding to dtype (plus float32's own 1e-6)."""
    eps = torch.finfo(dtype).eps
    bound = eps / 2 * exact.abs() + 1e-6 * exact.abs().max()
    return float(((got.double() - exact).abs() / bound).max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(MAPS))
def test_half_precision_is_float32_rounded_once(name, dtype):
    f = MAPS[name]
    x = scores((4, 33), scale=1.0, dtype=dtype)
    p = f(x)
    assert p.dtype == dtype
    assert _rounded_once(p, f(x.double()), dtype) <= 1
    w = scores((4, 33), scale=1.0, seed=5, dtype=dtype)
    x = x.requires_grad_(True)
    (f(x) * w).sum().backward()
    x64 = x.detach().double().requires_grad_(True)
    (f(x64) * w.double()).sum().backward()
    assert x.grad.dtype == dtype
    assert _rounded_once(x.grad, x64.grad, dtype) <= 1


@pytest.mark.parametrize("name", list(MAPS))
def test_large_scores_do_not_overflow(name):
    f = MAPS[name]
    x = torch.tensor([[1e4, 1e4 - 0.5, 0.0, -1e4]], dtype=torch.float32)
    x.requires_grad_(True)
    p = f(x)
    atol = 1e-6
    if name in ("scalable_softmax", "adaptive_temperature"):
        # These multiply the scores by a factor first: rounding scores of ~1e4 in
        # float32 moves their difference by up to eps * 1e4, and a weight p by
        # p (1 - p) <= 1/4 of that.
        atol = torch.finfo(torch.float32).eps * 1e4 / 4
    torch.testing.assert_close(p.double(), f(x.detach().double()), atol=atol, rtol=0)
    p.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(
        f(torch.tensor([[6e4, 5.99e4, 0.0]], dtype=torch.float16))
    ).all()


@pytest.mark.parametrize("name", list(MAPS))
def test_nan_propagates(name):
    x = scores((2, 5))
    x[0, 3] = float("nan")
    p = MAPS[name](x)
    assert torch.isnan(p[0, 3]) and torch.isfinite(p[1]).all()


@pytest.mark.parametrize("name", list(MAPS))
def test_empty_size_one_and_scalar(name):
    f = MAPS[name]
    assert f(torch.empty(3, 0)).shape == (3, 0)
    assert f(torch.empty(0, 4)).shape == (0, 4)
    one = f(torch.tensor([[0.7], [-2.0]], dtype=torch.float64))
    scalar = f(torch.tensor(0.7, dtype=torch.float64))
    assert scalar.shape == () and float(scalar) == float(one[0, 0])


@pytest.mark.parametrize("name", list(MAPS))
def test_any_dimension_and_non_contiguous_input(name):
    f = MAPS[name]
    x = scores((4, 5, 6)).transpose(0, 2)  # (6, 5, 4), non-contiguous
    torch.testing.assert_close(f(x, dim=1), f(x.contiguous(), dim=1))
    torch.testing.assert_close(f(x, dim=1), f(x.movedim(1, -1)).movedim(-1, 1))
    torch.testing.assert_close(f(x, dim=-3), f(x, dim=0))


@pytest.mark.parametrize("name", list(MAPS))
def test_gradcheck(name):
    f = MAPS[name]
    # Scores away from the kinks (0 for softpick and ReLU, the clipping points).
    x = scores((3, 6), scale=1.0, seed=11)
    x = torch.where(x.abs() < 0.1, x.sign() * 0.1 + x, x)
    x[0, 1] = float("-inf")
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: f(t, dim=-1), (x,))
    y = scores((5, 2), scale=1.0, seed=12).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: f(t, dim=0), (y,))


def _with_removed_keys(x):
    x = x.clone()
    x[0, 1] = float("-inf")
    x[2] = float("-inf")
    return x


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("name", list(MAPS))
def test_vmap_matches_a_loop(name, dim):
    f = MAPS[name]
    x = _with_removed_keys(scores((5, 4, 6), scale=2.0))
    batched = torch.func.vmap(lambda t: f(t, dim=dim))(x)
    looped = torch.stack([f(t, dim=dim) for t in x])
    torch.testing.assert_close(batched, looped, atol=1e-15, rtol=1e-13)
    batched = torch.func.vmap(lambda t: f(t, dim=dim), in_dims=1, out_dims=2)(x)
    looped = torch.stack([f(x[:, i], dim=dim) for i in range(x.shape[1])], dim=2)
    torch.testing.assert_close(batched, looped, atol=1e-15, rtol=1e-13)


@pytest.mark.parametrize("name", list(MAPS))
def test_jacrev_and_grad_match_autograd(name):
    f = MAPS[name]
    x = scores((3, 5), scale=1.5, seed=7)
    expected = torch.autograd.functional.jacobian(f, x)
    torch.testing.assert_close(torch.func.jacrev(f)(x), expected)
    w = scores((3, 5), scale=1.0, seed=8)
    _, expected_grad = vjp(f, x, seed=8)
    torch.testing.assert_close(
        torch.func.grad(lambda t: (f(t) * w).sum())(x), expected_grad
    )


@pytest.mark.parametrize("name", list(MAPS))
def test_bad_input(name):
    f = MAPS[name]
    with pytest.raises(TypeError, match="floating-point"):
        f(torch.arange(4))
    with pytest.raises(TypeError, match="Tensor"):
        f([1.0, 2.0])
    with pytest.raises(IndexError, match="out of range"):
        f(torch.zeros(2, 3), dim=2)
    with pytest.raises(TypeError, match="dim must be an int"):
        f(torch.zeros(2, 3), dim=1.0)


@pytest.mark.parametrize("name", REGISTERED)
def test_usable_by_name_in_attention_with_fully_masked_rows(name):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    q.requires_grad_(True)
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[:, 1] = False  # query 1 attends to nothing
    mask[:, :, 3] = False  # key 3 is padding
    out, w = sb.scaled_dot_product_attention(
        q, k, v, mask=mask, normalizer=name, return_weights=True
    )
    assert (w[:, 1] == 0).all() and (out[:, 1] == 0).all() and (w[:, :, 3] == 0).all()
    expected = sb.NORMALIZERS[name]((q @ k.transpose(-2, -1) / math.sqrt(8))[:, 0, :3])
    torch.testing.assert_close(w[:, 0, :3], expected)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, 1] == 0).all()
