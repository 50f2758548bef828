"""examples/python/mnist.py, a plain PyTorch training script whose optimizer
is bigbatch.optim.LAMB, trains: one epoch on 6,000 Fashion-MNIST images
(Debian's dataset-fashion-mnist, which scripts/packages.sh installs) brings
2,000 test images from chance (10%) to above 70% (79% here)."""
import os
import pathlib
import re
import subprocess
import sys

from conftest import reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
IDX = os.environ.get("BIGBATCH_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def test_the_mnist_example_trains_with_bigbatchs_lamb(tmp_path):
    reference("torchvision")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "mnist.py"), "--dataset", "fashion",
                           "--idx", IDX, "--data", str(tmp_path), "--epochs", "1", "--train-size", "6000",
                           "--test-size", "2000", "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    accuracy = float(re.search(r"accuracy \d+/2000 \(([\d.]+)%\)", proc.stdout).group(1))
    assert accuracy > 70, proc.stdout
