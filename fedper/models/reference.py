"""Any model in, by reference: ``torchvision:NAME`` or ``PACKAGE.MODULE:CALLABLE``.

An engineer who ships personalization already has a model. It is built as it is (its state keys
and its forward unchanged) and made a :class:`StagedModel` by giving its object a class that
derives from both: the layer groups the FedPer split counts ``kp`` over are read off its module
tree (:func:`derive_layer_groups`), so ``--list-layers``, ``--kp``, ``--head-modules`` and the
manifest work as for the named models.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from torch import nn

from fedper.common.errors import ConfigError
from fedper.models.heads import OrdinalHead
from fedper.models.staged import Stage, StagedModel, replace_submodule

# torchvision's constructors a ``torchvision:NAME`` reference may name (built with weights=None).
# (Any other torchvision constructor is a PACKAGE.MODULE:CALLABLE reference: torchvision.models:resnet50.)
TORCHVISION_MODELS = ("mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "resnet18", "resnet34",
                      "efficientnet_b0")  # fmt: skip
TORCHVISION_PREFIX = "torchvision:"
# PACKAGE.MODULE:CALLABLE, the callable possibly an attribute path (Class.factory).
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_CALLABLE_REFERENCE = re.compile(rf"({_DOTTED}):({_DOTTED})")
# One KEY=VALUE of --model-arg; a comma starts the next pair only where a KEY= follows it, so a
# JSON list or object value keeps its commas.
_PAIR_SEPARATOR = re.compile(r",(?=\s*[A-Za-z_]\w*\s*=)")
MODEL_ARG_METAVAR = "KEY=VALUE[,KEY=VALUE...]"
MODEL_HELP = (
    "the model: mobilenet_v1, resnet34, torchvision:NAME (" + ", ".join(TORCHVISION_MODELS) + ") or "
    "PACKAGE.MODULE:CALLABLE (a callable returning an nn.Module, imported with the current directory on the path)"
)
# Containers whose children are layers of their own; any other module holding parameters is one
# layer (torchvision's Conv2dNormActivation is an nn.Sequential subclass: one layer).
CONTAINERS = (nn.Sequential, nn.ModuleList)
NORMALIZATION = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)

ModelArgs = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Reference:
    """What ``--model`` names: a named model, a torchvision constructor, or module:callable."""

    text: str
    kind: Literal["named", "torchvision", "callable"]
    module: str = ""
    attribute: str = ""


def parse_reference(text: str, named: Sequence[str]) -> Reference:
    """The reference ``text`` stands for; bad syntax or an unknown torchvision name is a ConfigError."""
    if not isinstance(text, str):
        raise ConfigError(f"--model must be a string, got {text!r}")
    if text in named:
        return Reference(text, "named")
    if text.startswith(TORCHVISION_PREFIX):
        name = text.removeprefix(TORCHVISION_PREFIX)
        if name not in TORCHVISION_MODELS:
            raise ConfigError(f"--model {text}: torchvision:{name} is not one of the torchvision models offered: "
                              f"{', '.join(TORCHVISION_MODELS)} (any other: give its constructor as "
                              f"torchvision.models:{name or 'NAME'})")  # fmt: skip
        return Reference(text, "torchvision", "torchvision.models", name)
    match = _CALLABLE_REFERENCE.fullmatch(text)
    if match is None:
        raise ConfigError(
            f"unknown model {text!r}: give a named model ({', '.join(named) or 'mobilenet_v1, resnet34'}), "
            "torchvision:NAME or PACKAGE.MODULE:CALLABLE (e.g. mypackage.models:build_net, or my_model:Net for "
            "./my_model.py)"
        )
    return Reference(text, "callable", match[1], match[2])


def parse_model_args(values: object) -> ModelArgs:
    """``--model-arg`` values (KEY=VALUE strings, each possibly several comma-separated pairs) or
    (key, value) pairs as (key, value) pairs; each VALUE a JSON literal, else kept as text."""
    if isinstance(values, str):
        values = (values,)
    if not isinstance(values, tuple | list):
        raise ConfigError(f"--model-arg must be KEY=VALUE pairs, got {values!r}")
    pairs: list[tuple[str, Any]] = []
    for item in values:
        if isinstance(item, str):
            pairs += [_pair(part) for part in _PAIR_SEPARATOR.split(item) if part.strip()]
        elif isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], str):
            pairs.append((_key(item[0], str(item)), item[1]))
        else:
            raise ConfigError(f"--model-arg must be KEY=VALUE pairs, got {item!r}")
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ConfigError(f"--model-arg gives {', '.join(twice)} more than once")
    if "num_classes" in keys:
        raise ConfigError("--model-arg num_classes: give the classes with --num-classes (or --dataset)")
    return tuple(pairs)


def _pair(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError(f"--model-arg {text.strip()!r}: expected KEY=VALUE (e.g. width_mult=0.5 or dropout=0.0)")
    raw = raw.strip()
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return _key(key, text), value


def _key(key: str, text: str) -> str:
    key = key.strip()
    if not key.isidentifier():
        raise ConfigError(f"--model-arg {text.strip()!r}: {key!r} is not a keyword argument name")
    return key


@contextlib.contextmanager
def _current_directory_importable() -> Iterator[None]:
    """The current directory first on ``sys.path`` while the user's module is imported and called."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def resolve_callable(reference: Reference) -> Any:
    """The constructor ``reference`` names, imported; a clear ConfigError if it is not there."""
    with _current_directory_importable():
        try:
            target: Any = importlib.import_module(reference.module)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"--model {reference.text}: cannot import {reference.module} ({exc}); it is looked up on the Python "
                f"path and in the current directory {os.getcwd()} (a file {reference.module.replace('.', '/')}.py "
                "there works)"
            ) from exc
        except Exception as exc:
            raise ConfigError(f"--model {reference.text}: importing {reference.module} failed: "
                              f"{type(exc).__name__}: {exc}") from exc  # fmt: skip
    for part in reference.attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"--model {reference.text}: {reference.module} has no attribute {reference.attribute}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"--model {reference.text}: {reference.attribute} is a {type(target).__name__}, not callable")
    return target


def _accepts(function: Any, name: str) -> bool:
    """Whether ``function`` takes keyword argument ``name`` (by name or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any((p.name == name and p.kind != p.POSITIONAL_ONLY) or p.kind == p.VAR_KEYWORD for p in parameters)


def build_reference(text: str, num_classes: int, head: str, model_args: ModelArgs) -> StagedModel:
    """Build the model ``text`` names (random weights: the caller seeds torch) as a StagedModel,
    with ``num_classes`` outputs and, for ``head="ordinal"``, the ordinal head in its classifier's place."""
    reference = parse_reference(text, ())
    constructor = resolve_callable(reference)
    kwargs = dict(model_args)
    if reference.kind == "torchvision":
        kwargs = {"weights": None, **kwargs}
    if _accepts(constructor, "num_classes"):
        kwargs["num_classes"] = num_classes
    with _current_directory_importable():
        try:
            module = constructor(**kwargs)
        except Exception as exc:
            shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            failure = f"{type(exc).__name__}: {exc}"
            raise ConfigError(f"--model {text}: {reference.attribute}({shown}) failed: {failure}") from exc
    if not isinstance(module, nn.Module):
        raise ConfigError(f"--model {text}: {reference.attribute}(...) returned a {type(module).__name__}, "
                          "not a torch.nn.Module")  # fmt: skip
    return as_staged(module, text, num_classes, head)


def last_linear(module: nn.Module) -> str | None:
    """The module path of ``module``'s last ``nn.Linear`` in registration order, if any."""
    paths = [path for path, m in module.named_modules() if isinstance(m, nn.Linear)]
    return paths[-1] if paths else None


def derive_layer_groups(module: nn.Module) -> list[list[str]]:
    """The model's layers, bottom to top, as module paths: containers whose type is exactly
    ``nn.Sequential`` or ``nn.ModuleList`` are opened, every other module holding tensors is one
    layer, a normalization-only module joins the layer before it (a convolution's BatchNorm)."""
    groups: list[list[str]] = []
    own = [name for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]]
    if own:  # tensors held by the model itself (not by a layer): a group of their own
        groups.append(own)

    def visit(prefix: str, parent: nn.Module) -> None:
        for name, child in parent.named_children():
            path = f"{prefix}{name}"
            if type(child) in CONTAINERS:
                visit(f"{path}.", child)
            elif not _holds_state(child):
                continue
            elif isinstance(child, NORMALIZATION) and groups:
                groups[-1].append(path)
            else:
                groups.append([path])

    visit("", module)
    return groups


def _holds_state(module: nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(b.is_floating_point() for b in module.buffers())


class ReferenceModel(StagedModel):
    """What a model given by reference derives from (beside its own class): the layer groups
    derived from its module tree, and its own forward. Not a sequence of stages: the linear-base
    ablation, which runs the stages below the head, is for the named models only."""

    _reference: str
    _groups: list[list[str]]
    _classifier: str

    def stages(self) -> Sequence[Stage]:
        raise ConfigError(f"{self._reference} is not a sequence of stages: --base linear is for the named models")

    def stage_groups(self) -> list[list[str]]:
        return [list(group) for group in self._groups]

    def classifier_name(self) -> str:
        return self._classifier


_STAGED_CLASSES: dict[type[nn.Module], type[ReferenceModel]] = {}


def _staged_class(cls: type[nn.Module]) -> type[ReferenceModel]:
    """A class deriving from ReferenceModel and ``cls`` whose forward is ``cls``'s (one per class)."""
    if cls not in _STAGED_CLASSES:
        namespace = {"forward": cls.forward, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        _STAGED_CLASSES[cls] = type(cls.__name__, (ReferenceModel, cls), namespace)
    return _STAGED_CLASSES[cls]


def as_staged(module: nn.Module, reference: str, num_classes: int, head: str = "softmax") -> StagedModel:
    """``module`` itself (same state keys, same forward) as a StagedModel over its derived layer
    groups; its last ``nn.Linear`` must be its classifier, with ``num_classes`` outputs."""
    if isinstance(module, StagedModel):  # a model of this toolkit, given by reference: its own groups
        return module
    classifier = last_linear(module)
    groups = derive_layer_groups(module)
    if not groups:
        raise ConfigError(f"--model {reference}: the model holds no parameters")
    top = ", ".join(groups[-1])
    if classifier is None:
        raise ConfigError(f"--model {reference}: the model has no nn.Linear classifier; FedPer's head ends with one "
                          f"(the model's last layer is {top}, a {_type_name(module, groups[-1][0])})")  # fmt: skip
    if not any(classifier == p or classifier.startswith(p + ".") for p in groups[-1]):
        raise ConfigError(
            f"--model {reference}: the model does not end with its classifier: its last nn.Linear is {classifier}, "
            f"but its last layer is {top} (a {_type_name(module, groups[-1][0])}); the toolkit's split, ordinal "
            "head and --init need the classifier on top"
        )
    linear = module.get_submodule(classifier)
    assert isinstance(linear, nn.Linear)
    if linear.out_features != num_classes:
        raise ConfigError(
            f"--model {reference}: its classifier {classifier} has {linear.out_features} outputs, but the model "
            f"needs {num_classes} (--num-classes or the dataset's); a callable that takes num_classes gets it, "
            "otherwise build it with that many outputs (e.g. with --model-arg)"
        )
    if head == "ordinal":
        replace_submodule(module, classifier, OrdinalHead(linear.in_features, num_classes))
    elif head != "softmax":
        raise ConfigError(f"unknown head {head!r}")
    module.__class__ = _staged_class(type(module))
    assert isinstance(module, ReferenceModel)
    module._reference, module._groups, module._classifier = reference, groups, classifier
    return module


def _type_name(root: nn.Module, path: str) -> str:
    try:
        return type(root.get_submodule(path)).__name__
    except AttributeError:
        return "tensor"


def source_digest(text: str) -> str | None:
    """sha256 of the source file of the module a ``PACKAGE.MODULE:CALLABLE`` reference imports
    (an export cache must not answer for an edited model), None for the others."""
    if ":" not in text:  # a named model: the toolkit's own source, which the cache key holds already
        return None
    reference = parse_reference(text, ())
    if reference.kind != "callable":
        return None
    with _current_directory_importable():
        module = importlib.import_module(reference.module)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()
