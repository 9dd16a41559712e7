"""A report section's outputs as data -- its Markdown, tables and figures -- and the one writer.

A section (``analysis.sections``, ``analysis.sections.trust``) computes and returns a ``Section``; nothing
is written until ``write`` puts every section of one folder on disk, so a report that fails
anywhere in its sections leaves no folder behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis import figures, tables


@dataclass(frozen=True)
class Table:
    """NAME.md and NAME.tex of ``shown``, NAME.csv of ``data`` (default: shown); see
    ``tables.write_table``."""

    name: str
    shown: pd.DataFrame
    data: pd.DataFrame | None = None
    index: bool = True
    caption: str | None = None

    def write(self, out: Path) -> list[Path]:
        """Write the three files into ``out``; returns their paths."""
        return tables.write_table(out, self.name, self.shown, self.data, index=self.index, caption=self.caption)


@dataclass(frozen=True)
class Csv:
    """NAME.csv of ``data`` alone, without its index (the runs, the omnibus tests)."""

    name: str
    data: pd.DataFrame

    def write(self, out: Path) -> list[Path]:
        """Write NAME.csv into ``out``; returns its path."""
        path = out / f"{self.name}.csv"
        self.data.to_csv(path, index=False)
        return [path]


@dataclass(frozen=True)
class Figure:
    """A figure under ``figures/NAME``: ``draw(base=path)`` draws it and returns its files (a
    ``functools.partial`` of an ``analysis.figures`` function, all but ``base`` bound)."""

    name: str
    draw: Callable[..., list[Path]]


@dataclass(frozen=True)
class Section:
    """One part of a report: its Markdown (empty: nothing in report.md), tables and figures."""

    markdown: str
    tables: tuple[Table | Csv, ...] = ()
    figures: tuple[Figure, ...] = ()


def section(title: str, body: str, tables: tuple = (), figures: tuple = ()) -> Section:
    """A ``## title`` section of ``body`` with its tables and figures."""
    return Section(f"## {title}\n\n{body.rstrip()}\n", tuple(tables), tuple(figures))


def text(sections: list[Section]) -> str:
    """The report.md of ``sections``: their Markdown, one after another."""
    return "\n".join(s.markdown for s in sections if s.markdown)


def write(
    out_dir: str | os.PathLike, sections: list[Section], draw: bool = True, markdown: str | None = None
) -> list[Path]:
    """Write every table and (``draw`` on) figure of ``sections`` into ``out_dir``, then its
    report.md (``markdown``, default: the sections' text). Returns the files in order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = figures.Outputs(draw)
    for s in sections:
        for t in s.tables:
            files += t.write(out)
        for f in s.figures:
            files.add(f.draw, base=out / "figures" / f.name)
    report = out / "report.md"
    report.write_text(text(sections) if markdown is None else markdown)
    files.append(report)
    return list(files)


__all__ = ["Table", "Csv", "Figure", "Section", "section", "text", "write"]
