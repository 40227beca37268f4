"""Renderers: each takes analysed data and returns text; none prints."""

from .text import render_text

__all__ = ["render_text"]
