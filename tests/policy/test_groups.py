"""shared_rows: which rows run once for their group, from the env's group ids."""

from __future__ import annotations

import pytest
import torch

from lmgym.policy.groups import shared_rows

# Rows 0 and 2 (group 7) differ only under padding; rows 1 and 3 (group 3) are equal.
IDS = torch.tensor([[0, 5, 6], [1, 5, 6], [9, 5, 6], [1, 5, 6], [2, 7, 8]])
MASK = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)


def test_shared_rows_maps_each_row_to_its_groups_first_row():
    first, inverse = shared_rows(torch.tensor([7, 3, 7, 3, 9]), IDS, MASK)
    # Groups in label order 3, 7, 9; their first rows 1, 0, 4.
    assert first.tolist() == [1, 0, 4]
    assert inverse.tolist() == [1, 0, 1, 0, 2]


def test_no_sharing_without_ids_or_without_a_group_of_two():
    assert shared_rows(None, IDS, MASK) is None
    assert shared_rows(torch.arange(5), IDS, MASK) is None


def test_equal_text_in_two_groups_is_not_shared():
    # Two draws of one prompt are two groups: text alone never makes a group.
    assert shared_rows(torch.tensor([4, 5]), IDS[[1, 3]], MASK[[1, 3]]) is None


def test_rows_of_one_group_with_different_text_are_refused():
    with pytest.raises(ValueError, match=r"group_ids: rows 1 and 4 share group id 3 but not"):
        shared_rows(torch.tensor([7, 3, 7, 0, 3]), IDS, MASK)
    # The mask counts too: the same ids with another column padded differ.
    with pytest.raises(ValueError, match=r"group_ids: rows 0 and 1 share group id 0"):
        shared_rows(torch.tensor([0, 0]), IDS[[1, 1]], MASK[[1, 0]])


def test_group_ids_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"group_ids: expected shape \(5,\), one id per row"):
        shared_rows(torch.tensor([0, 0, 1]), IDS, MASK)
