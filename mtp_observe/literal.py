"""Literal text: user-controlled strings shown exactly as they are, never interpreted.

Session ids, file names, tool names, decoded token text and tensor names come from files the
user (or whoever wrote the logs) controls. Printed as they are, they could recolour or clear the
terminal (ANSI escapes), move the cursor (\\r, \\b), reverse the text (bidi overrides), break a
one-line message or a table row (a newline), or be read as rich markup (`[red]`, `:smile:`) or
Markdown (`|`, `*`, `<b>`). This module is the one mechanism that makes them inert (STYLE rule 9):

    visible(text)            control characters as Python-style escapes: ESC -> \\x1b, newline -> \\n,
                             tab -> \\t, DEL -> \\x7f, C1 controls, U+2028/2029, bidi controls and lone
                             surrogates (undecodable bytes of a file name) -> \\uXXXX; with
                             newlines=True a newline and a tab stay (multi-line decoded text)
    literal(text, style)     a rich Text of visible(text): rich never parses markup in a Text
    markdown_literal(text)   visible(text) with every character Markdown (GitHub's included) would
                             format backslash-escaped

A backslash is not escaped by `visible`, so escaping twice changes nothing and a message built
from an already escaped message stays as it was. Worked example:
    visible("a\\x1b[31mb\\nc") == "a\\\\x1b[31mb\\\\nc"   (printed: a\\x1b[31mb\\nc)
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; line/paragraph separators; bidi embeddings, overrides and isolates,
# the directional marks; lone surrogates (what Python makes of undecodable bytes in file names).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\ud800-\udfff]")
_CONTROL_KEEPING_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    c = match.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def visible(text, *, newlines: bool = False) -> str:
    """str(text) with every control character shown as an escape (newline and tab kept with newlines=True)."""
    return (_CONTROL_KEEPING_LINES if newlines else _CONTROL).sub(_escape, str(text))


def literal(text, style=None, *, newlines: bool = False):
    """A rich Text that prints visible(text) exactly: no markup, no emoji codes, no control characters."""
    from rich.text import Text

    return Text(visible(text, newlines=newlines), style=style or "")


# Backslash first, then every ASCII punctuation mark GitHub-flavoured Markdown gives a meaning inline:
# emphasis, code, links and images, HTML and entities, tables, strikethrough, math, headings, emoji
# shortcodes and mentions. CommonMark lets any ASCII punctuation be backslash-escaped.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&$#:@!])")


def markdown_literal(text) -> str:
    """visible(text), with what Markdown would interpret escaped so that it renders as written."""
    return _MARKDOWN.sub(r"\\\1", visible(text))


def prose(console, text: str, style=None) -> None:
    """A line of (possibly user-controlled) prose, printed literally: on a terminal wrapped at word boundaries
    (never mid-word) to its width; piped or into a file kept as one line (a log greps whole lines)."""
    console.print(literal(text, style), soft_wrap=not console.is_terminal)
