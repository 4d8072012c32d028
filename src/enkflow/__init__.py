"""enkflow: ensemble data assimilation with short time-to-solution."""

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # Computed on first use (`enkflow --version`), not by every process that imports enkflow.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version  # lazy: 35 ms in every worker/member

        try:
            v = version("enkflow")
        except PackageNotFoundError:  # running from a source tree without install
            v = "0.0.0+unknown"
        globals()["__version__"] = v
        return v
    raise AttributeError(f"module 'enkflow' has no attribute {name!r}")
