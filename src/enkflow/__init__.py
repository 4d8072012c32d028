"""enkflow: ensemble data assimilation with short time-to-solution."""

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    # Computed on first use: importlib.metadata costs ~50 ms at import, paid by every pilot
    # worker and member process that only needs a submodule.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("enkflow")
        except PackageNotFoundError:  # running from a source tree without install
            v = "0.0.0+unknown"
        globals()["__version__"] = v
        return v
    raise AttributeError(f"module 'enkflow' has no attribute {name!r}")
