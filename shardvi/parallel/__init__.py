"""Mapping samples over devices."""
from .strategy import (STRATEGY_NAMES, LaxMap, Strategy, Vmap, fixed_order_mean, get_strategy,
                       register_strategy)

__all__ = ["STRATEGY_NAMES", "LaxMap", "Strategy", "Vmap", "fixed_order_mean", "get_strategy",
           "register_strategy"]
