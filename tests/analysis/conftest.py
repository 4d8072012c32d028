"""Fixtures of the analysis tests."""

import pytest

from analysis_problems import grid_problem


@pytest.fixture
def problem():
    return grid_problem()
