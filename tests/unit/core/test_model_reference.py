"""Any model in, by reference (issue 52): ``torchvision:NAME`` and ``PACKAGE.MODULE:CALLABLE`` built
as they are, their layer groups read off the module tree, the split by kp or by named head
modules, the ordinal head in the classifier's place, ``--list-layers``, ``--init`` in the model's
own layout, and what the stock training program refuses or rewrites."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from fedper.checkpoints import CheckpointError, init_base, read_checkpoint
from fedper.cli import main
from fedper.common.errors import ConfigError
from fedper.common.manifest import ModelSpec
from fedper.models import ModelConfig, StagedModel, build_model, exchanged_names, max_kp, split
from fedper.models.heads import OrdinalHead
from fedper.models.layer_table import layer_rows
from fedper.models.reference import TORCHVISION_MODELS, parse_model_args, parse_reference
from fedper.models.split import exchanged_state
from fedper.pretrained import checkpoint_path
from tests.support.custom_model import TinyNet

TINY = "tests.support.custom_model:TinyNet"


def linear_before_conv() -> nn.Module:
    """A model whose last layer is not its classifier (registration order puts the linear first)."""

    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 10)
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.conv(x).mean((2, 3)))

    return Odd()


def no_linear() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 10, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def failing(num_classes: int) -> nn.Module:
    raise RuntimeError("the user's constructor broke")


def test_references_parse_and_bad_syntax_is_refused() -> None:
    assert parse_reference("resnet34", ("mobilenet_v1", "resnet34")).kind == "named"
    tv = parse_reference("torchvision:mobilenet_v2", ())
    assert (tv.kind, tv.module, tv.attribute) == ("torchvision", "torchvision.models", "mobilenet_v2")
    own = parse_reference("my_pkg.models:Factory.build", ())
    assert (own.kind, own.module, own.attribute) == ("callable", "my_pkg.models", "Factory.build")
    for bad, message in [
        ("vgg", "unknown model 'vgg'"),
        ("torchvision:vgg11", r"torchvision:vgg11 is not one of .*torchvision.models:vgg11"),
        ("pkg.mod:", "unknown model"),
        ("pkg mod:f", "unknown model"),
        ("pkg.mod:1f", "unknown model"),
    ]:
        with pytest.raises(ConfigError, match=message):
            ModelConfig(name=bad)


def test_model_args_are_json_literals_else_strings_and_bad_ones_are_refused() -> None:
    config = ModelConfig(name=TINY, model_args=("width=4,dropout=0.0", 'tag=plain,sizes=[1, 2],opts={"a": 1}'))
    assert config.model_args == (
        ("width", 4),
        ("dropout", 0.0),
        ("tag", "plain"),
        ("sizes", [1, 2]),
        ("opts", {"a": 1}),
    )
    assert config.to_dict()["model_args"] == [["width", 4], ["dropout", 0.0], ["tag", "plain"], ["sizes", [1, 2]],
                                              ["opts", {"a": 1}]]  # fmt: skip
    # Given as pairs (code, a manifest) or as words (the command line): the same config, and hashable.
    again = ModelConfig(name=TINY, model_args=[["width", 4], ["dropout", 0.0], ["tag", "plain"], ["sizes", [1, 2]],
                                               ["opts", {"a": 1}]])  # fmt: skip
    assert again == config and hash(again) == hash(config)
    assert parse_model_args(("flag=true,none=null",)) == (("flag", True), ("none", None))
    for bad, message in [
        (("width",), "expected KEY=VALUE"),
        (("1width=2",), "not a keyword argument name"),
        (("a=1", "a=2"), "gives a more than once"),
        (("num_classes=3",), "--num-classes"),
    ]:
        with pytest.raises(ConfigError, match=message):
            ModelConfig(name=TINY, model_args=bad)
    with pytest.raises(ConfigError, match="--model-arg is for a model given by reference"):
        ModelConfig(name="mobilenet_v1", model_args=("width=4",))
    with pytest.raises(ConfigError, match="--base linear .* needs a named model"):
        ModelConfig(name=TINY, base="linear")
    with pytest.raises(ConfigError, match="not a module path"):
        ModelConfig(name=TINY, head_modules=("classifier..2",))
    with pytest.raises(ConfigError, match="names a module twice"):
        ModelConfig(name=TINY, head_modules=("fc", "fc"))


def test_a_config_round_trips_through_the_manifests_model_spec() -> None:
    config = ModelConfig(
        name=TINY, num_classes=5, model_args=("width=4,dropout=0.0",), head_modules="features.9,classifier"
    )
    spec = ModelSpec(**config.to_dict())
    assert ModelConfig(**spec.model_dump()) == config
    assert json.loads(spec.model_dump_json())["model_args"] == [["width", 4], ["dropout", 0.0]]


def test_import_problems_name_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cases = [
        ("no_such_module_anywhere:build", r"cannot import no_such_module_anywhere .*current directory"),
        ("tests.support.custom_model:Missing", "has no attribute Missing"),
        ("tests.support.custom_model:not_a_module", "returned a str, not a torch.nn.Module"),
        (f"{__name__}:failing", "failing\\(num_classes=5\\) failed: RuntimeError: the user's constructor broke"),
        (f"{__name__}:no_linear", "has no nn.Linear classifier"),
        (f"{__name__}:linear_before_conv", "does not end with its classifier: its last nn.Linear is fc"),
        ("tests.support.custom_model:tiny_net_without_classes", "has 10 outputs, but the model needs 5"),
    ]
    for reference, message in cases:
        with pytest.raises(ConfigError, match=message):
            build_model(ModelConfig(name=reference, num_classes=5))
    # A user's own file in the current directory: imported by its module name.
    (tmp_path / "my_net.py").write_text(
        "from torch import nn\n"
        "def build(num_classes, hidden=8):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))\n"
    )
    model = build_model(ModelConfig(name="my_net:build", num_classes=3, model_args=("hidden=6",)))
    assert isinstance(model, StagedModel) and model.layer_groups() == [["1"], ["3"]]
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 3)


@pytest.mark.parametrize("name", TORCHVISION_MODELS)
def test_every_named_torchvision_model_builds_as_torchvision_builds_it(name: str) -> None:
    with torch.device("meta"):  # torchvision's own model, for its state keys and shapes only
        upstream = getattr(torchvision.models, name)(weights=None, num_classes=7)
    model = build_model(ModelConfig(name=f"torchvision:{name}", num_classes=7, input_size=32), seed=0)
    assert isinstance(model, StagedModel) and isinstance(model, type(upstream))
    assert [(k, v.shape) for k, v in model.state_dict().items()] == [
        (k, v.shape) for k, v in upstream.state_dict().items()
    ]
    with torch.no_grad():
        assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    classifier = model.get_submodule(model.classifier_name())
    assert isinstance(classifier, nn.Linear) and classifier.out_features == 7
    assert model.layer_groups()[-1] == [model.classifier_name()]


def test_a_torchvision_model_keeps_torchvisions_weights_and_forward() -> None:
    torch.manual_seed(0)
    upstream = torchvision.models.mobilenet_v3_small(weights=None, num_classes=7).eval()
    model = build_model(ModelConfig(name="torchvision:mobilenet_v3_small", num_classes=7), seed=0).eval()
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), upstream.state_dict().values(), strict=True)
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), upstream(x))


def test_layer_groups_follow_the_module_tree() -> None:
    resnet = build_model(ModelConfig(name="torchvision:resnet18"))
    assert resnet.layer_groups() == [
        ["conv1", "bn1"],
        *([f"layer{i}.{j}"] for i in (1, 2, 3, 4) for j in (0, 1)),
        ["fc"],
    ]
    mobilenet = build_model(ModelConfig(name="torchvision:mobilenet_v2"))
    # Conv2dNormActivation is an nn.Sequential subclass: one layer; the classifier's Dropout holds nothing.
    assert mobilenet.layer_groups() == [[f"features.{i}"] for i in range(19)] + [["classifier.1"]]
    tiny = build_model(ModelConfig(name=TINY))
    assert tiny.layer_groups() == [["features.0", "features.1"], ["features.3"], ["features.4"], ["features.6"],
                                   ["features.7"], ["features.8"], ["features.9"], ["classifier.2"]]  # fmt: skip
    assert tiny.classifier_name() == "classifier.2"
    assert sum(p.numel() for p in tiny.parameters()) < 8000  # small, so the tests that train it are fast


def test_the_split_counts_kp_over_the_groups_or_takes_the_named_head() -> None:
    resnet = build_model(ModelConfig(name="torchvision:resnet18", num_classes=5))
    names = exchanged_names(resnet)
    assert set(split(resnet, 1).head) == {"fc.weight", "fc.bias"}
    assert set(split(resnet, 2).head) == {n for n in names if n.startswith(("fc.", "layer4.1."))}
    assert max_kp(resnet) == 9 and split(resnet, 9).base == tuple(n for n in names if n.startswith(("conv1.", "bn1.")))
    named = build_model(ModelConfig(name="torchvision:resnet18", num_classes=5, head_modules=("layer4", "fc")))
    head = {n for n in names if n.startswith(("fc.", "layer4."))}
    assert max_kp(named) == 1 and named.layer_groups()[-1] == ["layer4", "fc"]
    for kp in (1, 2, 5):  # any kp >= 1 is the named head
        assert set(split(named, kp).head) == head and split(named, kp).kp == 1
    assert split(named, 0).head == ()
    with pytest.raises(ConfigError, match=r"no module layer9; its layers are conv1, bn1, layer1.0, .*, fc"):
        build_model(ModelConfig(name="torchvision:resnet18", head_modules=("layer9", "fc")))
    with pytest.raises(ConfigError, match="avgpool: the module .AdaptiveAvgPool2d. holds no parameters"):
        build_model(ModelConfig(name="torchvision:resnet18", head_modules=("avgpool", "fc")))
    with pytest.raises(ConfigError, match="must include the classifier fc"):
        build_model(ModelConfig(name="torchvision:resnet18", head_modules=("layer4",)))
    with pytest.raises(ConfigError, match="covers the whole model"):
        build_model(ModelConfig(name=TINY, head_modules=("features", "classifier")))
    # The named models take head modules too.
    mobilenet = build_model(ModelConfig(name="mobilenet_v1", head_modules=("blocks.12", "classifier")))
    assert set(split(mobilenet, 2).head) == {
        n for n in exchanged_names(mobilenet) if n.startswith(("blocks.12.", "classifier."))
    }


def test_the_ordinal_head_takes_the_classifiers_place() -> None:
    model = build_model(ModelConfig(name="torchvision:mobilenet_v3_small", num_classes=5, head="ordinal"), seed=0)
    head = model.get_submodule("classifier.3")
    assert isinstance(head, OrdinalHead) and head.score.in_features == 1024
    assert model.classifier_name() == "classifier.3" and model.layer_groups()[-1] == ["classifier.3"]
    assert set(split(model, 1).head) == {"classifier.3.score.weight", "classifier.3.first", "classifier.3.gaps"}
    with torch.no_grad():
        log_p = model.eval()(torch.randn(2, 3, 32, 32))
    assert log_p.shape == (2, 5) and torch.allclose(log_p.exp().sum(1), torch.ones(2), atol=1e-5)


def test_list_layers_prints_each_group_its_kp_and_its_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--model", TINY, "--num-classes", "5", "--list-layers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    model = build_model(ModelConfig(name=TINY, num_classes=5))
    rows = [line.split() for line in lines[2:-1]]
    assert [r[0] for r in rows] == [str(i) for i in range(8)] and [r[1] for r in rows] == [
        "-",
        *map(str, range(7, 0, -1)),
    ]
    assert rows[0][3:] == ["features.0,", "features.1"] and rows[-1][3:] == ["classifier.2", "(classifier)"]
    assert sum(int(r[2].replace(",", "")) for r in rows) == sum(p.numel() for p in model.parameters())
    assert [r.parameters for r in layer_rows(model)][-1] == 32 * 5 + 5
    assert main(["simulate", "--model", "torchvision:resnet18", "--head-modules", "layer4,fc", "--dataset", "digits",
                 "--list-layers"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "the personal head is --head-modules layer4,fc" in out
    assert [line.split()[1] for line in out.splitlines()[2:-1]] == ["-"] * 7 + ["1"]


@pytest.fixture(scope="module")
def tiny_source() -> dict[str, torch.Tensor]:
    """A TinyNet's state dict (seed 1, 10 classes): what a user's checkpoint holds."""
    torch.manual_seed(1)
    return TinyNet(10).state_dict()


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_init_loads_a_state_dict_in_the_models_own_layout(suffix: str, tiny_source, tmp_path: Path) -> None:
    path = tmp_path / f"tiny{suffix}"
    if suffix == ".pt":
        torch.save({"state_dict": tiny_source}, path)
    else:
        save_file({k: v.contiguous() for k, v in tiny_source.items()}, str(path))
    model = build_model(ModelConfig(name=TINY, num_classes=10), seed=0)
    source = init_base(model, read_checkpoint(path, TINY), kp=2)
    assert source.layout == "model" and source.fresh == () and source.notes == ()
    assert all(torch.equal(v, tiny_source[k]) for k, v in exchanged_state(model).items())
    # Other classes: everything but the classifier is loaded, and the classifier starts fresh, said why.
    other = build_model(ModelConfig(name=TINY, num_classes=5), seed=0)
    fresh = exchanged_state(other)
    source = init_base(other, read_checkpoint(path, TINY), kp=2)
    assert source.fresh == ("classifier.2.weight", "classifier.2.bias")
    assert source.notes == ("the classifier classifier.2 starts fresh: classifier.2.weight is (10, 32) in the checkpoint, "
                            "(5, 32) in the model",)  # fmt: skip
    state = exchanged_state(other)
    assert torch.equal(state["classifier.2.weight"], fresh["classifier.2.weight"])
    assert torch.equal(state["features.4.depthwise.conv.weight"], tiny_source["features.4.depthwise.conv.weight"])


def test_init_refuses_a_checkpoint_that_does_not_fit_naming_the_tensors(tiny_source, tmp_path: Path) -> None:
    model = build_model(ModelConfig(name=TINY, num_classes=10), seed=0)
    before = exchanged_state(model)
    missing = {k: v for k, v in tiny_source.items() if k != "features.6.bn.weight"}
    torch.save(missing, tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match=r"1 missing .* features.6.bn.weight: missing \(expected shape \(24,\)\)"):
        init_base(model, read_checkpoint(tmp_path / "missing.pt", TINY), kp=1)
    wide = build_model(ModelConfig(name=TINY, num_classes=10, model_args=("width=4",))).state_dict()
    torch.save(wide, tmp_path / "wide.pth")
    with pytest.raises(
        CheckpointError, match=r"features.0.weight: expected shape \(8, 3, 3, 3\), the checkpoint has \(4, 3, 3, 3\)"
    ):
        init_base(model, read_checkpoint(tmp_path / "wide.pth", TINY), kp=1)
    assert all(torch.equal(v, before[k]) for k, v in exchanged_state(model).items())  # nothing was loaded
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (Path.touch, (str(marker),))  # what a plain unpickling would run

    (tmp_path / "evil.pt").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(
        CheckpointError, match=r"evil.pt: not a torch state dict torch.load\(weights_only=True\) can read"
    ):
        read_checkpoint(tmp_path / "evil.pt", TINY)
    assert not marker.exists()
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="expected a state dict .*, got a list"):
        read_checkpoint(tmp_path / "list.pt", TINY)
    with pytest.raises(CheckpointError, match="not read; give a safetensors file or a torch state dict"):
        read_checkpoint(tmp_path / "tiny.ckpt", TINY)
    with pytest.raises(CheckpointError, match="the packaged MobileNet-V1 base .* give --init scratch"):
        read_checkpoint(checkpoint_path(Path("pretrained")), TINY)  # type: ignore[arg-type]


def test_every_command_that_builds_a_model_takes_the_reference_options() -> None:
    """export, simulate, pretrain and demo nest the model config (fleet and device rebuild the model
    from the manifest); the demo starts another model than MobileNet-V1 from random weights."""
    from fedper._recipes.demo_command import demo_config
    from fedper._recipes.pretrain import PretrainConfig
    from fedper._recipes.simulation import SimulationConfig
    from fedper.cli import parse_arguments
    from fedper.common.config_cli import from_arguments
    from fedper.export.pipeline import ExportConfig

    options = ["--model", TINY, "--model-arg", "width=4", "--model-arg", "dropout=0.1"]
    for command, cls in [("export", ExportConfig), ("simulate", SimulationConfig), ("pretrain", PretrainConfig)]:
        model = from_arguments(cls, parse_arguments([command, *options])).model  # type: ignore[attr-defined]
        assert (model.name, model.model_args) == (TINY, (("width", 4), ("dropout", 0.1))), command
    heads = from_arguments(
        ExportConfig, parse_arguments(["export", *options, "--head-modules", "features.9,classifier"])
    )
    assert heads.model.head_modules == ("features.9", "classifier")
    demo = demo_config(parse_arguments(["demo", *options, "--head-modules", "classifier"]))
    assert demo.model.name == TINY and demo.model.head_modules == ("classifier",) and str(demo.init) == "scratch"
    with pytest.raises(ConfigError, match="--init pretrained is the packaged MobileNet-V1 base"):
        demo_config(parse_arguments(["demo", *options, "--init", "pretrained"]))
    assert str(demo_config(parse_arguments(["demo"])).init) == "pretrained"
    # aesthetic-synth's preset starts MobileNet-V1 from the packaged base, another model from scratch.
    from fedper._recipes.presets import setting

    assert setting(parse_arguments(["simulate", *options, "--dataset", "aesthetic-synth"])).simulation.init is None
    assert str(setting(parse_arguments(["simulate", "--dataset", "aesthetic-synth"])).simulation.init) == "pretrained"
