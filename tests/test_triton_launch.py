"""The launcher that reuses a Triton kernel's compiled form (backends/triton/launch.py), with a stand-in kernel:
on the CPU no compiled kernel exists (the interpreter runs kernels as Python); the GPU tests of the backward run
the real one."""

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
