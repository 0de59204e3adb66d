"""Lazy package attributes (PEP 562), so that importing a package (e.g. `untied_sc` for the CLI) loads nothing heavy."""

import importlib


def lazy_attributes(package: str, exports: dict[str, tuple[str, ...]]):
    """`__getattr__` and `__dir__` for `package`: `exports` maps a submodule (relative, e.g. `.pipelines`) to the names
    it provides, imported on first access."""
    where = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__, sorted(where)
