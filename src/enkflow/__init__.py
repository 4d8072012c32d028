"""enkflow: ensemble data assimilation with short time-to-solution."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("enkflow")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
