"""Where raystudy keeps what it builds or downloads; a leaf module that imports nothing of raystudy.

- ``cache()``: demo weights and tensor caches, ``$RAYSTUDY_CACHE`` or ``~/.cache/raystudy``;
- ``data_root()``: datasets, ``$RAYSTUDY_DATA`` or ``<cache>/data``.
Both are read from the environment when called, never at import.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache() -> Path:
    """Demo weights and tensor caches: ``$RAYSTUDY_CACHE`` or ``~/.cache/raystudy``."""
    return Path(os.environ.get("RAYSTUDY_CACHE", Path.home() / ".cache" / "raystudy"))


def data_root() -> Path:
    """Datasets: ``$RAYSTUDY_DATA`` or ``<cache>/data``."""
    return Path(os.environ.get("RAYSTUDY_DATA", cache() / "data"))


def tensor_cache(root: str | os.PathLike | None = None) -> Path:
    """Decoded-image tensor caches (``data_path: cache``) under ``root`` or ``cache()``."""
    return (Path(root) if root else cache()) / "tensors"


# ---------------------------------------------------------------- manifests of built caches
#
# A cache raystudy builds (a local model's weights, a tensor cache) carries a manifest: each
# file's size and SHA-256 and the builder's version. It is checked when the cache is opened, so a
# truncated, zeroed or edited file is found before a trial uses it, and named.


def digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(manifest: str | os.PathLike, files: list[Path], builder: str) -> None:
    """Record ``files`` (their names relative to the manifest's folder), atomically."""
    import json

    m = Path(manifest)
    entries = {str(Path(f).relative_to(m.parent)): {"size": Path(f).stat().st_size, "sha256": digest(f)} for f in files}
    tmp = m.with_name(f".{m.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"builder": builder, "files": entries}, indent=1))
    os.replace(tmp, m)


def manifest_problem(manifest: str | os.PathLike, builder: str) -> str | None:
    """What is wrong with the files ``manifest`` lists (None: they are as built).

    A file whose size, modification time and inode match the last full check is not hashed again
    (a stamp next to the manifest); any rewrite or truncation changes them.
    """
    import json

    m = Path(manifest)
    if not m.is_file():
        return f"{m} is missing"
    try:
        data = json.loads(m.read_text())
        files = data["files"]
    except (ValueError, KeyError, TypeError, OSError):
        return f"{m} is unreadable"
    if data.get("builder") != builder:
        return f"built by {data.get('builder')!r}, not {builder!r}"
    stamp = m.with_name(m.name + ".checked")
    sig = {}
    for name, want in files.items():
        f = m.parent / name
        if not f.is_file():
            return f"{f} is missing"
        st = f.stat()
        if st.st_size != want["size"]:
            return f"{f} has {st.st_size} bytes, {want['size']} when built"
        sig[name] = [st.st_size, st.st_mtime_ns, st.st_ino]
    try:
        if json.loads(stamp.read_text()) == sig:
            return None
    except (OSError, ValueError):
        pass
    for name, want in files.items():
        if digest(m.parent / name) != want["sha256"]:
            return f"{m.parent / name} does not match its checksum"
    try:
        tmp = stamp.with_name(f".{stamp.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(sig))
        os.replace(tmp, stamp)
    except OSError:
        pass  # a read-only cache is checked in full each time
    return None
