"""The Explore tab: a recorded run at any step, averaged or for one layer / kv-head, and its recording.

The views come from :func:`thinkviz.ui.explore_views.explore_view`, a pure function of the record;
the tab's components are declared once (:class:`ExploreTab`) and its handlers fill them by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ...core.events import RunRecord
from ...export import import_recording
from ...viz.legend import pin_host
from ...viz.tokens import view_mode_choices
from .. import explore_views
from ..fields import slider
from ..handlers import RUN_PICKER_INFO, figure_file, recording_file, shown
from ..session import Session
from ..text import no_markup
from ..widgets import export_controls
from ..wiring import bind
from . import AppContext, ExploreLink


# The tokens scroll in their box (.tv-container, app.css) under the legend, which stays in view; the box
# opens at the step's newest token: the view ends with it.
SCROLL_TO_NEWEST_JS = """() => { setTimeout(() => {
  const box = document.querySelector('#tv-explore-tokens .tv-container');
  if (box) box.scrollTop = box.scrollHeight; }, 50); }"""


@dataclass(frozen=True)
class ExploreTab:
    """The Explore tab's components: what picks a run, the step / layer / head / view mode pickers,
    the views of the run at that step, and the exports."""

    source: gr.Dropdown
    open_source: gr.Button
    upload: gr.File
    caption: gr.Markdown
    step: gr.Slider
    layer: gr.Dropdown
    head: gr.Dropdown
    mode: gr.Radio
    tokens: gr.HTML
    heatmap: gr.Plot
    kept: gr.Plot
    segments: gr.Dataframe
    export_run: gr.Button
    export_fig: gr.Button
    exported: gr.File

    def views(self) -> list[gr.components.Component]:
        """What a step's view fills."""
        return [self.caption, self.tokens, self.heatmap, self.segments, self.kept]

    def opened(self) -> list[gr.components.Component]:
        """What opening a run fills: the pickers, then the views (``/open_recording`` returns them so)."""
        return [self.step, self.layer, self.head, *self.views()]


def explore_tab() -> ExploreTab:
    """Lay out the tab's components."""
    with gr.Row():
        with gr.Column(scale=2):
            source = gr.Dropdown(
                [], value=None, label="Run to explore", info=RUN_PICKER_INFO, elem_id="tv-explore-source"
            )
            open_source = gr.Button("Open", size="sm", elem_id="tv-explore-open")
        upload = gr.File(
            label="…or open a recording (.zip, or .json + .npz)",
            file_count="multiple",
            file_types=[".zip", ".json", ".npz"],
            elem_id="tv-explore-upload",
            scale=3,
            height=140,
        )
    caption = gr.Markdown("Nothing to explore yet: run something, or open a recording.", elem_id="tv-explore-caption")
    with gr.Row():
        step = slider(0, 1, value=0, step=1, label="Step (timeline)", elem_id="tv-explore-step", scale=3)
        layer = gr.Dropdown(
            [explore_views.AVERAGE], value=explore_views.AVERAGE, label="Layer", scale=1, elem_id="tv-explore-layer"
        )
        head = gr.Dropdown(
            [explore_views.AVERAGE], value=explore_views.AVERAGE, label="KV head", scale=1, elem_id="tv-explore-head"
        )
    mode = gr.Radio(view_mode_choices(False, False), value="combined", label="Token view", elem_id="tv-explore-mode")
    tokens = gr.HTML("", elem_id="tv-explore-tokens")
    with gr.Row():
        heatmap = gr.Plot(label="Kept per step and position", elem_id="tv-explore-heatmap", scale=3)
        kept = gr.Plot(label="Tokens held per layer and kv-head at this step", elem_id="tv-explore-kept", scale=1)
    segments = gr.Dataframe(label="Segments at this step", interactive=False, elem_id="tv-explore-segments")
    export_run, export_fig, exported = export_controls("explore")
    return ExploreTab(
        source=source,
        open_source=open_source,
        upload=upload,
        caption=caption,
        step=step,
        layer=layer,
        head=head,
        mode=mode,
        tokens=tokens,
        heatmap=heatmap,
        kept=kept,
        segments=segments,
        export_run=export_run,
        export_fig=export_fig,
        exported=exported,
    )


def explore_at(s: Session, step: Any, layer: Any, head: Any, mode: str) -> explore_views.ExploreView:
    """The session's explored run at ``step`` (a whole number, or a toast), ``layer``, ``head`` and ``mode``."""
    try:
        number = int(step)
    except (TypeError, ValueError):
        shown_step = no_markup(repr(step)[:40])
        raise gr.Error(f"Step must be a whole number, got {shown_step}", print_exception=False) from None
    return shown(explore_views.explore_view, s.explore_record, number, layer, head, mode)


def view_values(tab: ExploreTab, view: explore_views.ExploreView) -> dict:
    """``view`` in the tab's views (the legend above the tokens, which scroll in their box)."""
    tokens_html = pin_host("explore", f"<div class='tv-container'>{view.tokens_html}</div>")
    return {
        tab.caption: view.caption,
        tab.tokens: view.legend + tokens_html,
        tab.heatmap: view.heatmap,
        tab.segments: view.segments,
        tab.kept: view.kept,
    }


def show(tab: ExploreTab, s: Session, step: Any, layer: Any, head: Any, mode: str) -> dict:
    """The views at the pickers' values; a layer or head moves the step to its snapshot's, and the
    step box then says the step shown."""
    if s.explore_record is None:
        return gr.skip()
    view = explore_at(s, step, layer, head, mode)
    values = view_values(tab, view)
    if view.step != int(step):
        values[tab.step] = gr.update(value=view.step)
    return values


def open_record(tab: ExploreTab, s: Session, record: RunRecord, mode: str) -> dict:
    """Explore ``record`` from its last step, averaged over layers and heads."""
    s.explore_record, s.explore_steps = record, len(record.events)
    last = max(0, len(record.events) - 1)
    return {
        tab.step: gr.update(maximum=max(1, last), value=last, interactive=last > 0),
        tab.layer: gr.update(choices=explore_views.layer_choices(record), value=explore_views.AVERAGE),
        tab.head: gr.update(choices=explore_views.head_choices(record), value=explore_views.AVERAGE),
        **view_values(tab, explore_at(s, last, explore_views.AVERAGE, explore_views.AVERAGE, mode)),
    }


def refresh(tab: ExploreTab, s: Session, mode: str) -> dict:
    """After a run: a record Explore opened while it streamed is shown again, whole."""
    record = s.explore_record
    current = [s.live_record, *s.compare_records.values()]
    if record is None or not any(record is r for r in current) or len(record.events) == s.explore_steps:
        return gr.skip()
    return open_record(tab, s, record, mode)


def from_source(tab: ExploreTab, s: Session, name: str | None, mode: str) -> dict:
    """Open the run picked in the run picker."""
    record = s.record_for(name or "")
    if record is None:
        raise gr.Error("Choose a run first (run something in Live or Compare).", print_exception=False)
    return open_record(tab, s, record, mode)


def on_select(tab: ExploreTab, s: Session, mode: str) -> dict:
    """The tab opened with nothing explored yet: the session's newest run, if any."""
    sources = s.sources()
    if s.explore_record is not None or not sources:
        return gr.skip()
    return {tab.source: gr.update(value=sources[0]), **open_record(tab, s, s.record_for(sources[0]), mode)}


# /open_recording: the parameter names are the API's, and no docstring, which would become its description
def from_upload(tab: ExploreTab, s: Session, files: Any, view_mode: str) -> dict:
    if not files:
        return gr.skip()
    record = shown(import_recording, files if isinstance(files, list) else [files])
    return open_record(tab, s, record, view_mode)


# /export_explored_recording
def export_explored(s: Session) -> str:
    return recording_file(s.explore_record)


# /export_keep_figure
def keep_figure(s: Session, step: float, layer: str, kv_head: str, view_mode: str) -> str:
    return figure_file(
        s.explore_record is not None,
        lambda: {"Keep / evict": explore_at(s, step, layer, kv_head, view_mode).heatmap},
        stem="thinkviz-keep",
    )


def offer_modes(s: Session, mode: str) -> Any:
    """The view modes the explored run has data for (the prediction modes only when it predicted)."""
    if s.explore_record is None:
        return gr.skip()
    record = s.explore_record
    choices = view_mode_choices(explore_views.predicts_importance(record), explore_views.fits_bias(record))
    return gr.update(choices=choices, value=mode if mode in {m for _, m in choices} else "combined")


def build(app: AppContext, tab: gr.Tab) -> ExploreLink:
    """Lay out the Explore tab (``tab`` is its ``gr.Tab``); returns its run picker, which Live and Compare fill,
    and the refresh they run after a run ends."""
    c = explore_tab()
    session = app.session
    view_inputs = [session, c.step, c.layer, c.head, c.mode]
    hidden: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    modes = {"fn": offer_modes, "inputs": [session, c.mode], "outputs": c.mode, **hidden}

    c.export_run.click(export_explored, session, c.exported, api_name="export_explored_recording")
    c.export_fig.click(keep_figure, view_inputs, c.exported, api_name="export_keep_figure")
    c.open_source.click(bind(from_source, c), [session, c.source, c.mode], c.opened(), **hidden).then(**modes)
    tab.select(bind(on_select, c), [session, c.mode], [c.source, *c.opened()], **hidden).then(**modes)
    c.upload.upload(
        bind(from_upload, c), [session, c.upload, c.mode], c.opened(), show_progress="hidden", api_name="open_recording"
    ).then(**modes)
    for control in (c.step, c.layer, c.head, c.mode):
        # preprocess=False: Gradio's own range check would answer a step past the end with its bare message and a
        # traceback (and a slider rebuilt by an update loses fields.numbers_only); explore_view checks every value
        control.change(
            bind(show, c),
            view_inputs,
            [*c.views(), c.step],
            show_progress="hidden",
            trigger_mode="always_last",
            api_visibility="private",
            preprocess=False,
        )
    c.tokens.change(None, None, None, js=SCROLL_TO_NEWEST_JS, api_visibility="private")
    return ExploreLink(c.source, bind(refresh, c), [session, c.mode], c.opened())
