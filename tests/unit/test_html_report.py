"""`--out DIR` writes report.html: one page that needs nothing else (plots as data: URIs, no
address it could load), every value escaped, the rows that do not fit marked; a real browser
(headless Chromium) loads it from the file without a console error, renders the table and every
image, and sorts the table by a click on a header."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from shardsim.cli import main
from shardsim.report.html_page import report_html
from shardsim.sweep.output import MANIFEST
from shardsim.sweep.recommendation import recommend

SWEEP = ["sweep", "--workload", "tiny-gpt", "--topology", "g4dn.12xlarge", "--nodes", "1,2", "--strategies",
         "ddp,zero", "--tp", "1", "--workers", "1", "--no-progress"]  # fmt: skip
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip

# Run in the page before its own script: records errors (uncaught, console.error, a blocked
# load), then after load what rendered, and the rate column before and after a click on its header.
PROBE = """<script>
const errors = [];
addEventListener("error", (e) => errors.push("error: " + (e.message || e.target.outerHTML.slice(0, 80))), true);
addEventListener("securitypolicyviolation", (e) => errors.push("blocked: " + e.blockedURI));
const consoleError = console.error;
console.error = (...a) => { errors.push("console: " + a.join(" ")); consoleError(...a); };
addEventListener("load", () => {
  const size = (el) => { const r = el.getBoundingClientRect(); return [r.width, r.height]; };
  const table = document.querySelector("table.sortable");
  const col = [...table.tHead.rows[0].cells].findIndex((th) => th.textContent === "tok/s/GPU");
  const column = () => [...table.tBodies[0].rows].map((r) => r.cells[col].textContent);
  const before = column();
  table.tHead.rows[0].cells[col].click();
  const up = column();
  table.tHead.rows[0].cells[col].click();
  const pre = document.createElement("pre");
  pre.id = "status";
  pre.textContent = JSON.stringify({
    errors,
    images: [...document.images].map((i) => [i.alt, i.naturalWidth, i.naturalHeight, ...size(i)]),
    tables: [...document.querySelectorAll("table")].map((t) => [t.tBodies[0].rows.length, ...size(t)]),
    before, up, down: column(),
  });
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """A text model's sweep over two sizes, written with --out."""
    folder = tmp_path_factory.mktemp("sweep") / "out"
    assert main([*SWEEP, "--out", str(folder)]) == 0
    return folder


def test_the_report_is_written_and_listed_in_the_manifest(out):
    assert "report.html" in json.loads((out / MANIFEST).read_text())["files"]


def test_the_page_needs_nothing_else_and_holds_every_plot(out):
    page = (out / "report.html").read_text()
    sources = re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", page)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "default-src 'none'" in page  # the browser is told to load nothing else
    pngs = sorted(p.stem.replace("_", " ") for p in out.glob("*.png"))
    assert sorted(re.findall(r'<img src="data:[^"]*" alt="([^"]*)"', page)) == pngs
    assert "scaling" in pngs  # two sizes: the scaling plot, and the per-cluster and scaling tables
    assert "Per cluster" in page and "scaling efficiency on g4dn.12xlarge" in page
    assert "tok/s/GPU" in page and "$/M tokens" in page


def test_every_value_is_escaped_and_the_rows_that_do_not_fit_are_marked(out):
    df = pd.read_parquet(out / "sweep.parquet")
    rec = json.loads((out / "recommended.json").read_text())
    evil = '<img src=x onerror="alert(1)">&'
    df.loc[df.index[-1], ["label", "fits"]] = [evil, False]
    df.loc[df.index[-1], "memory_required_gib"] = 99.0
    page = report_html(df, rec, [], command=f"shardsim sweep --out '{evil}'")
    assert evil not in page and "onerror" not in page.replace("onerror=&quot;", "")
    assert page.count("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;") == 2  # the command and the row
    assert page.count("<tr class=unfit>") == 1
    assert re.search(r"<td class=['\"]?fig mark['\"]?>99\.00 GiB &gt; [^<]* ✗</td>", page)


def test_a_sweep_where_nothing_fits_has_a_page_that_says_so(out):
    df = pd.read_parquet(out / "sweep.parquet").assign(fits=False)
    page = report_html(df, recommend(df), [])
    assert "No recommendation:" in page and page.count("<tr class=unfit>") == len(df)


def _chromium() -> str:
    path = shutil.which("chromium") or (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if path is None:
        why = f"no Chromium ({CHROMIUM}): `apt-get install -y chromium` installs it (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def _figure(text: str) -> float:
    return float(text.replace(",", ""))


@pytest.mark.serial
def test_a_browser_renders_the_page_without_errors_and_sorts_its_table(out, tmp_path):
    chromium = _chromium()
    page = (out / "report.html").read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    run = [chromium, *FLAGS, *profile, "--virtual-time-budget=10000"]
    dom = subprocess.run([*run, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=120)
    status = re.search(r'<pre id="status">(.*?)</pre>', dom.stdout, re.S)
    assert status, f"no status in the page: {dom.stderr[-2000:]}"
    got = json.loads(status.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">"))
    assert got["errors"] == []
    df = pd.read_parquet(out / "sweep.parquet")
    assert len(got["images"]) == len(list(out.glob("*.png"))) >= 4
    for alt, width, height, shown_w, shown_h in got["images"]:
        assert width > 0 and height > 0 and shown_w > 0 and shown_h > 0, alt
    rows, width, height = got["tables"][-1]  # the ranked table, every row
    assert rows == len(df) and width > 0 and height > 0
    rates = sorted(_figure(v) for v in got["before"])
    assert [_figure(v) for v in got["up"]] == rates and [_figure(v) for v in got["down"]] == rates[::-1]
    shot = tmp_path / "report.png"
    subprocess.run([*run, "--window-size=1280,1600", f"--screenshot={shot}", (out / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    assert _png_size(shot) == (1280, 1600) and shot.stat().st_size > 20_000  # more than a blank page


@pytest.mark.parametrize("ci", ["1", None])
def test_without_chromium_the_browser_test_fails_in_ci_and_skips_elsewhere(monkeypatch, ci):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match="no Chromium"):
        _chromium()
