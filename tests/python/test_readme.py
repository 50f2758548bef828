"""The README's PyTorch example (between <!-- python-example:begin --> and
<!-- python-example:end -->) runs as it is and learns its task."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_readme_example_runs_and_learns():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- python-example:begin -->\n```python\n(.*?)```\n<!-- python-example:end -->", text, re.S)
    assert block, "no python example in README.md"
    proc = subprocess.run([sys.executable, "-c", block.group(1)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loss, skipped = re.search(r"final loss ([\d.]+), skipped steps (\d+)", proc.stdout).groups()
    assert float(loss) < 0.2 and skipped == "0", proc.stdout  # from ln 2 = 0.69 at the start
