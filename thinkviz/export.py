"""Export and import of recordings and figures, as files a browser can download or upload.

A recording downloads as one ``.zip`` holding the ``NAME.json`` + ``NAME.npz`` pair that
:meth:`~thinkviz.core.events.RunRecord.save` writes; it uploads back either as that zip or as
the two files.  Figures download as one self-contained HTML page (plotly.js inlined, so it
opens offline in a classroom).
"""

from __future__ import annotations

import html
import lzma
import re
import tempfile
import zipfile
import zlib
from pathlib import Path
from collections.abc import Mapping, Sequence

from .core.events import MAX_RECORDING_BYTES, RecordingError, RunRecord


def record_stem(record: RunRecord) -> str:
    """A file-name stem naming the policy and budget, e.g. ``thinkviz-h2o-b256``."""
    raw = f"thinkviz-{record.meta.get('policy', 'run')}-b{record.meta.get('budget', '')}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw)


def export_recording(record: RunRecord, folder: str | Path | None = None) -> Path:
    """Save ``record`` and zip its JSON + NPZ into ``folder`` (a fresh temp dir by default)."""
    out = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="thinkviz-export-"))
    stem = record_stem(record)
    json_path, npz_path = record.save(out / stem)
    archive = out / f"{stem}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:  # the npz is compressed already
        zf.write(json_path, json_path.name)
        zf.write(npz_path, npz_path.name)
    return archive


def import_recording(paths: Sequence[str | Path]) -> RunRecord:
    """Load a recording from an exported ``.zip`` or from its ``.json`` + ``.npz`` pair.

    Raises :class:`~thinkviz.core.events.RecordingError` with a message fit for the user.
    """
    paths = [Path(p) for p in paths if p]
    if not paths:
        raise RecordingError("choose a recording: the exported .zip, or its .json and .npz files")
    if len(paths) == 1 and paths[0].suffix.lower() == ".zip":
        return _from_zip(paths[0])
    by_suffix = {p.suffix.lower(): p for p in paths}
    if set(by_suffix) != {".json", ".npz"} or len(paths) != 2:
        names = ", ".join(p.name for p in paths)
        raise RecordingError(f"expected one .zip or a .json and an .npz file, got: {names}")
    folder = Path(tempfile.mkdtemp(prefix="thinkviz-import-"))
    for suffix, source in by_suffix.items():
        (folder / f"recording{suffix}").write_bytes(source.read_bytes())
    return RunRecord.load(folder / "recording")


def _from_zip(archive: Path) -> RunRecord:
    try:
        with zipfile.ZipFile(archive) as zf:
            members = {Path(info.filename).suffix.lower(): info for info in zf.infolist() if not info.is_dir()}
            if set(members) != {".json", ".npz"} or len(zf.infolist()) != 2:
                raise RecordingError(f"{archive.name} should hold exactly one .json and one .npz file")
            folder = Path(tempfile.mkdtemp(prefix="thinkviz-import-"))
            for suffix, info in members.items():
                if info.file_size > MAX_RECORDING_BYTES:
                    raise RecordingError(f"{info.filename} is larger than {MAX_RECORDING_BYTES // 2**20} MiB")
                (folder / f"recording{suffix}").write_bytes(_read_member(zf, info, archive.name))
    except zipfile.BadZipFile as exc:
        raise RecordingError(f"{archive.name} is not a zip archive ({exc})") from None
    return RunRecord.load(folder / "recording")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, archive_name: str) -> bytes:
    """The member's bytes; a damaged stream (deflate, bzip2 or LZMA) or an unknown method is a RecordingError."""
    try:
        return zf.read(info)
    except (zlib.error, lzma.LZMAError, OSError, EOFError, NotImplementedError) as exc:
        raise RecordingError(f"{archive_name} is damaged or uses an unsupported compression ({exc})") from None


def export_figures(
    figures: Mapping[str, object], folder: str | Path | None = None, stem: str = "thinkviz-figures"
) -> Path:
    """Write plotly figures (``title -> Figure``) into one offline HTML page; return its path."""
    out = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="thinkviz-export-"))
    out.mkdir(parents=True, exist_ok=True)
    parts, first = [], True
    for title, figure in figures.items():
        if figure is None:
            continue
        body = figure.to_html(full_html=False, include_plotlyjs=first)
        parts.append(f"<section><h2>{html.escape(title)}</h2>{body}</section>")
        first = False
    if not parts:
        raise ValueError("there is no figure to export yet")
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>ThinkViz figures</title>"
        "<style>body{font-family:sans-serif;margin:2em}section{margin-bottom:2em}</style></head><body>"
        + "".join(parts)
        + "</body></html>"
    )
    path = out / f"{stem}.html"
    path.write_text(page, encoding="utf-8")
    return path
