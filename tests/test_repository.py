"""The repository as a reader finds it: no module of the package over 600 lines, and only files it has cited:
every `something.md` named in the package, the docs, the README, the benchmarks, the config example and the
jobs is a file of the repository (beside the citing file, under docs/, or from the repository's root)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITING = ("vastctl", "docs", "bench", "jobs")
CITED = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b")


def citing_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "config.example.yaml", ROOT / "pyproject.toml"]
    for folder in CITING:
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file()
                  and p.suffix in (".py", ".md", ".sh", ".yaml", ".service", ".timer", "")]
    return [p for p in files if p.exists()]


def missing_citations(path: Path, text: str) -> list[str]:
    return [name for name in CITED.findall(text)
            if not any((base / name).is_file() for base in (path.parent, ROOT / "docs", ROOT))]


def test_every_cited_markdown_file_is_in_the_repository():
    missing = [f"{path.relative_to(ROOT)}: {name}" for path in citing_files()
               for name in missing_citations(path, path.read_text(errors="replace"))]
    assert missing == [], "cited but not in the repository (put the facts in docs/):\n" + "\n".join(missing)


def test_the_scan_finds_a_file_the_repository_does_not_have():
    assert missing_citations(ROOT / "vastctl" / "observe.py", "see domain.md §5 and docs/cost.md") == ["domain.md"]


def test_no_module_of_the_package_is_over_600_lines():
    """A module holds one concern: past 600 lines it is cut by concern (docs/architecture.md names the modules)."""
    long = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / "vastctl").rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) > 600}
    assert long == {}
