"""convt3d: PyTorch's ConvTranspose3d, computed by phase decomposition and fused Triton kernels.

Importing convt3d never touches CUDA or imports Triton.
"""

from .functional import conv_transpose3d
from .module import ConvTranspose3d, convert
from .plan import Plan, make_plan

__all__ = ["conv_transpose3d", "ConvTranspose3d", "convert", "Plan", "make_plan"]
__version__ = "0.1.0"
