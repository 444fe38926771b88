"""The package's shape (tools/check_structure.py): no import cycle between modules or layers, no
function over 60 lines, no module over 400 lines; and the checker itself finds what it should."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_structure  # noqa: E402


def test_the_package_has_no_cycles_and_no_oversized_functions_or_modules(capsys):
    assert check_structure.main([]) == 0, capsys.readouterr().out


def test_the_checker_finds_cycles_long_functions_and_long_modules(tmp_path, capsys):
    package = tmp_path / "pkg"
    (package / "a").mkdir(parents=True)
    (package / "b").mkdir()
    for folder in (package, package / "a", package / "b"):
        (folder / "__init__.py").write_text("")
    (package / "a" / "x.py").write_text("from pkg.b import y\n")
    (package / "b" / "y.py").write_text("import pkg.a.z\n")
    (package / "a" / "z.py").write_text("def f():\n" + "    pass\n" * 70 + "\n" * 340)
    assert check_structure.main(["--package", str(package)]) == 1
    out = capsys.readouterr().out
    assert "import cycle among 2 layers: pkg.a -> pkg.b -> pkg.a" in out
    assert "function f has 71 lines" in out and "z.py: 411 lines" in out
