"""The one place control characters from data files are made harmless before reaching a terminal.

Frame names, file names, phase tags and run-file values are data: an ESC, BEL or OSC sequence in
them must print as visible text (`\\x1b]0;...`), never act on the user's terminal. Every text
renderer in graphdoctor.report and every one-line error of the CLI passes through escape_control.
"""

from __future__ import annotations


def escape_control(text: str) -> str:
    """Replace non-printable characters (C0/C1 controls, DEL, bidi and other format characters) by
    their backslash escapes; newlines and tabs stay, so tables keep their layout."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in "\n\t" else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def one_line(text: str, width: int) -> str:
    """`text` escaped (escape_control), its white space folded to single spaces, cut to `width` characters
    with `...` (the notes of advise's table and of the plans)."""
    text = escape_control(" ".join(text.split()))
    return text if len(text) <= width else text[:width - 3] + "..."


__all__ = ["escape_control", "one_line"]
