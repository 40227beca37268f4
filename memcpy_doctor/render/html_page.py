"""The HTML report's stylesheet and legend: inline, so that the page needs nothing but itself
(no network, no font of its own: the reader's system fonts)."""

from __future__ import annotations

CSS = """
:root { color-scheme: light; --fg: #1d2433; --muted: #5b6475; --line: #d8dde6;
  --soft: #f5f7fa; --host: #4a78c2; --kernel: #3c9a5f; --xfer: #e08a1e; --sync: #c0392b;
  --idle: #f4c7c3; --focus: #1a73e8; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 16px 20px 40px; }
h1 { font-size: 1.45rem; margin: .2em 0 .1em; }
h2 { font-size: 1.25rem; margin-top: 1.8em; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.08rem; margin: 1.6em 0 .5em; }
h4 { font-size: 1rem; margin: 0 0 .3em; }
p { margin: .4em 0; }
h4, p, figcaption, header code { overflow-wrap: anywhere; }
a { color: #0b57d0; }
:focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
.files, .meta, .note, .facts, .none, .left-out { color: var(--muted); }
.left-out { font-weight: 600; color: #8a4b00; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr));
  gap: 10px; margin: 12px 0; padding: 0; }
.figures div { background: var(--soft); border: 1px solid var(--line); border-radius: 6px;
  padding: 8px 12px; }
.figures dt { font-size: .78rem; color: var(--muted); text-transform: uppercase;
  letter-spacing: .03em; }
.figures dd { margin: 0; font-size: 1.3rem; font-weight: 650; }
.figures dd small { display: block; font-size: .8rem; font-weight: 400; color: var(--muted); }
.figures dd.where { font-size: .95rem; font-weight: 500; }
.scroll { overflow-x: auto; max-width: 100%; border: 1px solid var(--line);
  border-radius: 6px; }
table { border-collapse: collapse; min-width: 100%; font-size: .88rem; }
th, td { text-align: left; vertical-align: top; padding: 6px 8px;
  border-bottom: 1px solid var(--line); }
thead th { background: var(--soft); white-space: nowrap; }
td.num { text-align: right; white-space: nowrap; }
tbody tr:target { background: #fff6d6; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono",
  monospace; font-size: .86em; }
code.src { display: block; color: var(--muted); white-space: pre-wrap;
  overflow-wrap: anywhere; }
td.where { min-width: 14em; max-width: 28em; }
.site { overflow-wrap: anywhere; }
.from { display: block; font-size: .8em; color: var(--muted); margin-top: 3px; }
.share, .tensor, .thread, .dev, .fn { color: var(--muted); font-size: .9em; }
ol.chain, ol.stack { margin: 0; padding-left: 1.2em; min-width: 16em; }
ol.chain li.copy { color: var(--sync); }
ol.chain li.copy.this { font-weight: 650; }
ol.chain li + li::marker { content: "→ "; }
ol.chain li:first-child::marker { content: ""; }
summary { cursor: pointer; white-space: nowrap; }
figure { margin: 10px 0 18px; }
figcaption { font-size: .9rem; margin-top: 4px; }
svg.timeline { width: 100%; height: auto; display: block; border: 1px solid var(--line);
  border-radius: 6px; background: #fff; }
svg text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif;
  fill: var(--fg); }
svg text.in { fill: #fff; pointer-events: none; }
svg text.lane { font-weight: 650; }
svg text.tick { fill: var(--muted); text-anchor: middle; }
svg text.label { fill: var(--sync); font-weight: 600; }
svg .span rect { stroke: #fff; stroke-width: .5; }
svg .op rect { fill: var(--host); }
svg .launch rect { fill: #9bb5e0; }
svg .kernel rect { fill: var(--kernel); }
svg .xfer rect { fill: var(--xfer); }
svg .xfer.sync rect { fill: var(--sync); }
svg .folded rect { fill: #8a93a6; }
svg .blocked text.in { fill: #7a3d00; }
svg rect.idle { fill: var(--idle); opacity: .6; }
svg line.axis, svg line.tick { stroke: var(--muted); }
svg .arrow line { stroke-width: 2; }
svg .arrow.sync line { stroke: var(--sync); }
svg .arrow.async line { stroke: #7f8c8d; stroke-dasharray: 4 3; stroke-width: 1.5; }
svg a:focus { outline: none; }
svg a:focus line { stroke-width: 5; }
svg a:focus text { text-decoration: underline; font-weight: 800; }
ul.legend { list-style: none; padding: 0; margin: 6px 0; display: flex; flex-wrap: wrap;
  gap: 4px 16px; font-size: .85rem; color: var(--muted); }
.sw { display: inline-block; width: 14px; height: 10px; margin-right: 5px;
  vertical-align: middle; border-radius: 2px; }
.sw.op { background: var(--host); } .sw.kernel { background: var(--kernel); }
.sw.xfer { background: var(--xfer); } .sw.folded { background: #8a93a6; }
.sw.blocked { background: repeating-linear-gradient(45deg, #d9822b 0 3px, #fde2c8 3px 6px); }
.sw.idle { background: var(--idle); }
.sw.sync { height: 3px; background: var(--sync); } .sw.async { height: 0;
  border-top: 2px dashed #7f8c8d; border-radius: 0; }
ol.suggestions { padding-left: 1.4em; }
li.suggestion { margin-bottom: 1.4em; }
.saving strong { color: #116329; }
.verified { color: #0b57d0; }
pre.diff { background: var(--soft); padding: 8px 0; overflow-x: auto;
  border: 1px solid var(--line); border-radius: 6px; line-height: 1.35; }
pre.diff span { display: block; padding: 0 10px; min-width: max-content; }
.diff .add { background: #e6ffec; color: #116329; }
.diff .del { background: #ffebe9; color: #82071e; }
.diff .hunk { color: #0550ae; background: #eef4ff; }
.diff .file { color: var(--muted); font-weight: 650; }
nav.ranks ul { padding-left: 1.2em; }
footer { margin-top: 3em; font-size: .8rem; color: var(--muted); }
@media (max-width: 600px) {
  body { font-size: 14px; }
  main { padding: 10px; }
  .figures { grid-template-columns: 1fr 1fr; }
  .figures dd { font-size: 1.05rem; }
}
@media print {
  main { max-width: none; padding: 0; }
  .scroll { overflow: visible; border: none; }
  table { font-size: 8.5pt; }
  pre.diff { white-space: pre-wrap; overflow: visible; }
  pre.diff span { min-width: 0; }
  a { color: inherit; text-decoration: none; }
  h2, h3, h4 { break-after: avoid; }
  figure, li.suggestion, tr { break-inside: avoid; }
  details::details-content { content-visibility: visible; display: contents; }
}
"""

LEGEND = ('<ul class="legend">'
          '<li><span class="sw op"></span>host: ops</li>'
          '<li><span class="sw blocked"></span>host: waiting (sync copies, synchronize)</li>'
          '<li><span class="sw kernel"></span>device: kernels</li>'
          '<li><span class="sw xfer"></span>device: transfers</li>'
          '<li><span class="sw idle"></span>device: idle</li>'
          '<li><span class="sw folded"></span>short spans folded together</li>'
          '<li><span class="sw sync"></span>sync copy (labelled #row line)</li>'
          '<li><span class="sw async"></span>async copy</li></ul>')


__all__ = ["CSS", "LEGEND"]
