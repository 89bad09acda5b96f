"""One version: pyproject.toml's, which the package reports and the chart and image must carry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from kvpool_client.core.version import package_version

ROOT = Path(__file__).resolve().parents[2]


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_installed_package_reports_the_project_version() -> None:
    assert package_version() == project_version(), (
        f"installed kvpool says {package_version()}, pyproject.toml {project_version()}: reinstall (deploy/dev.sh)"
    )


def test_the_chart_and_the_rendered_manifests_carry_the_project_version() -> None:
    chart = yaml.safe_load((ROOT / "helm/kvpool/Chart.yaml").read_text())
    assert chart["appVersion"] == project_version(), f"Chart.yaml appVersion {chart['appVersion']}"
    images = re.findall(r"image: kvpool:(\S+)", (ROOT / "deploy/k8s/kvpool.yaml").read_text())
    assert images and set(images) == {project_version()}, f"deploy/k8s images: {images}"


def test_the_image_build_and_the_readme_name_the_project_version() -> None:
    build = (ROOT / "deploy/image/build.sh").read_text()
    assert "sed -n 's/^version = " in build, "deploy/image/build.sh no longer reads pyproject.toml's version"
    tags = set(re.findall(r"kvpool:(\d+\.\d+\.\d+)", (ROOT / "README.md").read_text()))
    assert tags <= {project_version()}, f"README names image tags {tags}"
