"""Importing convt3d must not touch CUDA or import Triton."""

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def test_import_and_cpu_calls_touch_no_cuda_and_no_triton():
    # CPU calls too: the device checks on the way (ops._off_current_device) must not ask CUDA about CPU tensors.
    code = ("import sys, torch, convt3d; "
            "assert 'triton' not in sys.modules, 'triton imported'; "
            "assert not torch.cuda.is_initialized(), 'CUDA initialised'; "
            "assert hasattr(torch.ops.convt3d, 'conv_transpose3d'); "
            "layer = convt3d.ConvTranspose3d(2, 3, 3, stride=2, padding=1, dilation=2); "
            "layer(torch.rand(1, 2, 3, 4, 3, requires_grad=True)).sum().backward(); "
            "assert 'triton' not in sys.modules, 'triton imported by a CPU call'; "
            "assert not torch.cuda.is_initialized(), 'CUDA initialised by a CPU call'")
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
