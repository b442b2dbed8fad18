"""pycudnn's own version, written once: ``pycudnn.__version__``, the package metadata (pyproject.toml
reads it) and the tuning database's records read it from here."""

__version__ = "0.1.0"
