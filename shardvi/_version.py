"""The version of shardvi: the single source (``pyproject.toml`` reads it, ``shardvi.__version__`` re-exports it)."""

__version__ = "0.1.0"
