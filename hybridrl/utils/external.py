"""Classes a config names by file or module, as verl names them: `class_path` is a .py file or
`pkg://package.module`, `class_name` the class in it (data.custom_cls, data.sampler)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path


def load_class(class_path: str, class_name: str, key: str, base: type) -> type:
    """The subclass of `base` named `class_name` in `class_path`; errors name the config `key`."""
    where = f"{key}={class_path!r}"
    if class_path.startswith("pkg://"):
        module = importlib.import_module(class_path.removeprefix("pkg://"))
    else:
        file = Path(class_path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"{where} is neither a .py file nor pkg://<importable module>")
        # one module name per file, so two files of the same name never replace each other
        spec = importlib.util.spec_from_file_location(f"hybridrl_external_{abs(hash(str(file.resolve())))}", file)
        if spec is None or spec.loader is None:
            raise ImportError(f"{where} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{class_name!r} in {where} must be a {base.__module__}.{base.__qualname__} subclass, "
                        f"got {cls!r}")
    return cls
