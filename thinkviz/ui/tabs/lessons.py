"""The Lessons tab: a guided lesson in presentation layout — the narration large on top, one view below,
"N / M", Back / Next and the arrow keys.  ``?lesson=NAME&step=N`` opens that step.

The steps come from :mod:`thinkviz.demos.lessons` (read from the preset recordings, no model) and
are drawn by :func:`thinkviz.ui.lesson_views.lesson_view`; this module only wires them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ...demos.lessons import LessonError, list_lessons, load_lesson, named_lesson, warm_up
from .. import lesson_views
from ..text import plain_markdown
from ..wiring import bind, bind_request
from . import AppContext

TAB_ID = "lessons"

# The token view opens at the first highlighted token, or else at the frame's newest token.
SCROLL_JS = """() => { setTimeout(() => {
  const box = document.querySelector('#tv-lesson-tokens .tv-container');
  if (!box) return;
  const mark = box.querySelector('.tv-mark');
  box.scrollTop = mark ? Math.max(0, mark.offsetTop - box.offsetTop - box.clientHeight / 4) : box.scrollHeight;
}, 50); }"""

# The arrow keys step the lesson while its tab is shown, unless a text field, a list or a tab has the focus.
KEYS_JS = """() => {
  if (window.tvLessonKeys) return;
  window.tvLessonKeys = true;
  document.addEventListener('keydown', (event) => {
    const panel = document.getElementById('tv-lesson');
    if (!panel || panel.offsetParent === null || event.altKey || event.ctrlKey || event.metaKey) return;
    const target = event.target;
    if (target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName)
        || target.getAttribute('role') === 'tab')) return;
    const id = {ArrowRight: 'tv-lesson-next', ArrowLeft: 'tv-lesson-back'}[event.key];
    if (!id) return;
    event.preventDefault();
    document.getElementById(id)?.click();
  });
}"""


@dataclass(frozen=True)
class LessonsTab:
    """The tab's components; ``step`` is the step shown (1-based)."""

    pick: gr.Dropdown
    step: gr.State
    narration: gr.HTML
    indicator: gr.HTML
    back: gr.Button
    next: gr.Button
    caption: gr.Markdown
    tokens: gr.HTML
    chart: gr.Plot

    def views(self) -> list[Any]:
        return [self.step, self.narration, self.indicator, self.caption, self.tokens, self.chart]


def lessons_tab() -> LessonsTab:
    """Lay out the tab."""
    names = list_lessons()
    with gr.Column(elem_id="tv-lesson"):
        with gr.Row(elem_classes="tv-lesson-bar", equal_height=True):
            pick = gr.Dropdown(
                [(load_lesson(n).title, n) for n in names],
                value=names[0] if names else None,
                label="Lesson",
                container=False,
                elem_id="tv-lesson-pick",
                scale=4,
                min_width=240,
            )
            back = gr.Button("Back", elem_id="tv-lesson-back", scale=0, min_width=100)
            indicator = gr.HTML("", elem_id="tv-lesson-step", scale=0, min_width=100)
            next_ = gr.Button("Next", variant="primary", elem_id="tv-lesson-next", scale=0, min_width=100)
        narration = gr.HTML(lesson_views.narration_html(_empty()), elem_id="tv-lesson-narration")
        caption = gr.Markdown("", elem_id="tv-lesson-caption")
        tokens = gr.HTML("", elem_id="tv-lesson-tokens")
        chart = gr.Plot(show_label=False, elem_id="tv-lesson-chart", visible=False)
    step = gr.State(1)
    return LessonsTab(pick, step, narration, indicator, back, next_, caption, tokens, chart)


def _empty() -> lesson_views.LessonView:
    return lesson_views.LessonView(
        "", "Pick a lesson, then step through it with Next and Back or the arrow keys.", "", ""
    )


def show(tab: LessonsTab, name: str | None, step: Any) -> dict:
    """Step ``step`` (1-based) of lesson ``name``; a lesson that cannot be read says so in the narration."""
    try:
        lesson = named_lesson(str(name or ""))
    except LessonError as exc:
        problem = lesson_views.LessonView("", "", "", "", problem=str(exc))
        return {
            tab.narration: lesson_views.narration_html(problem),
            tab.indicator: "",
            tab.caption: "",
            tab.tokens: gr.update(value="", visible=True),
            tab.chart: gr.update(value=None, visible=False),
        }
    index = lesson_views.step_index(lesson, step)
    view = lesson_views.lesson_view(lesson, index)
    chart = view.figure is not None
    return {
        tab.step: index + 1,
        tab.narration: lesson_views.narration_html(view),
        tab.indicator: f'<span class="tv-lesson-indicator" role="status">{view.indicator}</span>',
        tab.caption: plain_markdown(view.caption),
        tab.tokens: gr.update(value=view.tokens or "", visible=not chart),
        tab.chart: gr.update(value=view.figure, visible=chart),
    }


def forward(tab: LessonsTab, name: str | None, step: Any) -> dict:
    """The next step (the last stays)."""
    return show(tab, name, int(step or 1) + 1)


def backward(tab: LessonsTab, name: str | None, step: Any) -> dict:
    """The step before (the first stays)."""
    return show(tab, name, int(step or 1) - 1)


def opened(tab: LessonsTab, name: str | None) -> dict:
    """A lesson picked: its first step."""
    return show(tab, name, 1)


def entered(tab: LessonsTab, name: str | None, step: Any, shown: str | None) -> dict:
    """The tab opened: its step, unless one is already shown (a link's, or one stepped to before: drawing
    it again would race a Next pressed meanwhile and take the page back a step)."""
    return gr.skip() if shown else show(tab, name, step)


def from_link(tab: LessonsTab, tabs: gr.Tabs, request: gr.Request) -> dict:
    """A page opened with ``?lesson=NAME[&step=N]``: the Lessons tab, at that step."""
    params = dict(request.query_params) if request is not None else {}
    name = params.get("lesson")
    if not name:
        return gr.skip()
    picked = {tab.pick: name} if name in list_lessons() else {}
    return {tabs: gr.Tabs(selected=TAB_ID), **picked, **show(tab, name, params.get("step", 1))}


def build(app: AppContext, tabs: gr.Tabs, tab: gr.Tab) -> None:
    """Lay out the Lessons tab (``tab``, inside ``tabs``) and wire it."""
    c = lessons_tab()
    warm_up()  # read every lesson's recordings now, in the background: a link's first step draws at once
    hidden: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    c.next.click(bind(forward, c), [c.pick, c.step], c.views(), **hidden)
    c.back.click(bind(backward, c), [c.pick, c.step], c.views(), **hidden)
    c.pick.input(bind(opened, c), [c.pick], c.views(), **hidden)
    tab.select(bind(entered, c), [c.pick, c.step, c.indicator], c.views(), **hidden)
    app.demo.load(bind_request(from_link, c, tabs), None, [tabs, c.pick, *c.views()], **hidden)
    app.demo.load(None, None, None, js=KEYS_JS)
    c.tokens.change(None, None, None, js=SCROLL_JS, api_visibility="private")
