"""The launcher that reuses a Triton kernel's compiled form (backends/triton/launch.py), with a stand-in kernel:
on the CPU no compiled kernel exists (the interpreter runs kernels as Python); the GPU tests of the backward run
the real one."""

import ctypes
import os

import pytest
import torch

from convt3d.backends.triton.launch import Launcher


class FakeKernel:
    """Records launches as Triton's JIT function would take them; each returns a new compiled stand-in."""

    __name__ = "fake_kernel"
    arg_names = ["x_ptr", "n", "stride", "BLOCK", "ROUND"]

    def __init__(self, compiled_class=None):
        self.jit_launches, self.compiled_launches, self.direct_launches = [], [], []
        self.compiled_class = compiled_class or FakeCompiled

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            return self.compiled_class(self, len(self.jit_launches))
        return launch


class FakeCompiled:
    def __init__(self, kernel, number):
        self.kernel, self.number = kernel, number

    def __getitem__(self, grid):
        def run(*args, stream):
            self.kernel.compiled_launches.append((self.number, grid, args, stream))
        return run


class DirectCompiled(FakeCompiled):
    """With the launcher object that Triton 3.x's runner calls, as compiled.run(grid x, y, z, stream, function,
    packed metadata, launch metadata, enter hook, exit hook, *arguments)."""

    function, packed_metadata = "function", "packed metadata"

    @property
    def run(self):
        def run(*args):
            self.kernel.direct_launches.append((self.number, args))
        return run


OPTIONS = (("BLOCK", 64), ("ROUND", True), ("num_warps", 4))


@pytest.fixture
def compiled_mode(monkeypatch):
    from convt3d.backends.triton import launch as launch_module

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(launch_module, "_current_device", lambda: 0)
    monkeypatch.setattr(launch_module, "_current_stream", lambda device: 1000 + device)


def test_the_same_arguments_reuse_the_compiled_kernel(compiled_mode):
    kernel = FakeKernel()
    launch = Launcher(kernel)
    x, y = torch.empty(64), torch.empty(64)
    launch.launch((7, 2), (x,), (100, 5), OPTIONS)
    launch.launch((7, 2), (y,), (100, 5), OPTIONS)  # another aligned float32 tensor
    assert kernel.jit_launches == [((7, 2), (x, 100, 5), dict(OPTIONS))]
    # the compiled kernel's runner for all three grid sizes, every argument in the kernel's order, constexprs
    # included (not launch options), and the current device's stream
    assert kernel.compiled_launches == [(1, (7, 2, 1), (y, 100, 5, 64, True), 1000)]


@pytest.mark.parametrize("hooks", [False, True])
def test_without_launch_hooks_it_calls_the_launcher_under_the_runner(compiled_mode, monkeypatch, hooks):
    """What the runner would do, less its launch metadata and hook calls, the tensors passed as their addresses; with
    a hook registered, the runner, with the tensors."""
    from convt3d.backends.triton import launch as launch_module

    monkeypatch.setattr(launch_module, "_no_launch_hooks", lambda: not hooks)
    kernel = FakeKernel(DirectCompiled)
    bound = Launcher(kernel).bind((7, 2), (100, 5), OPTIONS)
    x, y = torch.empty(64), torch.empty(64)
    bound((x,))
    bound((y,))
    if hooks:
        assert kernel.compiled_launches == [(1, (7, 2, 1), (y, 100, 5, 64, True), 1000)]
        assert not kernel.direct_launches
    else:
        assert kernel.direct_launches == [
            (1, (7, 2, 1, 1000, "function", "packed metadata", None, None, None, y.data_ptr(), 100, 5, 64, True))]
        assert not kernel.compiled_launches


def test_launch_hooks_are_seen(monkeypatch):
    from convt3d.backends.triton import launch as launch_module

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    for enter, exit, idle in [([], [], True), ([print], [], False), ([], [print], False)]:
        monkeypatch.setattr(launch_module, "_runtime_knobs", type("Knobs", (), dict(
            launch_enter_hook=Chain(enter), launch_exit_hook=Chain(exit))))
        assert launch_module._no_launch_hooks() is idle
    # Hooks kept otherwise (older Triton: a function or None): not known to be idle.
    monkeypatch.setattr(launch_module, "_runtime_knobs", type("Knobs", (), dict(launch_enter_hook=None,
                                                                              launch_exit_hook=None)))
    assert not launch_module._no_launch_hooks()
    monkeypatch.setattr(launch_module, "_runtime_knobs", None)
    assert not launch_module._no_launch_hooks()


def test_a_bound_launch_takes_only_the_pointers(compiled_mode):
    kernel = FakeKernel()
    launch = Launcher(kernel)
    bound = launch.bind((7, 2), (100, 5), OPTIONS)
    assert launch.bind((7, 2), (100, 5), OPTIONS) is bound  # kept per grid, scalars and options
    x, y = torch.empty(64), torch.empty(64)
    bound((x,))
    bound((y,))
    unaligned = x[1:]
    bound((unaligned,))  # Triton specialises on alignment, so this goes through its launcher again
    assert [(grid, args[0], args[1:], kwargs) for grid, args, kwargs in kernel.jit_launches] == [
        ((7, 2), x, (100, 5), dict(OPTIONS)), ((7, 2), unaligned, (100, 5), dict(OPTIONS))]
    assert kernel.compiled_launches == [(1, (7, 2, 1), (y, 100, 5, 64, True), 1000)]


@pytest.mark.parametrize("change", ["int 1", "int multiple of 16", "int over 32 bits", "another int",
                                    "unaligned tensor", "dtype", "constexpr", "launch option", "grid", "device"])
def test_anything_else_goes_through_triton(compiled_mode, monkeypatch, change):
    """Each property that Triton specialises on, and every other value, sends the call through Triton's launcher,
    which compiles or finds the kernel for it; so does another current device."""
    kernel = FakeKernel()
    launch = Launcher(kernel)
    x = torch.empty(64)
    args, kwargs, grid = [x, 100, 5], dict(OPTIONS), (1,)
    launch.launch(grid, (x,), (100, 5), OPTIONS)
    if change == "int 1":
        args[2] = 1
    elif change == "int multiple of 16":
        args[1] = 32
    elif change == "int over 32 bits":
        args[1] = 2**31 + 100
    elif change == "another int":
        args[1] = 101
    elif change == "unaligned tensor":
        args[0] = x[1:]
    elif change == "dtype":
        args[0] = x.double()
    elif change == "constexpr":
        kwargs["BLOCK"] = 128
    elif change == "launch option":
        kwargs["num_warps"] = 8
    elif change == "grid":
        grid = (2,)
    else:
        from convt3d.backends.triton import launch as launch_module

        monkeypatch.setattr(launch_module, "_current_device", lambda: 1)
    launch.launch(grid, tuple(args[:1]), tuple(args[1:]), tuple(kwargs.items()))
    assert len(kernel.jit_launches) == 2 and not kernel.compiled_launches


def test_keys_are_bounded(compiled_mode, monkeypatch):
    from convt3d.backends.triton import launch as launch_module

    monkeypatch.setattr(launch_module, "MAX_KEYS", 4)
    launch = Launcher(FakeKernel())
    for n in range(10):
        launch.launch((1,), (torch.empty(4),), (n, 5), OPTIONS)
    assert len(launch._bound) <= 4


def test_arguments_it_cannot_key_by_value_are_refused(compiled_mode):
    with pytest.raises(TypeError, match="then ints"):
        Launcher(FakeKernel()).launch((1,), (torch.empty(4),), (True, 5), OPTIONS)
    with pytest.raises(TypeError, match="1 pointers"):
        Launcher(FakeKernel()).launch((1,), (), (torch.empty(4), 1, 5), OPTIONS)
    with pytest.raises(ValueError, match="pointer arguments must come first"):
        Launcher(type("Kernel", (FakeKernel,), {"arg_names": ["n", "x_ptr"], "__name__": "k"})())


def test_the_interpreter_always_runs_the_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel = FakeKernel()
    launch = Launcher(kernel)
    for _ in range(3):
        launch.launch((1,), (torch.empty(4),), (100, 5), OPTIONS)
    assert len(kernel.jit_launches) == 3 and not kernel.compiled_launches


def test_a_launch_at_addresses_takes_the_kernel_that_aligned_tensors_compiled(compiled_mode):
    """at_addresses serves a prepared call: the compiled kernel of aligned pointers of one dtype on a device, as
    the direct launch would run it; nothing before such a launch, for another dtype or device, or a kernel compiled
    only for unaligned pointers."""
    kernel = FakeKernel(DirectCompiled)
    bound = Launcher(kernel).bind((7, 2), (100, 5), OPTIONS)
    x = torch.empty(64)
    bound((x[1:],))  # unaligned: compiled, but not for the aligned key
    assert bound.at_addresses(0, (torch.float32,)) is None
    bound((x,))
    assert bound.at_addresses(0, (torch.float64,)) is None and bound.at_addresses(1, (torch.float32,)) is None
    bound.at_addresses(0, (torch.float32,))(1234, 4096)
    assert kernel.direct_launches == [
        (2, (7, 2, 1, 1234, "function", "packed metadata", None, None, None, 4096, 100, 5, 64, True))]


def test_launches_at_addresses_wait_for_the_device_and_no_hooks(compiled_mode, monkeypatch):
    from convt3d.backends.triton import launch as launch_module

    monkeypatch.setattr(launch_module, "_no_launch_hooks", lambda: True)
    assert launch_module.ready_stream(0) == 1000 and launch_module.ready_stream(1) is None  # current device: 0
    monkeypatch.setattr(launch_module, "_no_launch_hooks", lambda: False)
    assert launch_module.ready_stream(0) is None


def test_no_launch_at_addresses_in_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    bound = Launcher(FakeKernel()).bind((1,), (100, 5), OPTIONS)
    bound((torch.empty(4),))
    assert bound.at_addresses(None, (torch.float32,)) is None


# A compiled kernel as Triton 3.5-3.9 makes it, for the driver's launch (launch._driver_launch): its signature (the
# JIT's: an integer equal to 1 becomes constexpr), metadata, and the PTX entry's parameters (pointers, the integers
# kept, then the global and profile scratch pointers).
PTX = """
.visible .entry fake_kernel(
	.param .u64 .ptr .global .align 1 fake_kernel_param_0,
	.param .u32 fake_kernel_param_1,
	.param .u64 fake_kernel_param_2,
	.param .u64 .ptr .global .align 1 fake_kernel_param_3,
	.param .u64 .ptr .global .align 1 fake_kernel_param_4
)
"""
SCALARS = (100, 1, 2**40)  # n (i32), one (constexpr), big (i64)


class Metadata:
    num_warps, num_ctas, shared, launch_pdl, launch_cooperative_grid = 4, 1, 2048, True, False
    global_scratch_size = profile_scratch_size = 0


class DriverCompiled(DirectCompiled):
    function, asm, metadata = 77, {"ptx": PTX}, Metadata()
    src = type("Source", (), dict(signature={"x_ptr": "*fp32", "n": "i32", "one": "constexpr", "big": "i64",
                                             "BLOCK": "constexpr", "ROUND": "constexpr"}))


class DriverKernel(FakeKernel):
    arg_names = ["x_ptr", "n", "one", "big", "BLOCK", "ROUND"]


def driver_bound(monkeypatch, compiled_class=DriverCompiled):
    from convt3d.backends.triton import launch as launch_module

    monkeypatch.setattr(launch_module, "DRIVER_LAUNCH", True)
    kernel = DriverKernel(compiled_class)
    bound = Launcher(kernel).bind((7, 2), SCALARS, OPTIONS)
    bound((torch.empty(64),))
    return kernel, bound


def test_a_launch_at_addresses_goes_through_the_driver_with_the_kernels_parameters(compiled_mode, monkeypatch):
    from convt3d.backends import driver

    _, bound = driver_bound(monkeypatch)
    launch = bound.at_addresses(0, (torch.float32,))
    assert isinstance(launch, driver.Launch)
    config = launch.config
    assert (config.grid_x, config.grid_y, config.grid_z, config.block_x, config.shared_bytes) == (7, 2, 1, 128, 2048)
    # one attribute: programmatic stream serialization (launch_pdl), not cooperative
    assert config.attribute_count == 1 and launch.attributes[0].id == driver.PROGRAMMATIC_STREAM_SERIALIZATION
    assert len(launch.slots) == 1  # the pointer, written per launch
    # the integers Triton keeps, at their widths (the constexpr 1 dropped), then two null scratch pointers
    assert [(type(v), v.value) for v in launch.values] == [
        (ctypes.c_int32, 100), (ctypes.c_int64, 2**40), (ctypes.c_uint64, 0), (ctypes.c_uint64, 0)]
    assert len(launch.array) == 5


def test_a_cooperative_kernel_is_launched_cooperative(compiled_mode, monkeypatch):
    from convt3d.backends import driver

    class Cooperative(Metadata):
        launch_pdl, launch_cooperative_grid = False, True

    _, bound = driver_bound(monkeypatch, type("Compiled", (DriverCompiled,), dict(metadata=Cooperative())))
    launch = bound.at_addresses(0, (torch.float32,))
    assert launch.config.attribute_count == 1 and launch.attributes[0].id == driver.COOPERATIVE


@pytest.mark.parametrize("change", ["parameters", "scratch", "clusters", "float scalar", "no signature"])
def test_where_the_parameters_do_not_match_tritons_launcher_serves(compiled_mode, monkeypatch, change):
    """A PTX entry that does not list what the signature keeps, a kernel that asks for scratch memory or a cluster of
    programs, a scalar type the driver's launch does not pack, or a compiled kernel without a signature: the launch at
    addresses is Triton's launcher's, as before."""
    attributes = {}
    if change == "parameters":
        attributes["asm"] = {"ptx": PTX.replace(".param .u64 fake_kernel_param_2,\n", "")}
    elif change == "scratch":
        attributes["metadata"] = type("Scratch", (Metadata,), dict(global_scratch_size=64))()
    elif change == "clusters":
        attributes["metadata"] = type("Clusters", (Metadata,), dict(num_ctas=2))()
    elif change == "float scalar":
        attributes["src"] = type("Source", (), dict(signature={**DriverCompiled.src.signature, "n": "fp32"}))
    else:
        attributes["src"] = None
    kernel, bound = driver_bound(monkeypatch, type("Compiled", (DriverCompiled,), attributes))
    bound.at_addresses(0, (torch.float32,))(1234, 4096)
    assert kernel.direct_launches == [
        (1, (7, 2, 1, 1234, 77, "packed metadata", None, None, None, 4096, *SCALARS, 64, True))]


def test_the_driver_launch_is_on_unless_turned_off(compiled_mode, monkeypatch):
    from convt3d.backends.triton import launch as launch_module

    assert launch_module.DRIVER_LAUNCH is (os.environ.get("CONVT3D_DRIVER_LAUNCH") != "0")
    monkeypatch.setattr(launch_module, "DRIVER_LAUNCH", False)
    kernel = DriverKernel(DriverCompiled)
    bound = Launcher(kernel).bind((7, 2), SCALARS, OPTIONS)
    bound((torch.empty(64),))
    bound.at_addresses(0, (torch.float32,))(1234, 4096)
    assert len(kernel.direct_launches) == 1


def test_entry_parameter_bytes():
    from convt3d.backends.triton.launch import _entry_parameter_bytes

    assert _entry_parameter_bytes(PTX) == [8, 4, 8, 8, 8]
    assert _entry_parameter_bytes(PTX + PTX) is None  # two entries
    assert _entry_parameter_bytes(PTX.replace(".u32", ".f32")) is None  # a float parameter
