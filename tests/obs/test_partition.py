"""The distributed layout's choice of holders (enkflow.obs.partition): a window holds every observation the
local search of its domains could look at, whatever the metric."""

import numpy as np
import pytest

from enkflow.analysis.geometry import Geometry, embed, search_reach_chord
from enkflow.config import Metric
from enkflow.obs.partition import DomainWindows, box_of, owners, windows_of_equal_cost
from enkflow.parallel import SerialComm


def _windows(metric, period, domain_sets):
    boxes = [(w, *box_of(metric, d)) for w, d in enumerate(domain_sets)]
    return DomainWindows.gather(SerialComm(), metric, period, boxes)


@pytest.mark.parametrize("metric,period", [(Metric.SPHERE, None), (Metric.CARTESIAN, None), (Metric.PERIODIC, 40.0)])
def test_a_window_holds_every_observation_within_the_search_reach_of_its_domains(metric, period):
    rng = np.random.default_rng(5)
    if metric is Metric.SPHERE:
        doms = np.column_stack([rng.uniform(0, 60, 50), rng.uniform(50, 89, 50)])
        obs = np.column_stack([rng.uniform(0, 360, 4000), rng.uniform(-90, 90, 4000)])
        radius = 500.0
    elif metric is Metric.CARTESIAN:
        doms, obs, radius = rng.uniform(0, 10, (50, 2)), rng.uniform(-5, 15, (4000, 2)), 1.5
    else:
        doms, obs, radius = rng.uniform(35, 39.5, (20, 1)), rng.uniform(0, 40, (4000, 1)), 2.0
    windows = _windows(metric, period, [doms])
    ranks, held = windows.holders(obs, radius, 0)
    assert (ranks == 0).all()
    # Every observation within the reach of some domain is held (the box only adds more).
    geo = Geometry(metric, doms, period)
    reach = search_reach_chord(metric, radius)
    d = geo._tree.query(embed(metric, obs), k=1)[0]
    need = np.flatnonzero(d <= reach)
    assert need.size and np.isin(need, held).all()
    assert held.size < obs.shape[0]  # and it is a choice: far observations stay away


def test_windows_are_whole_chunks_of_equal_cost_and_owners_follow_the_first_row():
    chunks = [(0, 4), (4, 8), (8, 12), (12, 13)]
    assert windows_of_equal_cost(np.array([1.0, 1.0, 1.0, 1.0]), chunks, 2) == [(0, 8), (8, 13)]
    assert windows_of_equal_cost(np.array([6.0, 1.0, 1.0, 1.0]), chunks, 2) == [(0, 4), (4, 13)]
    assert windows_of_equal_cost(np.zeros(0), [], 2) == [(0, 0), (0, 0)]
    np.testing.assert_array_equal(owners(np.array([0, 4, 5, 9]), np.array([0, 5, 5, 10])), [0, 0, 2, 2])


def test_rounds_and_windows_of_several_ranks():
    rng = np.random.default_rng(1)
    boxes = [(k, np.zeros(2), np.ones(2)) for k in range(3)]
    w = DomainWindows.gather(SerialComm(), Metric.CARTESIAN, None, boxes)
    ranks, held = w.holders(rng.uniform(0, 1, (5, 2)), 0.1, 2)
    np.testing.assert_array_equal(held, np.arange(5))
