"""Model registry: output shapes on every dataset's input shape, options, and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from secure_fl.models import MODELS, UnknownModelError, build_model

SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def test_registry_names() -> None:
    assert set(MODELS) == {"mlp", "lenet5", "climb_cnn", "cnn7", "resnet18", "resnet50"}


@pytest.mark.parametrize("dataset", sorted(SHAPES))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_output_shape_on_every_dataset(name: str, dataset: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, input_shape=SHAPES[dataset], num_classes=10)
    model.eval()
    with torch.inference_mode():
        logits = model(torch.rand(2, *SHAPES[dataset]))
    assert logits.shape == (2, 10)
    assert torch.isfinite(logits).all()


def test_models_return_raw_logits_that_train() -> None:
    torch.manual_seed(0)
    model = build_model("lenet5", input_shape=(1, 28, 28), num_classes=7)
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 6])
    logits = model(x)
    assert not torch.allclose(logits.sum(1), torch.ones(4))  # raw logits, no softmax layer
    nn.functional.cross_entropy(logits, y).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_mlp_hidden_option_matches_fedshift_784_200_200_10() -> None:
    model = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=(200, 200))
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(784, 200), (200, 200), (200, 10)]
    default = build_model("mlp", input_shape=(1, 28, 28), num_classes=10)
    assert [m.out_features for m in default.modules() if isinstance(m, nn.Linear)] == [128, 128, 10]


def test_climb_cnn_layers() -> None:
    model = build_model("climb_cnn", input_shape=(3, 32, 32), num_classes=10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(64, (5, 5)), (64, (5, 5))]
    linear = [m.out_features for m in model.modules() if isinstance(m, nn.Linear)]
    assert linear == [394, 192, 10]


def test_cnn7_has_seven_weight_layers() -> None:
    model = build_model("cnn7", input_shape=(3, 32, 32), num_classes=10)
    weighted = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    assert len(weighted) == 7


def test_resnet_group_norm_option_has_no_batch_norm() -> None:
    model = build_model("resnet18", input_shape=(3, 32, 32), num_classes=10, norm="group")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    stem = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)  # small-input stem


def test_resnet_depths() -> None:
    r18 = build_model("resnet18", input_shape=(3, 32, 32), num_classes=10)
    r50 = build_model("resnet50", input_shape=(3, 32, 32), num_classes=10, width=16)
    convs18 = sum(isinstance(m, nn.Conv2d) for m in r18.modules())
    convs50 = sum(isinstance(m, nn.Conv2d) for m in r50.modules())
    assert convs18 == 17 + 3  # 17 conv layers + 3 projection shortcuts
    assert convs50 == 49 + 4
    assert 11_000_000 < sum(p.numel() for p in r18.parameters()) < 11_300_000


def test_errors() -> None:
    with pytest.raises(UnknownModelError, match="choose one of"):
        build_model("vgg16", input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mlp", input_shape=(1, 8, 8), num_classes=1)
    with pytest.raises(ValueError, match="input_shape"):
        build_model("lenet5", input_shape=(28, 28), num_classes=10)
    with pytest.raises(TypeError):
        build_model("lenet5", input_shape=(1, 28, 28), num_classes=10, hidden=(3,))
