"""Models as a stack of named stages, so the split and the linear-base ablation are generic."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from fedper.common.errors import ConfigError

Stage = Callable[[torch.Tensor], torch.Tensor]


class StagedModel(nn.Module):
    """A model whose forward is a sequence of stages, one per FedPer layer group.

    ``layer_groups()[i]`` lists the state-key prefixes owned by ``stages()[i]``.
    The linear-base ablation (FedPer paper) swaps every stage below the head for
    one ``linear_base`` layer while keeping the head's state keys unchanged.
    """

    _linear_base_start: int = 0
    _linear_base_shape: tuple[int, ...] = ()
    _head_modules: tuple[str, ...] = ()

    def stages(self) -> Sequence[Stage]:
        raise NotImplementedError

    def stage_groups(self) -> list[list[str]]:
        raise NotImplementedError

    def classifier_name(self) -> str:
        """The top stage's module: the classifier every model ends with."""
        return self.stage_groups()[-1][-1]

    @property
    def head_modules(self) -> tuple[str, ...]:
        """The module paths named as the personal head (``--head-modules``), or () when kp counts."""
        return self._head_modules

    def layer_groups(self) -> list[list[str]]:
        """State-key prefixes of each layer, bottom to top (kp counts from the end). With named
        head modules, they are the top group, and the groups they cover are left out."""
        groups = self.stage_groups()
        if "linear_base" in self._modules:
            return [["linear_base"], *groups[self._linear_base_start :]]
        if self._head_modules:
            head = list(self._head_modules)
            rest = [[p for p in group if not any(under(p, h) for h in head)] for group in groups]
            return [*(group for group in rest if group), head]
        return groups

    def name_head(self, paths: Sequence[str]) -> None:
        """Make the modules at ``paths`` the personal head (they must exist, hold parameters and
        include the classifier, and leave a base)."""
        layers = [p for group in self.stage_groups() for p in group]
        for path in paths:
            try:
                module = self.get_submodule(path)
            except AttributeError:
                raise ConfigError(
                    f"--head-modules {path}: the model has no module {path}; its layers are {', '.join(layers)} "
                    "(or name a module inside one)"
                ) from None
            if not any(True for _ in module.parameters()):
                raise ConfigError(f"--head-modules {path}: the module ({type(module).__name__}) holds no parameters; "
                                  f"its layers are {', '.join(layers)}")  # fmt: skip
        classifier = self.classifier_name()
        if not any(under(classifier, p) for p in paths):
            raise ConfigError(f"--head-modules {','.join(paths)}: the personal head must include the classifier "
                              f"{classifier} (FedPer keeps the top layers personal)")  # fmt: skip
        if all(any(under(p, h) for h in paths) for p in layers):
            raise ConfigError(f"--head-modules {','.join(paths)} covers the whole model: nothing is left to share")
        self._head_modules = tuple(paths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = 0
        linear_base = self._modules.get("linear_base")
        if linear_base is not None:
            x = linear_base(torch.flatten(x, 1)).view(-1, *self._linear_base_shape)
            start = self._linear_base_start
        for stage in self.stages()[start:]:
            x = stage(x)
        return x

    def use_linear_base(self, kp: int, input_size: int) -> None:
        """Replace all layers below the top ``kp`` with a single linear layer (the ablation)."""
        n = len(self.stage_groups())
        if not 1 <= kp < n:
            raise ConfigError(f"the linear-base ablation needs 1 <= kp < {n}, got kp={kp}")
        start = n - kp
        with torch.no_grad():
            was_training = self.training
            self.eval()
            x = torch.zeros(1, 3, input_size, input_size)
            for stage in self.stages()[:start]:
                x = stage(x)
            self.train(was_training)
        shape = tuple(x.shape[1:])
        for group in self.stage_groups()[:start]:
            for prefix in group:
                replace_submodule(self, prefix, nn.Identity())
        self._linear_base_shape = shape
        self._linear_base_start = start
        self.add_module("linear_base", nn.Linear(3 * input_size * input_size, int(x[0].numel())))


def under(name: str, prefix: str) -> bool:
    """Whether state key or module path ``name`` is ``prefix`` or inside it."""
    return name == prefix or name.startswith(prefix + ".")


def replace_submodule(root: nn.Module, dotted: str, new: nn.Module) -> None:
    """Put ``new`` where the submodule at ``dotted`` was (so its state keys keep their names)."""
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    if isinstance(parent, nn.ModuleList | nn.Sequential):
        parent[int(child)] = new
    else:
        setattr(parent, child, new)
