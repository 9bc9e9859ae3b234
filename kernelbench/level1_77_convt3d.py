"""KernelBench level 1, problem 77, in KernelBench's file format, with ModelNew computed by convt3d.

Model is KernelBench's reference (nn.ConvTranspose3d: 3D transposed convolution, square input and kernel,
padded, dilated, strided). ModelNew takes the same init inputs and, built after the same torch.manual_seed,
holds the same weights; its layer is convt3d's.
"""

import torch
import torch.nn as nn

import convt3d


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 dilation: int = 1, bias: bool = False):
        super().__init__()
        self.conv_transpose3d = nn.ConvTranspose3d(
            in_channels, out_channels, kernel_size=(kernel_size, kernel_size, kernel_size), stride=stride,
            padding=padding, dilation=dilation, bias=bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_transpose3d(x)


class ModelNew(Model):
    """Model, with its layer computed by convt3d (same parameters: convert shares them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conv_transpose3d = convt3d.convert(self.conv_transpose3d)


batch_size = 16
in_channels = 32
out_channels = 64
kernel_size = 3
depth = 16
height = 32
width = 32
stride = 2
padding = 1
dilation = 2


def get_inputs():
    x = torch.rand(batch_size, in_channels, depth, height, width)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, dilation]
