"""The test session's JAX persistent compilation cache (see tests/conftest.py); not a test module."""

import os


def use_session_cache() -> None:
    """Compile into and from ``$SHARDVI_TEST_JAX_CACHE_DIR`` (every program, however small), unless
    ``SHARDVI_TEST_JAX_CACHE=0`` or no directory is set; before the first compilation."""
    cache = os.environ.get("SHARDVI_TEST_JAX_CACHE_DIR")
    if cache and os.environ.get("SHARDVI_TEST_JAX_CACHE", "1") != "0":
        import jax

        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
