"""The contract of a normalizer, checked on every entry of the registry.

``softmaxbook.normalizers.NORMALIZERS`` holds every normalizer with its
properties; each test below is parametrized over it, so a new normalizer is
checked as soon as it is registered, and a normalizer that is not registered
fails ``test_the_registry_holds_every_normalizer``. The shared policy
(``@normalizer``): floating-point tensors only, ``dim`` checked, half precision
computed in float32 and rounded once, 0-d and empty input. The properties:
shape and dtype kept, weights non-negative, summing to one where the registry
says so, exact zeros where it says sparse; ``-inf`` is a removed key (weight 0,
gradient 0), a row with nothing left gives zeros forward and backward (``nan``
for softmax, as in torch), large scores do not overflow, ``nan`` propagates,
float64 gradcheck passes, and torch.func (vmap, grad, jacrev) agrees with loops
and autograd. Each one is usable by name in attention.

Each normalizer's own math (against its formula, the authors' code, the entmax
package) is tested in its own file: test_softmax, test_alternatives,
test_sinks, test_length, test_stickbreaking.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math

import numpy as np
import pytest
import torch

import softmaxbook as sb
import softmaxbook.normalizers as normalizers
from random_inputs import scores, vjp
from softmaxbook.normalizers import NORMALIZERS, all_normalizers

INFOS = {info.name: info for info in all_normalizers()}
NAMES = list(INFOS)
# The public functions of softmaxbook.normalizers that are not normalizers: a
# log-probability, a reduction, a scale factor, and the registry's helper.
NOT_NORMALIZERS = {"log_softmax", "logsumexp", "yarn_logit_scale", "all_normalizers"}
# Options other than the defaults, so the options are exercised too.
OPTIONS = {"sink_softmax": {"sinks": 0.5}, "entmax_bisect": {"alpha": 1.3}}
# Maps whose value on a row changes when a removed key is dropped from it: the
# default bias of the sigmoid counts every key, -inf or not.
COUNT_REMOVED_KEYS = {"sigmoid_normalize"}
# Maps whose weights are not normalized at all: their sum may exceed one.
UNBOUNDED_SUMS = {"sigmoid_normalize", "relu_attention"}
# Maps that multiply the scores by a factor first: rounding scores of ~1e4 in
# float32 moves their difference by up to eps * 1e4, a weight p by p (1 - p)
# <= 1/4 of that.
SCALE_SCORES = {"scalable_softmax", "adaptive_temperature_softmax"}


def _f(name):
    """The normalizer ``name`` with its test options: ``f(x, dim=-1)``."""
    return functools.partial(INFOS[name].function, **OPTIONS.get(name, {}))


# ---------------------------------------------------------------------- the registry


def test_the_registry_holds_every_normalizer():
    public = {
        name
        for name in normalizers.__all__
        if inspect.isfunction(getattr(normalizers, name))
    }
    assert set(NAMES) == public - NOT_NORMALIZERS
    for name, info in INFOS.items():
        # The registered function is the public one, at every path.
        assert info.function is getattr(normalizers, name) is getattr(sb, name)
        assert NORMALIZERS[name] is info and name in sb.__all__


def test_registry_entries_and_aliases():
    assert set(OPTIONS) <= set(NAMES)
    assert NORMALIZERS["relu"] is NORMALIZERS["relu_normalize"]
    assert NORMALIZERS["sigmoid"] is NORMALIZERS["sigmoid_normalize"]
    # The attention front door reads the same registry.
    assert sb.attention.NORMALIZERS is NORMALIZERS is sb.NORMALIZERS
    for name, info in NORMALIZERS.items():
        assert name in (info.name, *info.aliases)
    # Properties the book's tables read.
    assert [n for n in NAMES if INFOS[n].temperature] == ["softmax"]
    assert {n for n in NAMES if INFOS[n].empty_rows == "nan"} == {"softmax"}
    assert {n for n in NAMES if not INFOS[n].upcast} == {"softmax"}
    assert {n for n in NAMES if INFOS[n].sparse} == {
        "sparsemax", "entmax15", "entmax_bisect", "relu_normalize", "softpick",
        "clipped_softmax", "relu_attention",
    }  # fmt: skip
    assert INFOS["entmax_bisect"].parameters == ("alpha", "n_iter")


@pytest.mark.parametrize("name", NAMES)
def test_every_option_has_a_default(name):
    # So that NORMALIZERS[name](scores, dim=-1) works, by name, everywhere.
    signature = inspect.signature(INFOS[name].function)
    assert next(iter(signature.parameters)) == "x" and "dim" in signature.parameters
    for parameter in list(signature.parameters.values())[1:]:
        assert parameter.default is not inspect.Parameter.empty, parameter
    assert signature.parameters["dim"].default == -1
    assert INFOS[name].parameters == tuple(
        p for p in signature.parameters if p not in ("x", "dim")
    )
    assert inspect.getdoc(INFOS[name].function)


def test_the_entries_are_callable_like_their_functions():
    x = scores((3, 5))
    for name, info in NORMALIZERS.items():
        torch.testing.assert_close(info(x, dim=0), info.function(x, dim=0), msg=name)


# ---------------------------------------------------------------------- the policy


@pytest.mark.parametrize("name", NAMES)
def test_bad_input(name):
    f = _f(name)
    for integer in (torch.arange(4), torch.tensor([True, False])):
        with pytest.raises(TypeError, match="x must be a floating-point tensor"):
            f(integer)
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        f([1.0, 2.0])
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        f(np.zeros(4))
    with pytest.raises(IndexError, match="dim=2 is out of range"):
        f(torch.zeros(2, 3), dim=2)
    with pytest.raises(IndexError, match="dim=-3"):
        f(torch.zeros(2, 3), dim=-3)
    with pytest.raises(TypeError, match="dim must be an int"):
        f(torch.zeros(2, 3), dim=1.0)
    with pytest.raises(TypeError, match="dim must be an int"):
        f(torch.zeros(2, 3), dim=True)
    # Calls are bound as Python binds them, with the function's name.
    g = INFOS[name].function
    with pytest.raises(TypeError, match=rf"{name}\(\): missing a required argument"):
        g()
    with pytest.raises(TypeError, match=rf"{name}\(\): got an unexpected keyword"):
        g(torch.zeros(2, 3), no_such_option=1)
    with pytest.raises(TypeError, match=rf"{name}\(\): multiple values for argument"):
        g(torch.zeros(2, 3), x=torch.zeros(2, 3))


@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_and_any_dimension(name):
    f = _f(name)
    x = scores((4, 5, 6)).transpose(0, 2)  # (6, 5, 4), non-contiguous
    p = f(x, dim=1)
    assert p.shape == x.shape and p.dtype == x.dtype
    torch.testing.assert_close(p, f(x.contiguous(), dim=1))
    torch.testing.assert_close(p, f(x.movedim(1, -1)).movedim(-1, 1))
    torch.testing.assert_close(f(x, dim=-3), f(x, dim=0))


@pytest.mark.parametrize("name", NAMES)
def test_empty_size_one_and_scalar(name):
    f = _f(name)
    for shape in [(3, 0), (0, 4), (0,)]:
        x = torch.empty(shape, requires_grad=True)
        p = f(x)
        assert p.shape == shape
        p.sum().backward()  # the result keeps the autograd graph
    one = f(torch.tensor([[0.7], [-2.0]], dtype=torch.float64))
    scalar = f(torch.tensor(0.7, dtype=torch.float64))
    assert scalar.shape == () and float(scalar) == float(one[0, 0])
    if INFOS[name].sums_to_one and name != "relu_normalize":
        assert torch.equal(one, torch.ones(2, 1, dtype=torch.float64))


def _rounded_once(got, exact, dtype):
    """The largest error, in units of the bound of one rounding of float32 to dtype.

    Computed in float32 and rounded once to ``dtype``, each entry is within half
    an ulp, eps/2 relative, of the float64 result (plus float32's own error,
    1e-6 of the largest entry).
    """
    eps = torch.finfo(dtype).eps
    bound = eps / 2 * exact.abs() + 1e-6 * exact.abs().max()
    return float(((got.double() - exact).abs() / bound).max())


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("name", NAMES)
def test_low_precision_is_float32_rounded_once(name, dtype):
    # Scores spread enough that every sparse support holds several keys.
    f = _f(name)
    x = scores((4, 33), scale=0.5, dtype=dtype)
    p = f(x)
    assert p.dtype == dtype
    assert _rounded_once(p, f(x.double()), dtype) <= 1
    # The backward pass too: float32 inside, one rounding at the end.
    w = scores((4, 33), scale=1.0, seed=5, dtype=dtype)
    x = x.requires_grad_(True)
    (f(x) * w).sum().backward()
    x64 = x.detach().double().requires_grad_(True)
    (f(x64) * w.double()).sum().backward()
    assert x.grad.dtype == dtype
    if INFOS[name].upcast or dtype == torch.float32:
        assert _rounded_once(x.grad, x64.grad, dtype) <= 1
    else:  # torch's half softmax: its backward runs in the input's dtype
        torch.testing.assert_close(x.grad.double(), x64.grad, atol=4e-3, rtol=0)


# ---------------------------------------------------------------------- the weights


@pytest.mark.parametrize("name", NAMES)
def test_weights_are_nonnegative_and_sum_to_one_where_registered(name):
    f, info = _f(name), INFOS[name]
    x = scores((6, 9), scale=3.0)
    x[:, 0] = 3.0  # every row keeps a positive score (for ReLU)
    p = f(x)
    assert (p >= 0).all()
    sums = p.sum(-1)
    if info.sums_to_one:
        torch.testing.assert_close(sums, torch.ones_like(sums))
    elif name not in UNBOUNDED_SUMS:  # softmax_one, sinks, softpick, ...
        assert (sums <= 1 + 1e-12).all()


@pytest.mark.parametrize("name", NAMES)
def test_exact_zeros_where_registered_sparse(name):
    f = _f(name)
    x = torch.tensor(
        [[3.0, 0.5, -3.0, -5.0], [2.0, 1.9, -0.2, -8.0]], dtype=torch.float64
    )
    p = f(x)
    if INFOS[name].sparse:
        assert (p == 0).any(), p  # finite scores, weight exactly 0
    else:
        assert (p > 0).all(), p


@pytest.mark.parametrize("name", NAMES)
def test_minus_inf_entries_are_removed_keys(name):
    f = _f(name)
    x = scores((4, 7))
    x[:, 0] = 3.0  # every row keeps a positive score
    removed = torch.zeros_like(x, dtype=torch.bool)
    removed[:, [2, 5]] = True
    p, g = vjp(f, x.masked_fill(removed, float("-inf")))
    assert (p[removed] == 0).all() and (g[removed] == 0).all()
    assert torch.isfinite(p).all() and torch.isfinite(g).all()
    if name not in COUNT_REMOVED_KEYS:  # a removed key is as if it were not there
        torch.testing.assert_close(p[:, ~removed[0]], f(x[:, ~removed[0]]))


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str
)
@pytest.mark.parametrize("name", NAMES)
def test_fully_removed_rows(name, dtype):
    x = scores((3, 5), dtype=dtype)
    x[1] = float("-inf")
    p, g = vjp(_f(name), x)
    assert p.dtype == dtype and g.dtype == dtype
    assert torch.isfinite(p[[0, 2]]).all() and torch.isfinite(g[[0, 2]]).all()
    if INFOS[name].empty_rows == "zeros":  # nothing to attend: zeros, no nan
        assert (p[1] == 0).all() and (g[1] == 0).all()
    else:  # torch.softmax's nan; masked_softmax is the one that gives zeros
        assert INFOS[name].empty_rows == "nan" and torch.isnan(p[1]).all()


@pytest.mark.parametrize("name", NAMES)
def test_large_scores_do_not_overflow(name):
    f = _f(name)
    x = torch.tensor([[1e4, 1e4 - 0.5, 0.0, -1e4]], dtype=torch.float32)
    x.requires_grad_(True)
    p = f(x)
    atol = torch.finfo(torch.float32).eps * 1e4 / 4 if name in SCALE_SCORES else 1e-6
    torch.testing.assert_close(p.double(), f(x.detach().double()), atol=atol, rtol=0)
    p.sum().backward()
    assert torch.isfinite(x.grad).all()
    p16 = f(torch.tensor([[6e4, 5.99e4, 0.0]], dtype=torch.float16))
    assert torch.isfinite(p16).all()


@pytest.mark.parametrize("name", NAMES)
def test_nan_propagates(name):
    x = scores((2, 5))
    x[0, 3] = float("nan")
    p = _f(name)(x)
    assert torch.isnan(p[0, 3]) and torch.isfinite(p[1]).all()


# ---------------------------------------------------------------------- gradients


@pytest.mark.parametrize("name", [n for n in NAMES if INFOS[n].differentiable])
def test_gradcheck(name):
    f = _f(name)
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
    x[0, 1] = float("-inf")  # a removed key
    x[2] = float("-inf")  # a row with nothing to attend
    return x


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("name", NAMES)
def test_vmap_matches_a_loop(name, dim):
    f = _f(name)
    x = scores((5, 4, 6), scale=2.0)
    if INFOS[name].empty_rows == "zeros":
        x = _with_removed_keys(x)
    batched = torch.func.vmap(lambda t: f(t, dim=dim))(x)
    looped = torch.stack([f(t, dim=dim) for t in x])
    # Equal up to the last bits (vectorized and scalar exp may round differently).
    torch.testing.assert_close(batched, looped, atol=1e-15, rtol=1e-13)
    # Over another dimension, into another one.
    batched = torch.func.vmap(lambda t: f(t, dim=dim), in_dims=1, out_dims=2)(x)
    looped = torch.stack([f(x[:, i], dim=dim) for i in range(x.shape[1])], dim=2)
    torch.testing.assert_close(batched, looped, atol=1e-15, rtol=1e-13)


@pytest.mark.parametrize("name", [n for n in NAMES if INFOS[n].differentiable])
def test_jacrev_and_grad_match_autograd(name):
    f = _f(name)
    x = scores((3, 5), scale=1.5, seed=7)
    expected = torch.autograd.functional.jacobian(f, x)
    torch.testing.assert_close(torch.func.jacrev(f)(x), expected)
    w = scores((3, 5), scale=1.0, seed=8)
    _, expected_grad = vjp(f, x, seed=8)
    torch.testing.assert_close(
        torch.func.grad(lambda t: (f(t) * w).sum())(x), expected_grad
    )
    # Per-row Jacobians of a batch: jacrev inside vmap.
    rows = scores((4, 6), scale=1.5, seed=9)
    per_row = torch.func.vmap(torch.func.jacrev(f))(rows)
    for row, jacobian in zip(rows, per_row):
        torch.testing.assert_close(jacobian, torch.autograd.functional.jacobian(f, row))


# ---------------------------------------------------------------------- by name


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
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
    if NORMALIZERS[name].name not in COUNT_REMOVED_KEYS:
        expected = NORMALIZERS[name]((q @ k.transpose(-2, -1) / math.sqrt(8))[:, 0, :3])
        torch.testing.assert_close(w[:, 0, :3], expected)
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, 1] == 0).all()


# ---------------------------------------------------------------------- old paths


@pytest.mark.parametrize("old", ["alternatives", "sinks", "length", "stickbreaking"])
def test_the_old_modules_are_gone_in_0_3(old):
    # Deprecated in 0.2 (they forwarded to softmaxbook.normalizers with a warning),
    # removed in 0.3 as the CHANGELOG said.
    assert importlib.util.find_spec(f"softmaxbook.{old}") is None


def test_softmax_is_a_function_not_a_module():
    assert inspect.isfunction(sb.softmax)
    assert importlib.util.find_spec("softmaxbook.softmax") is None


def test_a_registry_entry_takes_dim_by_keyword_only():
    # sink_softmax's second parameter is sinks, entmax_bisect's alpha: a positional
    # "dim" through the registry would silently be read as that option.
    x = torch.randn(3, 5)
    with pytest.raises(TypeError):
        NORMALIZERS["sink_softmax"](x, 0)
    torch.testing.assert_close(
        NORMALIZERS["sink_softmax"](x, dim=0), sb.sink_softmax(x, dim=0)
    )
