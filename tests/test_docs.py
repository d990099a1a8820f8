"""Every public thing of the package is documented: each class and function a module exports
(``__all__``, else its public names defined in deltaconv), and each public method and property of
those classes, has a docstring, its own or the one of the base-class member it overrides."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import deltaconv


def _modules():
    names = ["deltaconv"] + [m.name for m in pkgutil.walk_packages(deltaconv.__path__, prefix="deltaconv.")
                             if not any(part.startswith("_") for part in m.name.split("."))]
    return [importlib.import_module(n) for n in names]


def _public_objects(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    for name in names:
        obj = getattr(module, name, None)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith("deltaconv"):
            yield obj


def undocumented() -> list[str]:
    """Qualified names of the public classes, functions, methods and properties without a docstring."""
    missing = set()
    for module in _modules():
        for obj in _public_objects(module):
            where = f"{obj.__module__}.{obj.__qualname__}"
            if not inspect.getdoc(obj):
                missing.add(where)
            if not inspect.isclass(obj):
                continue
            for name, member in vars(obj).items():
                if name.startswith("_"):
                    continue
                if inspect.isfunction(member) or isinstance(member, (property, classmethod, staticmethod)):
                    if not inspect.getdoc(getattr(obj, name)):
                        missing.add(f"{where}.{name}")
    return sorted(missing)


def test_every_public_thing_has_a_docstring():
    assert undocumented() == []


def test_the_check_finds_a_missing_docstring(monkeypatch):
    def numel(self) -> int:
        return 0

    monkeypatch.setattr(deltaconv.Delta, "numel", numel)
    assert "deltaconv.delta.Delta.numel" in undocumented()
