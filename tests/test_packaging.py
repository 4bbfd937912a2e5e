"""What `pip install pytest-mla` gives a user: the engine matrices ship inside the wheel, and
`pytest-mla init ENGINE` copies one into a repo (issue 23.7)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_mla.cli import main
from pytest_mla.core.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("reference", "sglang", "vllm")


@pytest.mark.parametrize("engine", ENGINES)
def test_init_copies_the_shipped_matrix_into_matrix_folder(tmp_path, monkeypatch, capsys, engine):
    monkeypatch.chdir(tmp_path)
    assert main(["init", engine]) == 0
    written = tmp_path / "matrix" / f"{engine}.toml"
    assert written.read_bytes() == (ROOT / "matrix" / f"{engine}.toml").read_bytes()
    out = capsys.readouterr().out
    assert f"wrote matrix/{engine}.toml" in out and f"pytest --mla-matrix=matrix/{engine}.toml" in out
    assert load_matrix(written).engine_name == engine


def test_init_never_overwrites_without_force_and_names_what_it_ships(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "matrix").mkdir()
    mine = tmp_path / "matrix" / "sglang.toml"
    mine.write_text("# my edits\n")
    assert main(["init", "sglang"]) == 2
    assert "matrix/sglang.toml exists; pass --force" in capsys.readouterr().err
    assert mine.read_text() == "# my edits\n"
    assert main(["init", "sglang", "--force"]) == 0
    assert mine.read_bytes() == (ROOT / "matrix" / "sglang.toml").read_bytes()
    (tmp_path / "ci").mkdir()
    assert main(["init", "vllm", "-o", "ci"]) == 0 and (tmp_path / "ci" / "vllm.toml").is_file()
    assert main(["init", "trtllm"]) == 2
    assert "no matrix shipped for 'trtllm' (shipped: reference, sglang, vllm)" in capsys.readouterr().err


def test_the_wheel_carries_the_matrices_and_the_license(tmp_path):
    # Built from a copy of what the wheel is made of: the checkout's own build/ folder may hold stale files.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("pytest_mla", "matrix"):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = tmp_path.glob("pytest_mla-*.whl")
    with zipfile.ZipFile(wheel) as z:
        for engine in ENGINES:
            assert z.read(f"pytest_mla/matrices/{engine}.toml") == (ROOT / "matrix" / f"{engine}.toml").read_bytes()
        # what `pytest-mla repro` writes scripts from, and the model configs it inlines
        assert z.read("pytest_mla/report/repro/sglang_backend.py.tmpl") == \
            (ROOT / "pytest_mla/report/repro/sglang_backend.py.tmpl").read_bytes()
        assert "pytest_mla/engines/model_configs/deepseek-v3/config.json" in z.namelist()
        assert "pytest_mla/engines/model_configs/mistral-small-4/params.json" in z.namelist()
        licenses = [n for n in z.namelist() if n.endswith("LICENSE") and ".dist-info/" in n]
        assert licenses and z.read(licenses[0]) == (ROOT / "LICENSE").read_bytes()


def test_the_license_is_the_apache_2_text_the_package_declares():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
