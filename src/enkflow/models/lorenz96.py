"""Lorenz-96 (Lorenz 1996; Lorenz & Emanuel 1998): 40 variables, F = 8.

dx_i/dt = (x_{i+1} - x_{i-2}) x_{i-1} - x_i + F, periodic in i,
integrated with classical RK4. States are (n_vars, N) arrays, one column per
member, so the whole ensemble advances in one vectorized call.
"""

from __future__ import annotations

import numpy as np

N_VARS = 40
FORCING = 8.0
DT = 0.05  # model time units per step (= 6 h in Lorenz's scaling)


def tendency(x: np.ndarray, forcing: float = FORCING) -> np.ndarray:
    """dx/dt for ``x`` (n_vars,) or (n_vars, N)."""
    return (np.roll(x, -1, axis=0) - np.roll(x, 2, axis=0)) * np.roll(x, 1, axis=0) - x + forcing


def step(x: np.ndarray, dt: float = DT, forcing: float = FORCING) -> np.ndarray:
    """One RK4 step of length ``dt``; returns a new array of the same shape."""
    k1 = tendency(x, forcing)
    k2 = tendency(x + 0.5 * dt * k1, forcing)
    k3 = tendency(x + 0.5 * dt * k2, forcing)
    k4 = tendency(x + dt * k3, forcing)
    return x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def spin_up(rng: np.random.Generator, n_steps: int = 2000, n_vars: int = N_VARS) -> np.ndarray:
    """A state on the attractor: F plus small noise, integrated ``n_steps``."""
    x = FORCING + rng.normal(0.0, 0.01, n_vars)
    for _ in range(n_steps):
        x = step(x)
    return x
