"""The live page's files (views/ui): complete, offline, and nothing else served.

The real-browser check is tests/server/test_ui.py; this one reads the shipped files only.
"""

from __future__ import annotations

import re

import pytest

from sglang_ctxprof.views import ui


def test_every_file_the_page_loads_is_shipped_and_local():
    html = ui.read("index.html").decode()
    refs = [r for r in re.findall(r'(?:src|href)="([^"]+)"', html) if r != "data:,"]  # data:, = no favicon fetch
    assert refs, html
    for ref in refs:
        assert not re.match(r"^(https?:)?//", ref), ref  # no CDN: the page works offline
        assert ref.startswith("ui/") and ref[3:] in ui.FILES, ref
    for name in ui.FILES:
        assert len(ui.read(name)) > 500, name
    assert b"MIT License" in ui.read("LICENSE.uPlot")
    assert ui.read("uPlot.iife.min.js").startswith(b"/*! https://github.com/leeoniya/uPlot (v1.6.32) */")


def test_only_the_listed_files_are_served():
    for bad in ("../http.py", "SOURCES.md", "app.js.map", ""):
        with pytest.raises(KeyError):
            ui.read(bad)


def test_the_page_reads_only_the_profile_routes():
    js = ui.read("app.js").decode()
    paths = set(re.findall(r'getJSON\((?:"|`)([^"`$?]*)', js))
    assert paths <= {"", "/status", "/requests", "/requests/", "/diagnosis"}, paths
    assert "innerHTML = " in js and "esc(" in js  # every server value put in HTML is escaped
