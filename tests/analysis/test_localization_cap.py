"""The optional cap on local observations (``localization.max_obs``): the k nearest per domain."""

import numpy as np
import pytest

from enkflow.analysis.geometry import Geometry
from enkflow.analysis.localization import Localization
from enkflow.config import Metric
from enkflow.errors import InputError


@pytest.mark.parametrize("metric", [Metric.CARTESIAN, Metric.SPHERE])
def test_the_cap_keeps_the_nearest_observations_in_ascending_order(metric):
    rng = np.random.default_rng(1)
    if metric is Metric.SPHERE:
        obs = np.column_stack([rng.uniform(-180, 180, 3000), rng.uniform(-90, 90, 3000)])
        dom = np.column_stack([rng.uniform(-180, 180, 40), rng.uniform(-90, 90, 40)])
        hw = 800.0
    else:
        obs, dom, hw = rng.uniform(0, 100, (800, 2)), rng.uniform(0, 100, (40, 2)), 10.0
    g = Geometry(metric, obs)
    o, i, w = Localization(half_width=hw, metric=metric).local_obs(g, dom)
    oc, ic, wc = Localization(half_width=hw, metric=metric, max_obs=15).local_obs(g, dom)
    assert np.diff(o).max() > 15 >= np.diff(oc).max()
    for k in range(dom.shape[0]):
        a, wa = i[o[k]:o[k + 1]], w[o[k]:o[k + 1]]
        b, wb = ic[oc[k]:oc[k + 1]], wc[oc[k]:oc[k + 1]]
        assert np.all(np.diff(b) > 0)
        assert set(b) == set(a[np.argsort(-wa, kind="stable")[:15]])  # the nearest: the largest weights
        assert np.allclose(wb, wa[np.isin(a, b)], rtol=1e-12, atol=0)  # another search, the same distances


def test_a_cap_above_every_count_changes_nothing_and_a_bad_cap_is_refused():
    rng = np.random.default_rng(2)
    g = Geometry(Metric.CARTESIAN, rng.uniform(0, 50, (300, 2)))
    dom = rng.uniform(0, 50, (30, 2))
    full = Localization(half_width=5.0).local_obs(g, dom)
    capped = Localization(half_width=5.0, max_obs=10_000).local_obs(g, dom)
    for a, b in zip(full, capped):
        assert np.array_equal(a, b)
    with pytest.raises(InputError, match="max_obs"):
        Localization(half_width=5.0, max_obs=0)


def test_ties_at_the_kth_place_go_to_the_lower_observation_index():
    # Observations stacked at the same points: many ties at every distance.
    base = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [3.0, 0.5]])
    obs = np.repeat(base, 5, axis=0)
    g = Geometry(Metric.CARTESIAN, obs)
    dom = np.array([[0.0, 0.0], [2.5, 1.0]])
    o, i, w = Localization(half_width=5.0, max_obs=7).local_obs(g, dom)
    d = np.linalg.norm(obs[None, :, :] - dom[:, None, :], axis=2)
    for k in range(2):
        expect = np.lexsort((np.arange(obs.shape[0]), d[k]))[:7]
        assert np.array_equal(i[o[k]:o[k + 1]], np.sort(expect))
