"""Generative models."""
from .model import Model
from .nufft import match_vma, nufft2d_type1, nufft2d_type2
from .responses import Mask, NUFFTResponse, Sampling

__all__ = ["Model"]
__all__ += ["Mask", "Sampling", "NUFFTResponse", "match_vma", "nufft2d_type1", "nufft2d_type2"]
