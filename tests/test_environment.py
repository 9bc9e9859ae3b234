"""convt3d.environment: the settings read from environment variables, and the modules that read them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convt3d import environment

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("On", True), ("YES", True), (" 1 ", True),
    ("0", False), ("false", False), ("OFF", False), ("no", False),
])
def test_switch_takes_on_and_off_in_any_case(monkeypatch, value, expected):
    monkeypatch.setenv("CONVT3D_TEST_SWITCH", value)
    assert environment.switch("CONVT3D_TEST_SWITCH", not expected) is expected


@pytest.mark.parametrize("default", [True, False])
def test_switch_unset_or_empty_keeps_its_default(monkeypatch, default):
    monkeypatch.delenv("CONVT3D_TEST_SWITCH", raising=False)
    assert environment.switch("CONVT3D_TEST_SWITCH", default) is default
    monkeypatch.setenv("CONVT3D_TEST_SWITCH", "")
    assert environment.switch("CONVT3D_TEST_SWITCH", default) is default


@pytest.mark.parametrize("value", ["flase", "2", "-1", "enabled"])
def test_switch_refuses_other_values_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("CONVT3D_TEST_SWITCH", value)
    with pytest.raises(ValueError, match=f"CONVT3D_TEST_SWITCH={value!r}"):
        environment.switch("CONVT3D_TEST_SWITCH", True)


def test_choice_maps_values_and_refuses_others(monkeypatch):
    choices = {"1": "3xTF32", "2": "3xFP16"}
    monkeypatch.delenv("CONVT3D_TEST_CHOICE", raising=False)
    assert environment.choice("CONVT3D_TEST_CHOICE", choices, "2") == "3xFP16"
    monkeypatch.setenv("CONVT3D_TEST_CHOICE", "1")
    assert environment.choice("CONVT3D_TEST_CHOICE", choices, "2") == "3xTF32"
    monkeypatch.setenv("CONVT3D_TEST_CHOICE", "3")
    with pytest.raises(ValueError, match="CONVT3D_TEST_CHOICE='3': expected one of 1, 2"):
        environment.choice("CONVT3D_TEST_CHOICE", choices, "2")


def _import_settings(**variables):
    """The settings that the backends read at import, in a fresh process with these environment variables."""
    code = ("from convt3d.backends import cuda; from convt3d.backends.triton import launch, tensor_scaled, tiled; "
            "print(cuda.ENABLED, cuda.SPLIT, cuda.TF32_SPLIT, cuda.ROW_RUNS, cuda.DIRECT_INPUT, cuda.REGION_FILL, "
            "launch.DRIVER_LAUNCH, tensor_scaled.TF32_AS_FP16, tiled.TF32_AS_FP16, cuda.DEPENDENT, "
            "cuda.row_runs.PLANE_MAXIMA)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVT3D_")}
    env.update(variables, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_backends_read_their_settings_through_environment():
    result = _import_settings()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "2", "3", "True", "True", "None", "True", "True", "True", "True", "True"]
    # Each turned off in another spelling than "0", which before this module only "0" turned off (REGION_FILL, None
    # by default, turned on).
    result = _import_settings(CONVT3D_CUDA_KERNELS="off", CONVT3D_SPLIT="1", CONVT3D_TF32_AS_FP16="false",
                              CONVT3D_ROW_RUNS="no", CONVT3D_DIRECT_INPUT="False", CONVT3D_REGION_FILL="Yes",
                              CONVT3D_DRIVER_LAUNCH="OFF", CONVT3D_CUDA_DEPENDENT="Off", CONVT3D_PLANE_MAXIMA="No")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "1", "0", "False", "False", "True", "False", "False", "False", "False",
                                     "False"]
    # REGION_FILL, on with TF32 off by default (None), off in both modes.
    result = _import_settings(CONVT3D_REGION_FILL="off")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[5] == "False"


def test_a_misspelt_setting_fails_at_import_naming_the_variable():
    result = _import_settings(CONVT3D_ROW_RUNS="flase")
    assert result.returncode != 0
    assert "CONVT3D_ROW_RUNS='flase'" in result.stderr
