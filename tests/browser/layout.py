"""What the layout browser test measures in a loaded report page, and where its figures are kept.

MEASURE is a JavaScript expression returning JSON: per implementation card, the widest sideways
overflow of any element or line of text past the card's edge (px), the card's own sideways scroll, the
narrowest table cell in characters of its computed font (canvas measureText of "0000" / 4), the name
parts (.nm text between <wbr>s) that wrapped inside themselves; and every chart figure of the loss and
grads/params sections (empty frame, "all equal" frame, or drawn marks).
"""

from __future__ import annotations

import pytest

FIGURES_KEY = pytest.StashKey[list[tuple[str, int, float, float | None]]]()
"""(page id, window width px, widest overflow px, narrowest cell chars) per measured page."""

MEASURE = """(() => {
  const charWidth = (el) => {
    const cs = getComputedStyle(el);
    const ctx = document.createElement('canvas').getContext('2d');
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    return ctx.measureText('0000').width / 4;
  };
  const label = (node) => {
    const el = node.nodeType === 3 ? node.parentElement : node;
    const text = (node.textContent || '').trim().slice(0, 60);
    return `${el.tagName.toLowerCase()}.${[...el.classList].join('.')} "${text}"`;
  };
  let widest = {px: -Infinity, what: ''}, narrowest = {chars: Infinity, what: ''};
  let scroll = 0, numCells = 0;
  const midName = [];
  const cards = [...document.querySelectorAll('.card')];
  for (const card of cards) {
    const c = card.getBoundingClientRect();
    const boxes = [];
    for (const el of card.querySelectorAll('*')) boxes.push([el, [el.getBoundingClientRect()]]);
    const walker = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      if (!t.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(t);
      boxes.push([t, [...range.getClientRects()]]);
    }
    for (const [node, rects] of boxes) {
      for (const r of rects) {
        if (r.width === 0 && r.height === 0) continue;
        const over = Math.max(r.right - c.right, c.left - r.left);
        if (over > widest.px) widest = {px: over, what: label(node)};
      }
    }
    scroll = Math.max(scroll, card.scrollWidth - card.clientWidth);
    for (const cell of card.querySelectorAll('td, th')) {
      const r = cell.getBoundingClientRect();
      if (r.width === 0) continue;
      const cs = getComputedStyle(cell);
      const inner = r.width - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      const chars = inner / charWidth(cell);
      numCells += 1;
      if (chars < narrowest.chars) narrowest = {chars, what: label(cell)};
    }
    for (const name of card.querySelectorAll('.nm')) {
      const walk = document.createTreeWalker(name, NodeFilter.SHOW_TEXT);
      for (let t = walk.nextNode(); t; t = walk.nextNode()) {
        const range = document.createRange();
        range.selectNodeContents(t);
        const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        if (tops.size > 1) midName.push(t.textContent);
      }
    }
  }
  const figures = [...document.querySelectorAll('#loss figure, #numeric figure')].map(f => ({
    section: f.closest('section').id, family: f.dataset.family || '', plot: f.dataset.plot || '',
    empty: !!f.querySelector('.chart-empty:not(.equal)'), equal: !!f.querySelector('.chart-empty.equal'),
    drawn: !!f.querySelector('svg.chart polyline, svg.chart circle, svg.chart rect, svg.chart path'),
    caption: f.querySelector('figcaption').textContent}));
  return JSON.stringify({cards: cards.length, widest, narrowest: numCells ? narrowest : null, scroll, numCells,
    midName, figures, folded: [...document.querySelectorAll('.card .fold')].map(f => f.textContent),
    causeRows: document.querySelectorAll('.card table.causes tbody tr').length,
    pageWidth: document.documentElement.scrollWidth});
})()"""

__all__ = ["FIGURES_KEY", "MEASURE"]
