"""README.md stays what CI and the package index need: the commands .ci/run marks as README's
are README's own, and every link is absolute (README is also the package's long description,
where a relative link leads nowhere)."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_commands_readme_gives():
    ci = ROOT / ".ci" / "run"
    if not ci.is_file():
        pytest.skip("no .ci/run here (a source distribution carries no CI script)")
    lines = ci.read_text().splitlines()
    marked = [(line.strip(), lines[i + 1].strip()) for i, line in enumerate(lines)
              if line.strip().startswith("# --- README: ")]
    assert {m for m, _ in marked} >= {"# --- README: install ---", "# --- README: test ---",
                                      "# --- README: type check ---", "# --- README: docs ---"}
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    commands = {line.split("  #")[0].strip() for line in blocks.splitlines()}
    for marker, command in marked:
        command = command.replace("pip install -q ", "pip install ")  # CI installs quietly
        assert command in commands, f"{marker}: README.md has no command {command!r}"


def test_readme_user_install_comes_first():
    install = README.index('pip install "pycudnn-ctypes[cu12]"')
    assert install < README.index("## Quick start") < README.index("## Performance") \
        < README.index("## Development")


def test_readme_links_are_absolute():
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links
    relative = [link for link in links if not re.match(r"https://", link)]
    assert not relative, f"relative links in README.md (broken on the package index): {relative}"


def test_quick_start_is_the_same_in_readme_and_docs_index():
    def quick_start(text: str) -> str:
        found = re.search(r"## Quick start\n\n```python\n(.*?)```", text, re.S)
        assert found, "no Quick start section with a Python block"
        return found.group(1)

    code = quick_start(README)
    assert code == quick_start((ROOT / "docs" / "index.md").read_text())
    assert len([line for line in code.splitlines() if line.strip()]) <= 12
    compile(code, "quick start", "exec")


@pytest.mark.gpu
def test_quick_start_runs_on_a_gpu():
    """README's quick start as a user runs it (CuPy arrays in), checked against PyTorch's CPU
    convolution in float64."""
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", README, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README quick start", "exec"), scope)
    x = torch.from_numpy(cp.asnumpy(scope["x"]).astype("float64"))
    w = torch.from_numpy(cp.asnumpy(scope["w"]).astype("float64"))
    ref = torch.nn.functional.conv2d(x, w, padding=1).numpy()
    y = cp.asnumpy(cp.asarray(scope["y"])).astype("float64")
    assert y.shape == ref.shape == (8, 128, 56, 56)
    # TF32 may be allowed by default: float32 inputs, 576-term sums
    assert abs(y - ref).max() <= 2e-2 * abs(ref).max()
    assert tuple(scope["gx"].shape) == (8, 64, 56, 56) and tuple(scope["gw"].shape) == (128, 64, 3, 3)
