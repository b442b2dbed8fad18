"""The documentation site builds strictly (every link and anchor checked) with the theme
mkdocs.yml names, and the built pages load nothing from another host (no web fonts, no CDN
scripts or stylesheets: code is highlighted at build time)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_mkdocs_config_is_offline_material():
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^theme:\n  name: material$", config, re.M)
    assert re.search(r"^  font: false$", config, re.M), "web fonts come from a CDN"
    assert "extra_javascript" not in config
    for sheet in re.findall(r"^extra_css:\n((?:  - .*\n)+)", config, re.M)[0].split("- ")[1:]:
        assert (ROOT / "docs" / sheet.strip()).is_file(), f"extra_css {sheet.strip()} is not local"
    for section in ("Getting started", "Guides", "Reference", "Performance"):
        assert re.search(rf"^  - {section}:$", config, re.M), section


@pytest.mark.slow
def test_site_builds_strictly_and_loads_nothing_remote(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"could not import '{module}' (not installed)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    remote = re.compile(r"""<(?:script|link)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//[^>]*>""")
    pages = sorted((tmp_path / "site").rglob("*.html"))
    assert len(pages) > 10
    site_url = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M).group(1)
    for page in pages:
        text = page.read_text()
        # rel=canonical names the page's published address for search engines; nothing loads it
        canonical = re.findall(r'<link rel="canonical" href="([^"]+)"', text)
        assert all(url.startswith(site_url) for url in canonical), canonical
        found = [tag for tag in remote.findall(text) if 'rel="canonical"' not in tag]
        assert not found, f"{page.name} loads {found}"
        # Material's repository widget asks the code host's API on every page view
        assert "md-source" not in text, f"{page.name} has the repository widget"
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("pycudnn.convolution", "pycudnn.Tensor", "pycudnn.flags", "pycudnn.NoDeviceError"):
        assert f'id="{name}"' in api, f"the API reference has no entry {name}"
    assert 'id="pycudnn.api.conv.convolution"' not in api
