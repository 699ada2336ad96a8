"""providers/host_ram.py: the one reading of a host's RAM against measured points, which the agent's valuation
and the simulated market both use."""

import pytest

from vastctl.agent import valuation
from vastctl.providers import sim_market
from vastctl.providers.host_ram import rate_allowed

POINTS = ((128, 24.0), (256, 68.0), (512, 95.0))


@pytest.mark.parametrize("ram, rate", [(0, 0.0), (1, 0.1875), (64, 12.0), (128, 24.0), (192, 46.0), (256, 68.0),
                                       (384, 81.5), (512, 95.0), (4096, 95.0)])
def test_a_rate_is_in_proportion_below_the_first_point_linear_between_points_and_flat_past_the_last(ram, rate):
    assert rate_allowed(POINTS, ram) == pytest.approx(rate)


def test_one_point_alone_is_in_proportion_up_to_it_and_flat_past_it():
    assert rate_allowed(((100, 50.0),), 40) == pytest.approx(20.0)
    assert rate_allowed(((100, 50.0),), 400) == pytest.approx(50.0)


@pytest.mark.parametrize("ram", [0.5, 128, 200, 300, 448, 600])
def test_the_valuation_and_the_simulated_market_read_their_own_points_the_same_way(ram):
    assert valuation.ram_rate(ram) == pytest.approx(rate_allowed(valuation.RAM_RATES, ram))
    assert sim_market.model_rate("H100 SXM", ram) == pytest.approx(min(100.0, rate_allowed(sim_market.RAM_CAP, ram)))
