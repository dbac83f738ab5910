"""A module computing with other child modules, everything else read live from its origin.

``live_view(policy, model=replica)`` is how data-parallel FSDP runs the policy's
teacher-forced pass on a sharded replica of its model: the view is a new object of
the policy's class whose ``model`` is the replica, while every other attribute (the
sampling record, the token rules and their mask, the tokenizer) is read from the
policy at each access, so a setting changed after the view was made is seen. The
origin is never changed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

ModuleT = TypeVar("ModuleT", bound=nn.Module)


_VIEW_CLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def _view_class(cls: type[nn.Module]) -> type[nn.Module]:
    """``cls`` whose instances read a missing attribute from their ``_origin`` (made once
    per class)."""
    if cls in _VIEW_CLASSES:
        return _VIEW_CLASSES[cls]

    def __getattr__(self: nn.Module, name: str) -> Any:  # noqa: N807  # the hook's own name
        try:
            return nn.Module.__getattr__(self, name)  # the view's own children
        except AttributeError:
            if name == "_origin":
                raise
            return getattr(self.__dict__["_origin"], name)

    view_class = type(f"{cls.__name__}View", (cls,), {"__getattr__": __getattr__})
    _VIEW_CLASSES[cls] = view_class
    return view_class


def live_view(origin: ModuleT, **children: nn.Module) -> ModuleT:
    """A view of ``origin`` (of its class, so its methods run) with ``children`` in place
    of its child modules of those names; any other attribute is ``origin``'s, read live.

    The view's own attributes are ``children`` and what is set on it afterwards; its
    ``parameters()`` are its children's only.
    """
    cls = _view_class(type(origin))
    view = cls.__new__(cls)
    nn.Module.__init__(view)
    view.__dict__["_origin"] = origin
    view.training = origin.training
    for name, child in children.items():
        if not isinstance(getattr(origin, name, None), nn.Module):
            raise ValueError(f"live_view: {type(origin).__name__} has no child module {name!r}")
        view._modules[name] = child  # not add_module: its hasattr would find origin's
    return view  # type: ignore[return-value]  # an instance of a subclass of type(origin)
