"""The page's own scripts for a room: presentation mode, the preset notice marked up, charts that fit.

Presentation mode is a class on the app's root element (``app.css``): the controls fold into a bar
that keeps the preset's notice in a short, large form, and the views grow.  A layout change resizes
no Plotly chart by itself (plotly.js follows window resizes only), so every chart is watched with a
``ResizeObserver`` and redrawn to its panel's width whenever that changes: a mode toggled before or
after a run, a tab shown, a column hidden.
"""

from __future__ import annotations

# Inside Gradio's .contain, because Gradio repeats every custom rule prefixed with it.
PRESENT_JS = """(on) => {
  const root = document.querySelector('.gradio-container .contain');
  (root?.firstElementChild || document.body).classList.toggle('tv-present', Boolean(on));
  return [];
}"""

NOTICE_LABEL = "preset notice"

# Installed once per page: the notices get their label, the charts follow their panels' widths.
PAGE_JS = (
    """() => {
  if (window.tvFit) return;
  const widths = new WeakMap(), watched = new WeakSet();
  window.tvFit = new ResizeObserver((entries) => {
    for (const entry of entries) {
      const plot = entry.target, width = Math.round(entry.contentRect.width);
      if (!width || widths.get(plot) === width) continue;
      widths.set(plot, width);
      try { Promise.resolve(window.Plotly?.Plots.resize(plot)).catch(() => {}); } catch (error) {}
    }
  });
  const scan = () => {
    for (const plot of document.querySelectorAll('.js-plotly-plot')) {
      if (!watched.has(plot)) { watched.add(plot); window.tvFit.observe(plot); }
    }
    for (const notice of document.querySelectorAll('.block.tv-notice:not([aria-label])')) {
      notice.setAttribute('role', 'note');
      notice.setAttribute('aria-label', '"""
    + NOTICE_LABEL
    + """');
    }
  };
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    setTimeout(() => { queued = false; scan(); }, 50);
  }).observe(document.body, {childList: true, subtree: true});
  scan();
}"""
)
