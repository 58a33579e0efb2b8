"""What a reader sees in one JupyterLab notebook, measured in the page (JavaScript for Playwright).

``MEASURE`` walks the open notebook's outputs and returns plain numbers and strings: error and
stderr outputs (from the notebook model), widget and figure render failures, outputs wider than
their area, printed lines that wrap, tables and the rows a reader can see, pipe tables printed as
text, control widths and cut labels, and for every plotly figure its untitled axes, the overlap
of its legend with the plot, axes and title, and how much of the value axis the bars use.
``TAG_CONTROLS`` marks every keyboard-operable control; ``SIGNATURE`` is the view next to one
control (its output without the controls, plus the data of its figures), to tell if moving the
control changed anything.

It judges nothing: ``glmlab.testing.notebook_browser`` turns the numbers into problems.
"""

from __future__ import annotations

_HELPERS = r"""
const R = (el) => el.getBoundingClientRect();
const area = (a, b) => {
  const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
  const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
  return (w > 0 && h > 0) ? w * h : 0;
};
const PLACEHOLDERS = ['null', 'None', 'nan', 'NaN', 'undefined'];
const panel = () => window.jupyterapp.shell.currentWidget;
const topOutputs = () => [...panel().node.querySelectorAll(
  '.jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output')];
const cellOf = (el) => {
  const cells = [...panel().node.querySelectorAll('.jp-Notebook .jp-Cell')];
  return cells.indexOf(el.closest('.jp-Cell'));
};
// the plotly renderer's output element is the plot itself
const plotsIn = (o) => o.matches('.js-plotly-plot') ? [o]
  : [...o.querySelectorAll('.js-plotly-plot')];
// where a rendered line ends between two non-space characters (a number or word split)
const midWordBreaks = (el) => {
  const found = [], walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  let prevTop = null, prevChar = '', prevText = '';
  const range = document.createRange();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const t = n.textContent;
    for (let i = 0; i < t.length; i++) {
      const ch = t[i];
      if (ch === '\n') { prevTop = null; continue; }
      range.setStart(n, i); range.setEnd(n, i + 1);
      const r = range.getClientRects()[0];
      if (!r) continue;
      const top = Math.round(r.top);
      if (prevTop !== null && top > prevTop + 2 && /\S/.test(ch) && /\S/.test(prevChar))
        found.push((prevText + ch).slice(-12) + '|' + t.slice(i + 1, i + 8));
      prevTop = top; prevChar = ch; prevText = (prevText + ch).slice(-12);
    }
  }
  return found;
};
const labelOf = (el) => {
  const l = el.querySelector('.widget-label');
  return ((l && l.textContent) || el.textContent || '').trim().slice(0, 40);
};
"""

MEASURE = "() => {" + _HELPERS + r"""
const out = {errors: [], stderr: [], widget_text: [], unrendered: [], overflow: [], wrapped: [],
             pipe_text: [], tables: [], controls: [], figures: [], output_width: 0};
// errors and stderr from the model (what the kernel sent, whatever the page shows)
const cells = panel().content.model.cells;
for (let i = 0; i < cells.length; i++) {
  const c = cells.get(i);
  if (c.type !== 'code') continue;
  for (const o of c.outputs.toJSON()) {
    if (o.output_type === 'error') out.errors.push({cell: i, text: o.ename + ': ' + o.evalue});
    if (o.output_type === 'stream' && o.name === 'stderr')
      out.stderr.push({cell: i, text: [].concat(o.text).join('').slice(0, 300)});
  }
}
for (const o of topOutputs()) {
  const cell = cellOf(o), mime = o.dataset.mimeType || '';
  out.output_width = Math.max(out.output_width, o.clientWidth);
  const text = o.innerText || '';
  for (const bad of ['Error displaying widget', 'Loading widget', 'FigureWidget('])
    if (text.includes(bad)) out.widget_text.push({cell, text: bad});
  if (mime.includes('widget-view') && o.offsetHeight < 10)
    out.unrendered.push({cell, what: 'widget of height ' + o.offsetHeight});
  if ((mime.includes('plotly') || o.classList.contains('jp-RenderedPlotly')) &&
      !o.querySelector('.main-svg'))
    out.unrendered.push({cell, what: 'plotly figure'});
  // wider than the area: scrolling inside it, or a child sticking out of it
  const right = R(o).right;
  let stick = 0, what = '';
  for (const d of o.querySelectorAll('*')) {
    const r = R(d);
    if (r.width > 0 && r.height > 0 && getComputedStyle(d).visibility !== 'hidden' &&
        r.right - right > stick) {
      stick = r.right - right;
      what = d.tagName.toLowerCase() + '.' + [...d.classList].slice(0, 3).join('.');
    }
  }
  const wide = Math.max(o.scrollWidth - o.clientWidth, stick);
  if (wide > 1) out.overflow.push({cell, mime, px: Math.round(wide), width: o.clientWidth, what});
  // printed text: lines broken inside a word or number, pipe tables
  for (const pre of o.querySelectorAll('pre, .glmlab-lines > div')) {
    const lines = pre.textContent.split('\n').filter((l) => l.trim());
    const breaks = midWordBreaks(pre);
    if (breaks.length)
      out.wrapped.push({cell, lines: lines.length, breaks: breaks.length, at: breaks.slice(0, 3)});
    const pipes = lines.filter((l) => /^\s*\|.*\|\s*$/.test(l));
    if (pipes.length >= 2 && lines.some((l) => /^\s*\|?\s*:?-{3,}/.test(l)))
      out.pipe_text.push({cell, line: pipes[0].slice(0, 80)});
  }
  // HTML tables: rows a reader can see without scrolling, cut and placeholder cells
  for (const t of o.querySelectorAll('table')) {
    const rows = [...t.querySelectorAll('tr')].filter((tr) => tr.querySelector('td'));
    let clip = null;
    for (let a = t.parentElement; a && a !== o.parentElement; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowY !== 'visible' || s.overflowX !== 'visible') {
        const r = R(a);
        clip = clip ? {top: Math.max(clip.top, r.top), bottom: Math.min(clip.bottom, r.bottom),
                       left: Math.max(clip.left, r.left), right: Math.min(clip.right, r.right)}
                    : {top: r.top, bottom: r.bottom, left: r.left, right: r.right};
      }
    }
    const visible = rows.filter((tr) => { const r = R(tr);
      return !clip || (r.top >= clip.top - 1 && r.bottom <= clip.bottom + 1); }).length;
    const tds = [...t.querySelectorAll('td, th')];
    out.tables.push({cell, kind: 'html', rows: rows.length, visible,
      width: Math.round(R(t).width), area: o.clientWidth,
      cut: tds.filter((d) => d.scrollWidth > d.clientWidth + 1).map((d) => d.textContent)
               .slice(0, 5),
      placeholders: tds.map((d) => d.textContent.trim()).filter((s) => PLACEHOLDERS.includes(s))
                       .length});
  }
  // controls: slider tracks, dropdown widths, labels cut by their box
  for (const w of o.querySelectorAll('.widget-slider, .widget-dropdown, .widget-toggle-buttons')) {
    const track = w.querySelector('.noUi-target') || w.querySelector('select') ||
                  w.querySelector('.widget-toggle-button, button');
    const cut = [...w.querySelectorAll('.widget-label, button, .widget-readout')]
      .filter((l) => l.scrollWidth > l.clientWidth + 1).map((l) => l.textContent.trim());
    out.controls.push({cell, kind: w.classList.contains('widget-slider') ? 'slider' :
                       w.classList.contains('widget-dropdown') ? 'dropdown' : 'toggle',
                       label: labelOf(w), px: track ? Math.round(R(track).width) : 0, cut});
  }
  for (const gd of plotsIn(o)) out.figures.push(figure(gd, cell));
}
return out;

function figure(gd, cell) {
  const fl = gd._fullLayout || {}, svg = R(gd.querySelector('.main-svg') || gd);
  const title = (fl.title && fl.title.text) || '';
  const f = {cell, title: /^Click to enter/.test(title) ? '' : title, untitled: [],
             legend_overlap: 0, legend_overlaps: [], legend_clipped: false, bar_fill: [],
             tables: [],
             updatemenus: gd.querySelectorAll('.updatemenu-header-group').length};
  const ids = [...((fl._subplots && fl._subplots.xaxis) || []),
               ...((fl._subplots && fl._subplots.yaxis) || [])];
  for (const id of ids) {
    const ax = fl[id[0] + 'axis' + id.slice(1)];
    // plotly fills an untitled axis with an editing placeholder ("Click to enter X axis title")
    const text = (ax && ax.title && ax.title.text) || '';
    if (ax && ax.visible !== false && (!text || /^Click to enter/.test(text))) f.untitled.push(id);
  }
  const legend = gd.querySelector('.infolayer .legend .bg');
  if (legend) {
    const lr = R(legend), s = fl._size;
    const plot = {left: svg.left + s.l, top: svg.top + s.t, right: svg.left + s.l + s.w,
                  bottom: svg.top + s.t + s.h};
    const things = [['plot area', [plot]], ['title', [...gd.querySelectorAll('.gtitle')].map(R)],
      ['axis titles', [...gd.querySelectorAll('.infolayer text[class$="title"]')]
                        .filter((e) => /^[xy]\d*title$/.test(e.getAttribute('class'))).map(R)],
      ['annotations', [...gd.querySelectorAll('.annotation-text-g')].map(R)],
      ['tick labels', [...gd.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text')]
                        .map(R)]];
    for (const [what, rects] of things) {
      const a = rects.reduce((acc, r) => acc + area(lr, r), 0);
      if (a > 4) f.legend_overlaps.push(what + ' ' + Math.round(a) + ' px2');
      f.legend_overlap += a;
    }
    f.legend_overlap = Math.round(f.legend_overlap);
    const sb = gd.querySelector('.infolayer .legend .scrollbar');
    f.legend_clipped = !!(sb && R(sb).height > 0) || lr.right > svg.right + 1 ||
                       lr.bottom > svg.bottom + 1 || lr.left < svg.left - 1 || lr.top < svg.top - 1;
  }
  // how much of the value axis the bars use, per subplot (a tall ceiling line squashes them)
  for (const sp of gd.querySelectorAll('.cartesianlayer .subplot')) {
    const id = [...sp.classList].find((c) => c !== 'subplot');
    const drag = gd.querySelector(`.draglayer .${id} > .nsewdrag`);
    const bars = [...sp.querySelectorAll('.barlayer .trace.bars')];
    if (!bars.length || !drag) continue;
    const horiz = bars.some((b) => b.__data__ && b.__data__[0] && b.__data__[0].trace &&
                                   b.__data__[0].trace.orientation === 'h');
    const pr = R(drag);
    let lo = Infinity, hi = -Infinity;
    for (const p of sp.querySelectorAll('.barlayer .point path')) {
      const r = R(p);
      if (!r.width && !r.height) continue;
      lo = Math.min(lo, horiz ? r.left : r.top); hi = Math.max(hi, horiz ? r.right : r.bottom);
    }
    const span = horiz ? pr.width : pr.height;
    if (hi > lo && span > 0) f.bar_fill.push(Math.round(100 * (hi - lo) / span) / 100);
  }
  // plotly tables: rows inside the scroll view, text wider than its column
  const traces = (gd._fullData || []).filter((d) => d.type === 'table');
  [...gd.querySelectorAll('g.table')]
    .forEach((t, k) => f.tables.push(plotlyTable(t, traces[k], cell)));
  return f;
}

function plotlyTable(t, trace, cell) {
  // the table's viewport is its scroll background; rows are rendered in blocks below the header
  const view = R(t.querySelector('.scroll-background') || t);
  const rows = trace ? trace.cells.values[0].length : 0;
  const first = t.querySelector('.y-column');
  let visible = 0, placeholders = 0;
  const cut = [];
  if (first) for (const c of first.querySelectorAll('.column-block:not(#header) .cell-rect')) {
    const r = R(c), seen = Math.min(r.bottom, view.bottom) - Math.max(r.top, view.top);
    if (r.height > 0) visible += Math.max(0, Math.min(1, seen / r.height));
  }
  for (const c of t.querySelectorAll('.column-cell')) {
    const box = c.querySelector('.cell-rect'), txt = c.querySelector('.cell-text');
    if (!box || !txt) continue;
    const s = txt.textContent.trim();
    if (R(txt).width > R(box).width - 2) cut.push(s);
    if (PLACEHOLDERS.includes(s)) placeholders++;
  }
  return {cell, kind: 'plotly', rows, visible: Math.round(10 * visible) / 10, cut: cut.slice(0, 5),
          placeholders};
}
}"""

TAG_CONTROLS = "() => {" + _HELPERS + r"""
const found = [];
for (const o of topOutputs()) {
  const kinds = '.widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-checkbox';
  for (const w of o.querySelectorAll(kinds)) {
    const id = String(found.length);
    w.setAttribute('data-glmlab-control', id);
    found.push({id, cell: cellOf(o), label: labelOf(w),
                kind: w.classList.contains('widget-slider') ? 'slider' :
                      w.classList.contains('widget-dropdown') ? 'dropdown' :
                      w.classList.contains('widget-checkbox') ? 'checkbox' : 'toggle'});
  }
  for (const gd of plotsIn(o))
    for (const m of gd.querySelectorAll('.updatemenu-header-group'))
      found.push({id: null, cell: cellOf(o), label: m.textContent.trim(), kind: 'plotly menu'});
}
return found;
}"""

SIGNATURE = "(id) => {" + _HELPERS + r"""
const w = document.querySelector(`[data-glmlab-control="${id}"]`);
if (!w) return null;
const o = w.closest('.jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output');
const copy = o.cloneNode(true);
const controls = '.widget-inline-hbox, .widget-toggle-buttons, .js-plotly-plot';
for (const c of copy.querySelectorAll(controls))
  c.remove();
const parts = [copy.textContent];
for (const gd of plotsIn(o))
  parts.push(JSON.stringify((gd.data || []).map((t) => [t.x, t.y, t.z, t.base, t.visible, t.name])),
             JSON.stringify(gd.layout && gd.layout.title));
return parts.join('\u0001');
}"""
