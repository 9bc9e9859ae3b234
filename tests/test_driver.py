"""Launches through the CUDA driver (backends/driver.py), read back as cuLaunchKernelEx reads them from a fake driver:
there is no GPU here. The GPU tests run the real one (every CUDA kernel of our own launches this way)."""

import ctypes

import pytest

from convt3d.backends import driver


# The arguments of the launches below: two pointers, then an int and a long long.
ARGUMENTS = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64)


class FakeDriver:
    """Records what cuLaunchKernelEx would read, as it reads it during the call: the configuration, its attributes,
    and the arguments as kinds (ctypes types, one per argument; an array type for one passed by value) say."""

    def __init__(self, kinds=ARGUMENTS, result=0):
        self.kinds, self.result, self.launches = kinds, result, []

    def cuLaunchKernelEx(self, config, function, array, extra):
        config = config._obj  # (byref's structure)
        attributes = [(config.attributes[i].id, config.attributes[i].value) for i in range(config.attribute_count)]
        slots = ctypes.cast(array, ctypes.POINTER(ctypes.c_void_p))
        values = [ctypes.cast(slots[i], ctypes.POINTER(kind))[0] for i, kind in enumerate(self.kinds)]
        self.launches.append(dict(
            grid=(config.grid_x, config.grid_y, config.grid_z), block=(config.block_x, config.block_y, config.block_z),
            shared=config.shared_bytes, stream=config.stream, attributes=attributes, function=function.value,
            arguments=tuple(tuple(v) if isinstance(v, ctypes.Array) else v for v in values)))
        return self.result

    def cuGetErrorString(self, result, message):
        message._obj.value = b"invalid argument"
        return 0


@pytest.mark.parametrize("dependent, cooperative", [(False, False), (True, False), (False, True), (True, True)])
def test_a_launch_writes_its_pointers_and_stream_and_keeps_the_rest(monkeypatch, dependent, cooperative):
    fake = FakeDriver()
    monkeypatch.setattr(driver, "libcuda", lambda: fake)
    launch = driver.Launch(77, (5, 3), 256, 4096, 2, [ctypes.c_int32(-7), ctypes.c_int64(2**40)],
                           dependent=dependent, cooperative=cooperative)
    launch(11, 2**40 + 16, 32)
    launch(12, 48, 2**41)
    attributes = [(driver.COOPERATIVE, 1)] * cooperative + [(driver.PROGRAMMATIC_STREAM_SERIALIZATION, 1)] * dependent
    common = dict(grid=(5, 3, 1), block=(256, 1, 1), shared=4096, attributes=attributes, function=77)
    assert fake.launches == [dict(common, stream=11, arguments=(2**40 + 16, 32, -7, 2**40)),
                             dict(common, stream=12, arguments=(48, 2**41, -7, 2**40))]


def test_a_function_handle_may_come_as_a_ctypes_pointer(monkeypatch):
    """(torch.cuda._compile_kernel's kernels hold theirs as ctypes.c_void_p, Triton's as an int.)"""
    fake = FakeDriver()
    monkeypatch.setattr(driver, "libcuda", lambda: fake)
    driver.Launch(ctypes.c_void_p(78), (1,), 32, 0, 2, [ctypes.c_int32(0), ctypes.c_int64(0)])(0, 0, 0)
    assert fake.launches[0]["function"] == 78


def test_a_failed_launch_raises_with_the_drivers_message(monkeypatch):
    monkeypatch.setattr(driver, "libcuda", lambda: FakeDriver(result=1))
    launch = driver.Launch(77, (1,), 32, 0, 2, [ctypes.c_int32(0), ctypes.c_int64(0)])
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx failed: invalid argument"):
        launch(0, 0, 0)
