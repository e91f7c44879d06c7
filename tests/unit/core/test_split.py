import pytest
import torch

from fedper.models import ModelConfig, build_model, exchanged_names, max_kp, split


@pytest.fixture(scope="module")
def mobilenet():
    return build_model(ModelConfig(name="mobilenet_v1", alpha=0.25, input_size=32), seed=0)


@pytest.fixture(scope="module")
def resnet():
    return build_model(ModelConfig(name="resnet34", input_size=32), seed=0)


@pytest.mark.parametrize("model_name", ["mobilenet", "resnet"])
def test_split_is_a_partition_of_the_float_state_for_every_kp(model_name, request):
    model = request.getfixturevalue(model_name)
    names = exchanged_names(model)
    assert all("num_batches_tracked" not in n for n in names)
    assert all(model.state_dict()[n].is_floating_point() for n in names)
    for kp in range(0, max_kp(model) + 1):
        s = split(model, kp)
        assert not set(s.base) & set(s.head)
        assert set(s.base) | set(s.head) == set(names)
        # Both lists keep the model's own state-dict order.
        assert list(s.base) == [n for n in names if n in set(s.base)]
        assert list(s.head) == [n for n in names if n in set(s.head)]


def test_mobilenet_kp_semantics(mobilenet):
    assert split(mobilenet, 0).head == ()
    assert set(split(mobilenet, 1).head) == {"classifier.weight", "classifier.bias"}
    kp2 = set(split(mobilenet, 2).head)
    assert kp2 == {"classifier.weight", "classifier.bias"} | {
        n for n in exchanged_names(mobilenet) if n.startswith("blocks.12.")
    }
    assert any(n.endswith("running_mean") for n in kp2)  # BN statistics belong to their layer
    kp4 = split(mobilenet, 4).head
    assert {n.split(".")[1] for n in kp4 if n.startswith("blocks.")} == {"10", "11", "12"}
    assert max_kp(mobilenet) == 14  # stem + 13 blocks + classifier; the stem always stays shared
    assert split(mobilenet, 14).base == tuple(n for n in exchanged_names(mobilenet) if n.startswith("stem."))


def test_resnet_kp_semantics(resnet):
    assert set(split(resnet, 1).head) == {"fc.weight", "fc.bias"}
    kp2 = {n.rsplit(".", 2)[0] for n in split(resnet, 2).head if not n.startswith("fc.")}
    assert all(n.startswith("layer4.2.") for n in split(resnet, 2).head if not n.startswith("fc."))
    assert kp2
    kp4 = {".".join(n.split(".")[:2]) for n in split(resnet, 4).head if not n.startswith("fc.")}
    assert kp4 == {"layer4.0", "layer4.1", "layer4.2"}
    kp5 = {".".join(n.split(".")[:2]) for n in split(resnet, 5).head if not n.startswith("fc.")}
    assert "layer3.5" in kp5


def test_names_do_not_depend_on_kp_or_input_size():
    a = exchanged_names(build_model(ModelConfig(alpha=0.25, input_size=32)))
    b = exchanged_names(build_model(ModelConfig(alpha=0.25, input_size=224)))
    c = exchanged_names(build_model(ModelConfig(alpha=1.0, input_size=32)))
    assert a == b == c


@pytest.mark.parametrize("kp", [-1, 15, 100])
def test_kp_out_of_range_is_a_clear_error(mobilenet, kp):
    with pytest.raises(ValueError, match="kp must be between 0 and 14"):
        split(mobilenet, kp)


def test_both_model_variants_run_and_have_no_dropout():
    for cfg in (
        ModelConfig(input_size=32),
        ModelConfig(input_size=224),
        ModelConfig(name="resnet34"),
    ):
        model = build_model(cfg, seed=0)
        assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
        out = model.eval()(torch.randn(2, 3, cfg.input_size, cfg.input_size))
        assert out.shape == (2, cfg.num_classes)


def test_imagenet_variant_downsamples_in_the_stem():
    small = build_model(ModelConfig(input_size=32))
    large = build_model(ModelConfig(input_size=224))
    assert small.stem.conv.stride == (1, 1)
    assert large.stem.conv.stride == (2, 2)


def test_linear_base_keeps_head_names_and_replaces_everything_below():
    full = build_model(ModelConfig(), seed=0)
    ablation = build_model(ModelConfig(base="linear", linear_base_kp=2), seed=0)
    s = split(ablation, 2)
    assert s.base == ("linear_base.weight", "linear_base.bias")
    assert s.head == split(full, 2).head
    assert ablation(torch.randn(3, 3, 32, 32)).shape == (3, 10)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        ModelConfig(name="vgg")
