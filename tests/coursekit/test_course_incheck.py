"""coursekit.incheck: one test in the current process, as a notebook, nbgrader or otter
cell runs it, and the table a student notebook prints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from coursekit import incheck
from coursekit.assignments import get_assignment


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def namespace(source: str, filename: str = "/tmp/submission.py") -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "submission"}
    exec(compile(source, filename, "exec"), ns)
    return ns


def reference(aid: str) -> dict[str, Any]:
    return namespace(get_assignment(aid).reference_source())


def message_of(aid: str, test: str, ns: dict[str, Any]) -> str:
    with pytest.raises(AssertionError) as caught:
        incheck.run_test(aid, test, ns)
    return str(caught.value)


def test_a_passing_test_returns_none_and_prints_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert incheck.run_test("softmax", "softmax_values", reference("softmax")) is None
    assert capsys.readouterr().out == ""


def test_a_failure_names_the_test_and_fits_a_notebook_column() -> None:
    stub = namespace(get_assignment("softmax").stub_source())
    text = message_of("softmax", "softmax_values", stub)
    assert text.startswith("softmax_values: With random scores of shape (3, 7)")
    assert "the stub still raises NotImplementedError" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= incheck.WIDTH


def test_unknown_assignments_and_tests_are_value_errors() -> None:
    with pytest.raises(ValueError, match="unknown assignment id 'soft'"):
        incheck.run_test("soft", "softmax_values", {})
    with pytest.raises(ValueError, match="has no test 'values'"):
        incheck.run_test("softmax", "values", {})


def test_a_missing_or_uncallable_function_is_named() -> None:
    assert "softmax is not defined: define it at module level" in message_of(
        "softmax", "softmax_values", {}
    )
    assert "softmax is a int, not a function" in message_of(
        "softmax", "softmax_values", {"softmax": 3}
    )


def test_a_forbidden_call_fails_the_test_and_points_at_the_line() -> None:
    ns = namespace(
        "import torch\n\ndef softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n"
    )
    text = " ".join(message_of("softmax", "softmax_values", ns).split())
    assert "forbidden call:" in text and "aten._softmax" in text
    assert "line 4 of submission.py" in text


def test_a_forbidden_call_counts_even_when_the_student_catches_it() -> None:
    ns = namespace(
        "import torch\n\n"
        "def softmax(x, dim=-1):\n"
        "    try:\n"
        "        return torch.nn.functional.softmax(x, dim=dim)\n"
        "    except Exception:\n"
        "        e = torch.exp(x - x.amax(dim, keepdim=True))\n"
        "        return e / e.sum(dim, keepdim=True)\n"
    )
    assert "forbidden call:" in message_of("softmax", "softmax_values", ns)


def test_autograd_is_forbidden_in_the_gradients_assignment() -> None:
    ns = namespace(
        "import torch\n\n"
        "def softmax_backward(s, grad_output, dim=-1):\n"
        "    x = torch.log(s).detach().requires_grad_(True)\n"
        "    e = torch.exp(x - x.amax(dim, keepdim=True))\n"
        "    y = e / e.sum(dim, keepdim=True)\n"
        "    (g,) = torch.autograd.grad(y, x, grad_output)\n"
        "    return g\n"
    )
    text = " ".join(message_of("gradients", "softmax_backward_values", ns).split())
    assert "forbidden call: torch.autograd.grad" in text
    assert "derive the gradient by hand" in text


def test_the_judge_sees_the_inputs_as_made_not_as_the_student_left_them() -> None:
    # A submission that zeroes its input and returns the uniform weights of zeros
    # would pass if the expectation were computed from the input it left behind.
    ns = namespace(
        "import torch\n\n"
        "def softmax(x, dim=-1):\n"
        "    x.zero_()\n"
        "    return torch.full_like(x, 1 / x.shape[dim])\n"
    )
    assert "expected" in message_of("softmax", "softmax_values", ns)


def test_what_comes_back_is_plain_data() -> None:
    # A NumPy array, and an object that would run code if it were unpickled: both
    # are described in words, never carried back as objects.
    ns = namespace(
        "import torch\n\n"
        "class Evil:\n"
        "    def __reduce__(self):\n"
        "        return (print, ('unpickled!',))\n\n"
        "def softmax(x, dim=-1):\n"
        "    return x.numpy()\n\n"
        "def log_softmax(x, dim=-1):\n"
        "    return Evil()\n"
    )
    assert (
        "is an object of type ndarray; expected a tensor of shape (3, 7)"
        in " ".join(message_of("softmax", "softmax_values", ns).split())
    )
    assert "is an object of type Evil" in message_of(
        "softmax", "log_softmax_values", ns
    )


def test_a_wrong_dtype_is_named() -> None:
    ns = namespace(
        "import torch\n\n"
        "def softmax(x, dim=-1):\n"
        "    x = x.double()\n"
        "    e = torch.exp(x - x.amax(dim, keepdim=True))\n"
        "    return e / e.sum(dim, keepdim=True)\n"
    )
    assert incheck.run_test("softmax", "softmax_values", ns) is None  # float64 in
    text = " ".join(message_of("softmax", "softmax_dtypes", ns).split())
    assert "has dtype float64; expected float32" in text


def test_system_exit_is_not_swallowed() -> None:
    # The sandboxed grader isolates a process; in-process checks let it through.
    ns = namespace("import sys\n\ndef softmax(x, dim=-1):\n    sys.exit(3)\n")
    with pytest.raises(SystemExit):
        incheck.run_test("softmax", "softmax_values", ns)


def test_check_notebook_prints_the_visible_tests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    incheck.check_notebook("attention", reference("attention"))
    out = capsys.readouterr().out
    assert "masked_softmax_values" in out and "failed" not in out
    assert "visible tests: 11 / 11 points" in out
    assert "hidden tests: 10 more, 13 points, run when you submit" in out
    assert "sdpa_gradient" not in out  # hidden tests are not named

    stub = namespace(get_assignment("attention").stub_source())
    incheck.check_notebook("attention", stub)
    out = capsys.readouterr().out
    assert "visible tests: 0 / 11 points" in out
    assert out.count("failed") == 6
    assert max(len(line) for line in out.splitlines()) <= incheck.WIDTH


def test_check_notebook_never_raises(capsys: pytest.CaptureFixture[str]) -> None:
    incheck.check_notebook("nope", {})
    assert "unknown assignment id 'nope'" in capsys.readouterr().out
    incheck.check_notebook("sparse-maps", {"sparsemax": None, "entmax15": 1})
    out = capsys.readouterr().out
    assert "sparsemax is not defined" in out and "entmax15 is a int" in out
