"""Loads the operator library (python/csrc/ops.cpp, built by pip as libbigbatch_ops.so
beside this file) and gives its step operator a fake implementation, so that
tracing and torch.compile see bigbatch::step as one opaque call that writes
the parameters and returns nothing."""
import json
import math
import pathlib

import torch

_LIBRARY = pathlib.Path(__file__).resolve().parent / "libbigbatch_ops.so"
if not _LIBRARY.exists():
    raise ImportError(f"bigbatch: the operator library {_LIBRARY} is missing; install the package with "
                      "`pip install --no-build-isolation .` from the repository (docs/python.md)")


def _public(version):
    return str(version).split("+")[0]


def check_torch(running, built):
    """The library links the C++ symbols of the torch it was built against;
    another release's differ. Local labels (+cu132, +cpu) share them."""
    if _public(running) != _public(built):
        raise ImportError(f"bigbatch was built against torch {built} and this Python imports torch {running}: "
                          f"install torch=={_public(built)}, or rebuild bigbatch in this environment "
                          "(`pip install --no-build-isolation .`, docs/python.md)")


from ._build_info import TORCH_VERSION  # noqa: E402 - written by the build

check_torch(torch.__version__, TORCH_VERSION)
torch.ops.load_library(str(_LIBRARY))
ops = torch.ops.bigbatch


@torch.library.register_fake("bigbatch::step")
def _step_fake(handle, params, lrs):  # noqa: ARG001 - the schema's arguments
    return None


@torch.library.register_fake("bigbatch::step_with")
def _step_with_fake(handle, params, grads, state, fields, owners, lrs):  # noqa: ARG001 - the schema's arguments
    return None


def encode(value):
    """An option's value as ops.cpp reads it: tuples as lists, a non-finite
    float as "inf", "-inf" or "nan" (JSON has no such numbers)."""
    if isinstance(value, torch.Tensor) or (hasattr(value, "item") and hasattr(value, "dtype")):
        value = value.item()  # a 0-dim tensor or a numpy scalar
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def decode(value, like=None):
    """The inverse of encode, for the options ops.cpp writes (a list becomes a
    tuple, as torch.optim's betas are); `like`, the default's value, keeps a
    string option "inf" a string."""
    if isinstance(value, list):
        return tuple(decode(v) for v in value)
    if value in ("inf", "-inf", "nan") and not isinstance(like, str):
        return float(value)
    return value


def dumps(options):
    return json.dumps({k: encode(v) for k, v in options.items()})


def loads(text, like=None):
    like = like or {}
    return {k: decode(v, like.get(k)) for k, v in json.loads(text).items()}
