"""README.md stays what CI and the package index need: the commands .ci/run marks as README's
are README's own, and every link is absolute (README is also the package's long description,
where a relative link leads nowhere)."""

from __future__ import annotations

import ast
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


def test_readme_user_install_comes_first_and_works_from_a_clone():
    install = README.index("## Install")
    block = re.search(r"```bash\n(.*?)```", README[install:], re.S).group(1)
    # today's route: a clone (nothing is published), then pycudnn's main job on its default
    assert "git clone https://github.com/pycudnn/pycudnn" in block
    assert 'pip install ".[cu12]"' in block
    assert re.search(r"^pycudnn bench\b", block, re.M)
    assert install < README.index("## Quick start") < README.index("## Performance") \
        < README.index("## Development")
    # the index name is given only as what it will be
    published = README.index('pip install "pycudnn-ctypes[cu12]"')
    assert "Once published" in README[published - 200:published]


def test_quick_start_needs_only_what_the_install_brings():
    code = re.search(r"## Quick start\n\n.*?```python\n(.*?)```", README, re.S).group(1)
    imported = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    # numpy is one of pycudnn's own dependencies; CuPy, torch and the rest are not
    assert imported == {"numpy", "pycudnn"}, imported


def test_readme_documentation_links_open_the_published_site():
    site = yaml_site_url()
    docs = [link for link in re.findall(r"\]\(([^)]+)\)", README) if "/docs/" in link
            or link.startswith(site)]
    assert docs, "README links to no documentation page"
    for link in docs:
        assert link.startswith(site), f"{link}: not on the published site {site}"
        page = link[len(site):].strip("/") or "index"
        assert (ROOT / "docs" / f"{page}.md").is_file(), f"{link}: no docs/{page}.md"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^Documentation = "{re.escape(site)}"$', pyproject, re.M)


def yaml_site_url() -> str:
    found = re.search(r"^site_url:\s*(\S+)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert found, "mkdocs.yml sets no site_url"
    return found.group(1)


def test_readme_links_are_absolute():
    links = re.findall(r"\]\(([^)]+)\)", README)
    assert links
    relative = [link for link in links if not re.match(r"https://", link)]
    assert not relative, f"relative links in README.md (broken on the package index): {relative}"


def test_quick_start_is_the_same_in_readme_and_docs_index():
    def quick_start(text: str) -> str:
        found = re.search(r"## Quick start\n\n.*?```python\n(.*?)```", text, re.S)
        assert found, "no Quick start section with a Python block"
        return found.group(1)

    code = quick_start(README)
    assert code == quick_start((ROOT / "docs" / "index.md").read_text())
    assert len([line for line in code.splitlines() if line.strip()]) <= 12
    compile(code, "quick start", "exec")


@pytest.mark.gpu
def test_quick_start_runs_on_a_gpu(capsys):
    """README's quick start as a user runs it (NumPy in, pycudnn's tensors out), checked against
    a float64 NumPy convolution."""
    from reference import conv_backward_data, conv_backward_filter, conv_forward

    code = re.search(r"## Quick start\n\n.*?```python\n(.*?)```", README, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README quick start", "exec"), scope)
    x = scope["x"].numpy().astype("float64")
    w = scope["w"].numpy().astype("float64")
    one = (1, 1)
    ref = conv_forward(x, w, one, one, one, 1)
    y = scope["y"].numpy().astype("float64")
    assert y.shape == ref.shape == (8, 128, 56, 56)
    # TF32 may be allowed by default: float32 inputs, 576-term sums
    assert abs(y - ref).max() <= 2e-2 * abs(ref).max()
    gx = conv_backward_data(ref, w, x.shape, one, one, one, 1)
    gw = conv_backward_filter(x, ref, w.shape, one, one, one, 1)
    for name, want in (("gx", gx), ("gw", gw)):
        got = scope[name].numpy().astype("float64")
        assert got.shape == want.shape
        assert abs(got - want).max() <= 2e-2 * abs(want).max(), name
    assert str((8, 128, 56, 56)) in capsys.readouterr().out
