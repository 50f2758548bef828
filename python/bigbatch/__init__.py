"""bigbatch for PyTorch (docs/python.md): the fused large-batch optimizers
(bigbatch.optim.LAMB, LARS, LARC, NovoGrad, Lion, Muon, AdamWScheduleFree,
SGDScheduleFree, SOAP, Shampoo) as torch.optim
optimizers over torch custom operators, and the sweep runner
(bigbatch.sweep, bigbatch.plot, bigbatch.datasets), whose trials train here on
any nn.Module and DataLoader or in the C++ runner."""
from . import _ops  # noqa: F401 - loads the operator library
from . import optim
from .runner import datasets, plot, sweep

__version__ = "0.1.0"
__all__ = ["optim", "sweep", "plot", "datasets"]
