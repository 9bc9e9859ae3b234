"""Importing convt3d must not touch CUDA or import Triton."""

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def test_import_touches_no_cuda_and_no_triton():
    code = ("import sys, torch, convt3d; "
            "assert 'triton' not in sys.modules, 'triton imported'; "
            "assert not torch.cuda.is_initialized(), 'CUDA initialised'; "
            "assert hasattr(torch.ops.convt3d, 'conv_transpose3d')")
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
