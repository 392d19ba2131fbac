"""The Explore tab: a recorded run at any step, averaged or for one layer / kv-head, and its recording.

The views come from :func:`thinkviz.ui.explore_views.explore_view`, a pure function of the record.
"""

from __future__ import annotations

import gradio as gr

from ...export import import_recording
from ...viz.legend import pin_host
from ...viz.tokens import view_mode_choices
from .. import explore_views
from ..fields import slider
from ..handlers import RUN_PICKER_INFO, figure_file, recording_file, shown
from ..session import Session
from ..text import no_markup
from ..widgets import export_controls
from . import AppContext, ExploreLink


# The tokens scroll in their box (.tv-container, app.css) under the legend, which stays in view; the box
# opens at the step's newest token: the view ends with it.
SCROLL_TO_NEWEST_JS = """() => { setTimeout(() => {
  const box = document.querySelector('#tv-explore-tokens .tv-container');
  if (box) box.scrollTop = box.scrollHeight; }, 50); }"""


def build(app: AppContext, tab: gr.Tab) -> ExploreLink:
    """Lay out the Explore tab (``tab`` is its ``gr.Tab``); returns its run picker, which Live and Compare fill,
    and the refresh they run after a run ends."""
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
    view_outputs = [caption, tokens, heatmap, segments, kept]
    export_run, export_fig, exported = export_controls("explore")
    session = app.session
    pickers = [step, layer, head]
    view_inputs = [session, step, layer, head, mode]

    def view(s: Session, step_value, layer_value, head_value, mode_value) -> explore_views.ExploreView:
        try:
            number = int(step_value)
        except (TypeError, ValueError):
            raise gr.Error(
                f"Step must be a whole number, got {no_markup(repr(step_value)[:40])}", print_exception=False
            ) from None
        return shown(explore_views.explore_view, s.explore_record, number, layer_value, head_value, mode_value)

    def rendered(s: Session, *view_values) -> tuple[list, int | None]:
        """The view outputs, and the step shown (a layer or head moves it to its snapshot's step)."""
        if s.explore_record is None:
            return [gr.skip()] * len(view_outputs), None
        shown_view = view(s, *view_values)
        tokens_html = pin_host("explore", f"<div class='tv-container'>{shown_view.tokens_html}</div>")
        return [
            shown_view.caption,
            shown_view.legend + tokens_html,
            shown_view.heatmap,
            shown_view.segments,
            shown_view.kept,
        ], shown_view.step

    def show(s: Session, *view_values) -> list:
        values, at = rendered(s, *view_values)
        moved = at is not None and at != int(view_values[0])
        return [*values, gr.update(value=at) if moved else gr.skip()]  # the step box says the step shown

    def open_record(s: Session, record, mode_value: str) -> list:
        s.explore_record, s.explore_steps = record, len(record.events)
        last = max(0, len(record.events) - 1)
        return [
            gr.update(maximum=max(1, last), value=last, interactive=last > 0),
            gr.update(choices=explore_views.layer_choices(record), value=explore_views.AVERAGE),
            gr.update(choices=explore_views.head_choices(record), value=explore_views.AVERAGE),
            *rendered(s, last, explore_views.AVERAGE, explore_views.AVERAGE, mode_value)[0],
        ]

    def refresh(s: Session, mode_value: str) -> list:
        """After a run: a record Explore opened while it streamed is shown again, whole."""
        record = s.explore_record
        current = [s.live_record, *s.compare_records.values()]
        if record is None or not any(record is r for r in current) or len(record.events) == s.explore_steps:
            return [gr.skip()] * (len(pickers) + len(view_outputs))
        return open_record(s, record, mode_value)

    def from_source(s: Session, name: str | None, mode_value: str) -> list:
        record = s.record_for(name or "")
        if record is None:
            raise gr.Error("Choose a run first (run something in Live or Compare).", print_exception=False)
        return open_record(s, record, mode_value)

    def on_select(s: Session, mode_value: str) -> list:
        sources = s.sources()
        if s.explore_record is not None or not sources:
            return [gr.skip()] * (4 + len(view_outputs))
        return [gr.update(value=sources[0]), *open_record(s, s.record_for(sources[0]), mode_value)]

    def from_upload(s: Session, files, view_mode: str) -> list:
        if not files:
            return [gr.skip()] * (3 + len(view_outputs))
        record = shown(import_recording, files if isinstance(files, list) else [files])
        return open_record(s, record, view_mode)

    export_run.click(
        lambda s: recording_file(s.explore_record), session, exported, api_name="export_explored_recording"
    )

    def keep_figure(s: Session, step: float, layer: str, kv_head: str, view_mode: str) -> str:
        return figure_file(
            s.explore_record is not None,
            lambda: {"Keep / evict": view(s, step, layer, kv_head, view_mode).heatmap},
            stem="thinkviz-keep",
        )

    export_fig.click(keep_figure, view_inputs, exported, api_name="export_keep_figure")

    def offer_modes(s: Session, mode_value: str):
        if s.explore_record is None:
            return gr.skip()
        record = s.explore_record
        choices = view_mode_choices(explore_views.predicts_importance(record), explore_views.fits_bias(record))
        return gr.update(choices=choices, value=mode_value if mode_value in {m for _, m in choices} else "combined")

    modes = {
        "fn": offer_modes,
        "inputs": [session, mode],
        "outputs": mode,
        "show_progress": "hidden",
        "api_visibility": "private",
    }
    open_source.click(
        from_source, [session, source, mode], pickers + view_outputs, show_progress="hidden", api_visibility="private"
    ).then(**modes)
    tab.select(
        on_select, [session, mode], [source, *pickers, *view_outputs], show_progress="hidden", api_visibility="private"
    ).then(**modes)
    upload.upload(
        from_upload, [session, upload, mode], pickers + view_outputs, show_progress="hidden", api_name="open_recording"
    ).then(**modes)
    for control in (step, layer, head, mode):
        # preprocess=False: Gradio's own range check would answer a step past the end with its bare message and a
        # traceback (and a slider rebuilt by an update loses fields.numbers_only); explore_view checks every value
        control.change(
            show,
            view_inputs,
            [*view_outputs, step],
            show_progress="hidden",
            trigger_mode="always_last",
            api_visibility="private",
            preprocess=False,
        )
    tokens.change(None, None, None, js=SCROLL_TO_NEWEST_JS, api_visibility="private")
    return ExploreLink(source, refresh, [session, mode], pickers + view_outputs)
