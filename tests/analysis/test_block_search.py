"""The blocked local search (analysis.search): exactly the pairs within the radius, in CSR order,
whatever the domain order, block boundaries or parts; against brute force in each metric."""

import numpy as np
import pytest
from scipy.spatial import cKDTree

from enkflow.analysis.geometry import Geometry, lonlat_to_xyz
from enkflow.analysis.search import BLOCK_MAX, BlockedPairs
from enkflow.config import Metric


def _brute(metric, obs, dom, radius, period=None):
    """(domain, observation) -> distance for every pair closer than radius, by direct computation."""
    if metric is Metric.SPHERE:
        a, b = lonlat_to_xyz(dom), lonlat_to_xyz(obs)
        chord = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2))
        d = 2.0 * 6371.0 * np.arcsin(np.minimum(0.5 * chord, 1.0))
    else:
        diff = np.abs(dom[:, None, :] - obs[None, :, :])
        if period:
            diff = np.minimum(diff, period - diff)
        d = np.sqrt((diff ** 2).sum(axis=2))
    return d


def _problem(metric, rng, n_obs=4000, n_dom=1500):
    if metric is Metric.SPHERE:
        # Crowded near the pole on purpose: a lon-lat grid's polar rows, plus scattered observations.
        lon, lat = np.meshgrid(np.arange(-180, 180, 2.0), np.arange(-89, -70, 1.0))
        dom = np.column_stack([lon.ravel(), lat.ravel()])[:n_dom]
        obs = np.column_stack([rng.uniform(-180, 180, n_obs), rng.uniform(-90, -60, n_obs)])
        return obs, dom, 500.0, None
    if metric is Metric.PERIODIC:
        return rng.uniform(0, 40, (n_obs, 1)), rng.uniform(0, 40, (n_dom, 1)), 3.3, 40.0
    return rng.uniform(0, 100, (n_obs, 3)), rng.uniform(0, 100, (n_dom, 3)), 9.0, None


@pytest.mark.parametrize("metric", list(Metric))
@pytest.mark.parametrize("order", ["grid", "shuffled"])
def test_the_search_finds_exactly_the_pairs_within_the_radius(metric, order):
    rng = np.random.default_rng(7)
    obs, dom, radius, period = _problem(metric, rng)
    if order == "shuffled":
        dom = dom[rng.permutation(dom.shape[0])]  # neighbours no longer consecutive: many small blocks
    g = Geometry(metric, obs, period)
    nb = g.neighbours(dom, radius)
    d = _brute(metric, obs, dom, radius, period)
    assert nb.idx.size > 10 * dom.shape[0]
    for k in range(dom.shape[0]):
        got = nb.idx[nb.offsets[k]:nb.offsets[k + 1]]
        expect = np.flatnonzero(d[k] < radius)
        # Pairs within a rounding error of the radius may fall either way; none other may differ.
        edge = np.flatnonzero(np.abs(d[k] - radius) < 1e-9 * radius)
        assert set(got) ^ set(expect) <= set(edge), k
        assert np.all(np.diff(got) > 0)
        np.testing.assert_allclose(nb.dist[nb.offsets[k]:nb.offsets[k + 1]], d[k, got], rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("metric", list(Metric))
def test_parts_and_ranges_give_the_same_pairs_as_one_search_bit_for_bit(metric):
    rng = np.random.default_rng(3)
    obs, dom, radius, period = _problem(metric, rng)
    g = Geometry(metric, obs, period)
    full = g.neighbours(dom, radius)
    s = g.search(dom, radius)
    parts = list(s.parts(5_000))
    assert len(parts) > 3 and parts[0][0] == 0 and parts[-1][1] == dom.shape[0]
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    idx = np.concatenate([s.neighbours(a, b).idx for a, b in parts])
    dist = np.concatenate([s.neighbours(a, b).dist for a, b in parts])
    assert np.array_equal(idx, full.idx) and np.array_equal(dist, full.dist)
    # Another rank's range (other blocks, other candidates): the same pairs and distances.
    lo, hi = 317, 1111
    sub = g.neighbours(dom[lo:hi], radius)
    assert np.array_equal(sub.idx, full.idx[full.offsets[lo]:full.offsets[hi]])
    assert np.array_equal(sub.dist, full.dist[full.offsets[lo]:full.offsets[hi]])
    inside = [a + 1 for a, b in zip(s.plan.starts[:-1], s.plan.starts[1:]) if b - a > 1]
    for start, stop in [(0, dom.shape[0] + 1), (-1, 5)] + [(i, dom.shape[0]) for i in inside[:1]]:
        with pytest.raises(ValueError, match="block boundaries"):
            s.neighbours(start, stop)


def test_blocks_are_compact_and_bounded():
    pts = lonlat_to_xyz(np.column_stack([np.arange(-180, 180, 0.1), np.full(3600, -89.95)]))
    obs = lonlat_to_xyz(np.array([[0.0, -90.0]]))
    plan = BlockedPairs.plan(pts, obs, cKDTree(obs), 0.0, 0.02)
    sizes = np.diff(plan.starts)
    assert sizes.max() == BLOCK_MAX and sizes.sum() == 3600  # a polar row is one spot: full blocks
    assert plan.bounds().sum() == 3600  # the single observation is every block's candidate
    empty = BlockedPairs.plan(np.zeros((0, 3)), obs, cKDTree(obs), 0.0, 0.02)
    assert empty.n_blocks == 0 and list(empty.parts(10)) == [] and empty.pairs()[1].size == 0
