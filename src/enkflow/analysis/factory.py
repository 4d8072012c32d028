"""The filter object for an ``[analysis]`` configuration section."""

from __future__ import annotations

from enkflow.analysis.adaptive_inflation import from_config as adaptive_from_config
from enkflow.analysis.enkf_n import EnKFN
from enkflow.analysis.global_filters import DEnKF, EnKF, ESTKF, ETKF, Filter
from enkflow.analysis.inflation import Inflation
from enkflow.analysis.lnetf import LNETF
from enkflow.analysis.local_filters import LESTKF, LETKF, Kernel
from enkflow.analysis.localization import Localization
from enkflow.analysis.serial_filter import EnSRF
from enkflow.config import AnalysisConfig, EnKFNConfig, LNETFConfig, Method


def make_filter(cfg: AnalysisConfig) -> Filter:
    """Build the filter ``cfg`` describes (validated already by the schema)."""
    i = cfg.inflation
    infl = Inflation(prior=i.prior, posterior=i.posterior, rtpp=i.rtpp, rtps=i.rtps)
    match cfg.method:
        case Method.LETKF | Method.LESTKF:
            cls = LETKF if cfg.method is Method.LETKF else LESTKF
            return cls(inflation=infl, localization=Localization.from_config(cfg.localization), kernel=Kernel(cfg.kernel),
                       adaptive=adaptive_from_config(i))
        case Method.LNETF:
            opts = cfg.lnetf or LNETFConfig()
            return LNETF(inflation=infl, localization=Localization.from_config(cfg.localization), rs=opts.rs,
                         rotate=opts.rotate, seed=cfg.seed, adaptive=adaptive_from_config(i))
        case Method.ENSRF:
            return EnSRF(inflation=infl, localization=Localization.from_config(cfg.localization),
                         adaptive=adaptive_from_config(i))
        case Method.ENKF:
            return EnKF(inflation=infl, seed=cfg.seed)
        case Method.DENKF:
            return DEnKF(inflation=infl)
        case Method.ESTKF:
            return ESTKF(inflation=infl)
        case Method.ENKF_N:
            o = cfg.enkf_n or EnKFNConfig()
            return EnKFN(inflation=infl, xn=o.xn, g=o.g, rotate=o.rotate, seed=cfg.seed)
    return ETKF(inflation=infl)
