"""The package's run-time requirement on torch, computed when it is built
(pyproject.toml, [tool.scikit-build.metadata.dependencies]): the exact public
version of the torch the build compiles against, because the operator library
links that torch's C++ symbols, which change between releases. A scikit-build-core
dynamic-metadata provider: its interface is the one function below."""
import importlib


def dynamic_metadata(field, settings):
    if field != "dependencies" or settings:
        raise RuntimeError(f"torch_pin gives only 'dependencies' and takes no settings (got {field!r}, {settings!r})")
    try:
        torch = importlib.import_module("torch")
    except ImportError as e:
        raise RuntimeError("bigbatch builds against the torch it will run with, which this environment lacks "
                           f"({e}): install torch, then `pip install --no-build-isolation .` (docs/python.md)") from e
    return [f"torch=={torch.__version__.split('+')[0]}"]
