"""The largest model in a memory budget (``benchmarks/memory.py --largest``): the search over a ladder's measured
step peaks, on a planted ladder, and the step's tensor-level high-water mark it reads, against a hand count."""

from __future__ import annotations

import pytest
import torch

from lab.ablation.memory_budget import BudgetNotMet, largest_fitting
from lab.measure.memory import allocation_high_water

# A planted ladder (MiB per rung, smallest model first): the stack lowers every rung's peak.
PLAIN = {"xs": 1.4, "s": 10.6, "m": 60.0, "l": 180.0, "xl": 340.0}
STACK = {"xs": 1.4, "s": 6.3, "m": 22.0, "l": 70.0, "xl": 130.0}


@pytest.mark.parametrize(("budget", "plain", "stack"), [
    (59.4, "s", "m"),     # m stops fitting plainly; the stack fits it
    (60.0, "m", "m"),     # a peak equal to the budget fits
    (150.0, "m", "xl"),
    (1000.0, "xl", "xl"),
])
def test_largest_rung_each_way(budget: float, plain: str, stack: str) -> None:
    assert largest_fitting(PLAIN, budget) == plain
    assert largest_fitting(STACK, budget) == stack


def test_largest_is_the_last_rung_that_fits_not_the_largest_peak() -> None:
    # a dip at a larger rung still names the larger model; a NaN (a rung that failed) never fits
    assert largest_fitting({"s": 5.0, "m": 9.0, "l": 8.0, "xl": float("nan")}, 8.5) == "l"


def test_nothing_fits_is_one_line_naming_the_smallest_peak() -> None:
    with pytest.raises(BudgetNotMet) as err:
        largest_fitting(STACK, 1.0)
    text = str(err.value)
    assert "\n" not in text and "1.4" in text and "xs" in text
    with pytest.raises(BudgetNotMet, match="no rung was measured"):
        largest_fitting({}, 10.0)


def test_high_water_counts_what_is_alive_at_once() -> None:
    def step() -> torch.Tensor:
        a = torch.empty(1000)          # 4,000 bytes
        b = torch.empty(500)           # + 2,000 alive together: the high-water mark
        del a, b
        return torch.empty(250)        # 1,000 after both are freed: below it

    out, high = allocation_high_water(step)
    assert out.numel() == 250
    assert high == 6000
