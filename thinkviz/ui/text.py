"""Text from users, models, recordings and files, made safe for Markdown components and toasts.

Gradio renders Markdown (and toast messages) as HTML, so any ``<tag>`` in such text would
become markup: ``<think>`` would vanish, ``<img onerror=…>`` would be an element.  Two
levels: :func:`no_markup` keeps an author's Markdown formatting (preset notices) and shows
tags as text; :func:`plain_markdown` shows text exactly as written (model names, errors).
"""

from __future__ import annotations

import html
import re

_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+!|~>-])")


def no_markup(text: str) -> str:
    """``text`` with ``&``, ``<`` and ``>`` escaped: Markdown formatting stays, HTML shows as text."""
    return html.escape(text, quote=False)


def plain_markdown(text: str) -> str:
    """``text`` on one line, neither HTML nor Markdown: shown in a Markdown component as written."""
    one_line = " ".join(str(text).split())
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", no_markup(one_line))
