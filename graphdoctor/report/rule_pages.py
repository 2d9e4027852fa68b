"""Write the rule catalogue as Markdown pages into a directory, touching only graphdoctor's own pages.

`graphdoctor rules --output DIR` writes GDxxx.md per rule and index.md, and records them in a
manifest (MANIFEST_NAME). A later run removes only pages the manifest lists that are no longer
rules and unchanged since, and overwrites a page only when the manifest lists it unchanged or its
content is already the page graphdoctor would write; any other file (a user's GDPR.md, a
hand-written or edited index.md) is left alone and the run is refused. Pages are written atomically (graphdoctor.inputs.write_output).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from graphdoctor.errors import InputFileError, UsageError
from graphdoctor.inputs import MAX_TEXT_BYTES, read_json, read_text, write_output

if TYPE_CHECKING:
    from graphdoctor.rules.base import Rule

MANIFEST_NAME = ".graphdoctor-rules.json"
"""The manifest of the pages `rules --output` wrote: {"schema_version": 1, "pages": {name: sha256}}."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _read_manifest(directory: Path) -> dict[str, str]:
    path = directory / MANIFEST_NAME
    if not path.exists():
        return {}
    document = read_json(path, "rules manifest", max_bytes=MAX_TEXT_BYTES)
    pages = document.get("pages") if isinstance(document, dict) else None
    if not isinstance(pages, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in pages.items()):
        raise InputFileError(f"rules manifest {path}: expected {{'pages': {{name: sha256}}}}; remove it to start over")
    # only plain page names: a manifest never makes graphdoctor touch a path outside DIR
    return {name: digest for name, digest in pages.items() if name == os.path.basename(name) and name.endswith(".md")}


def _owned(path: Path, text: str, manifest: dict[str, str]) -> bool:
    """May graphdoctor write `text` to `path`? Absent, identical already, or written by graphdoctor
    (listed in the manifest) and unchanged since; a page the user edited is theirs."""
    if not path.exists():
        return True
    try:
        current = read_text(path, "page")
    except InputFileError:
        return False
    return current == text or manifest.get(path.name) == _digest(current)


def write_rule_pages(directory: Path, rules: Sequence[Rule]) -> list[Path]:
    """Write one page per rule plus index.md into `directory` and update the manifest.

    Returns:
        The pages written (not the manifest).

    Raises:
        UsageError: a page would overwrite a file graphdoctor did not write, or DIR cannot be written.
        InputFileError: the manifest is unreadable.
    """
    from graphdoctor.report.findings import rule_markdown, rules_index_markdown

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--output: cannot create {directory} ({exc.strerror or exc})") from None
    manifest = _read_manifest(directory)
    pages = {f"{rule.code}.md": rule_markdown(rule) for rule in rules}
    pages["index.md"] = rules_index_markdown(rules)
    foreign = sorted(name for name, text in pages.items() if not _owned(directory / name, text, manifest))
    if foreign:
        raise UsageError(f"--output: {directory / foreign[0]} exists and was not written by graphdoctor; "
                         "refusing to overwrite it (move it away, or choose another directory)")
    for name in sorted(set(manifest) - set(pages)):
        stale = directory / name
        try:
            if stale.is_file() and _digest(read_text(stale, "page")) == manifest[name]:
                stale.unlink()
        except (OSError, InputFileError):
            pass  # edited since we wrote it, or unreadable: it is the user's now, left alone
    written = []
    for name, text in pages.items():
        write_output(directory / name, text, flag="--output")
        written.append(directory / name)
    document = {"schema_version": 1, "pages": {name: _digest(text) for name, text in sorted(pages.items())}}
    write_output(directory / MANIFEST_NAME, json.dumps(document, indent=2) + "\n", flag="--output")
    return written


__all__ = ["MANIFEST_NAME", "write_rule_pages"]
