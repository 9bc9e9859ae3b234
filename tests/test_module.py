import pytest
import torch
from torch import nn

import convt3d
from conftest import assert_close_rel


def test_same_parameters_and_state_dict_as_pytorch():
    torch.manual_seed(0)
    ref = nn.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=1, output_padding=(1, 0, 0), groups=2,
                             dilation=(1, 2, 1)).double()
    ours = convt3d.ConvTranspose3d(4, 6, (3, 2, 3), stride=(2, 1, 2), padding=1, output_padding=(1, 0, 0), groups=2,
                                   dilation=(1, 2, 1)).double()
    assert isinstance(ours, nn.ConvTranspose3d)
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 3, 4, 5, dtype=torch.float64)
    assert_close_rel(ours(x), ref(x), 1e-12)
    ref.load_state_dict(ours.state_dict())


@pytest.mark.parametrize("output_size", [[8, 8, 10], [2, 4, 6, 7, 9]])
def test_forward_with_output_size(output_size):
    ref = nn.ConvTranspose3d(6, 4, 3, stride=(3, 2, 2)).double()
    ours = convt3d.convert(nn.ConvTranspose3d(6, 4, 3, stride=(3, 2, 2)).double())
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 6, 2, 3, 4, dtype=torch.float64)
    assert_close_rel(ours(x, output_size=output_size), ref(x, output_size=output_size), 1e-12)
    with pytest.raises(ValueError, match="output_size"):
        ours(x, output_size=[20, 8, 9])
    with pytest.raises(ValueError, match="output_size"):
        ours(x, output_size=[4, 8, 8, 10])


def test_unbatched_input():
    layer = convt3d.ConvTranspose3d(3, 2, 2, stride=2).double()
    x = torch.randn(3, 2, 3, 4, dtype=torch.float64)
    assert_close_rel(layer(x), nn.functional.conv_transpose3d(x, layer.weight, layer.bias, 2), 1e-12)


def test_convert_keeps_outputs_parameters_and_dtype():
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv3d(2, 4, 3, padding=1),
        nn.ReLU(),
        nn.Sequential(nn.ConvTranspose3d(4, 4, 4, stride=2, padding=1), nn.ReLU()),
        nn.ConvTranspose3d(4, 1, 3, stride=2, padding=1, output_padding=1, bias=False),
    ).double()
    x = torch.randn(2, 2, 3, 4, 4, dtype=torch.float64)
    expected = model(x)
    weight = model[3].weight
    converted = convt3d.convert(model)
    assert converted is model
    assert isinstance(model[2][0], convt3d.ConvTranspose3d) and isinstance(model[3], convt3d.ConvTranspose3d)
    assert model[3].weight is weight and model[3].weight.dtype == torch.float64
    assert_close_rel(model(x), expected, 1e-12)


def test_convert_a_bare_layer_returns_the_replacement():
    layer = nn.ConvTranspose3d(2, 2, 3)
    new = convt3d.convert(layer, backend="torch")
    assert isinstance(new, convt3d.ConvTranspose3d) and new.backend == "torch" and new.weight is layer.weight


def test_padding_mode_other_than_zeros_is_refused():
    layer = convt3d.ConvTranspose3d(2, 2, 3)
    layer.padding_mode = "reflect"
    with pytest.raises(ValueError, match="padding mode"):
        layer(torch.randn(1, 2, 3, 3, 3))


def test_convert_refuses_an_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        convt3d.convert(nn.Sequential(nn.ConvTranspose3d(2, 2, 3)), backend="cudnn")
