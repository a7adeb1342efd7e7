"""Tests of softmaxbook._checks: the argument checks and the empty-row guard every
module shares."""

from __future__ import annotations

import pytest
import torch

from softmaxbook._checks import check_mask


def test_check_mask_device_mismatch():
    scores = torch.empty(2, 3, device="meta")
    with pytest.raises(ValueError, match="mask is on cpu but the scores are on meta"):
        check_mask(torch.ones(3, dtype=torch.bool), scores)


def test_check_mask_returns_expanded_view():
    mask = torch.tensor([True, False, True])
    out = check_mask(mask, torch.zeros(2, 3))
    assert out.shape == (2, 3) and out.data_ptr() == mask.data_ptr()
