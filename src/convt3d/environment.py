"""convt3d's settings from environment variables, read once where each module is imported.

A switch (CONVT3D_CUDA_KERNELS=0, say) takes 1, true, on or yes for on and 0, false, off or no for off, in any case;
unset or empty leaves the default. Anything else is an error that names the variable: a misspelt "flase" must not
leave a kernel on that the user meant to turn off.
"""

from __future__ import annotations

import os

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def switch(name: str, default: bool) -> bool:
    """The switch name from the environment, or default where it is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if value.lower() in _ON:
        return True
    if value.lower() in _OFF:
        return False
    raise ValueError(f"environment variable {name}={value!r}: expected one of {', '.join(_ON + _OFF)}")


def choice(name: str, choices: dict, default: str):
    """choices[value] for the environment variable name's value (choices[default] where it is unset or empty)."""
    value = os.environ.get(name, "").strip() or default
    if value not in choices:
        raise ValueError(f"environment variable {name}={value!r}: expected one of {', '.join(choices)}")
    return choices[value]
