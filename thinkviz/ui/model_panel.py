"""The model's own panel: its status line, and the settings that load another model or cap the card's
memory (or say why loading is off).  Served to a room, only the teacher may use them (:mod:`.room`)."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from ..memory import GIB, set_vram_cap, vram_cap_bytes
from ..models.loading import QUANTIZATIONS
from ..models.random_weights import random_names
from ..models.stores import found_models
from ..units import format_bytes
from .handlers import asker, shown, user_error
from .model_slot import LoadStatus, ModelSlot, ModelUnavailable
from .text import plain_markdown


SETTINGS_GROUP = "model-settings"  # loading a model, capping the card: one at a time


def load_status_markdown(status: LoadStatus) -> str:
    """The model status line: a progress bar while loading, the error if it failed."""
    if status.error:
        return f"**Model failed to load:** {plain_markdown(status.error)}"
    if status.ready:
        note = f"  \n{plain_markdown(status.note)}" if status.note else ""
        return f"**Model:** {plain_markdown(status.message)}{note}"
    if not status.name:
        return "**Model:** not loaded"
    percent = int(round(100 * status.fraction))
    return f"**Model:** {plain_markdown(status.message)} <progress value='{percent}' max='100'></progress> {percent}%"


def model_key(status: LoadStatus) -> str:
    """Which model is loaded and whether it is usable: changes when a load starts and when it ends, not
    with its progress (what re-prices the runs: ``AppContext.model_ready``)."""
    state = "failed" if status.error else "ready" if status.ready else "loading"
    return f"{status.name} ({status.quantization}): {state}"


def model_settings(
    slot: ModelSlot, model: str, quantization: str, model_lines: list[gr.components.Component], model_loading: bool
) -> None:
    """The settings panel that loads another model (or says why it is off) and reports progress in
    ``model_lines`` (the header's status line and the hidden model key)."""
    if not model_loading:
        with gr.Accordion("Model settings", open=False):
            gr.Markdown(
                "Loading another model is off: this app can be reached from other machines. "
                "Whoever started it can allow it with `python app.py --allow-model-loading`.",
                elem_id="tv-model-loading-off",
            )
        return
    with gr.Accordion("Model settings", open=False):
        found = [m.name for m in found_models() if m.info is not None]  # Ollama's and LM Studio's GGUFs
        name = gr.Dropdown(
            choices=list(dict.fromkeys([model, "embedded", *found, *random_names()])),
            value=model,
            allow_custom_value=True,
            label="Model",
            info="'embedded' (SmolLM2-135M, offline), a .gguf file, ollama:NAME[:TAG] or "
            "lmstudio:PUBLISHER/MODEL (the ones found here are listed), a Hugging Face id, a local "
            "folder, or random:Qwen3-4B (that geometry with random weights: real memory and speed, no text)",
        )
        quant = gr.Radio(
            list(QUANTIZATIONS),
            value=quantization,
            label="Weights",
            info="4bit: bitsandbytes NF4; none: unquantized (faster on a CPU)",
        )
        load = gr.Button("Load model", size="sm")
        progress = gr.Markdown(elem_classes="tv-status")
        cap_now = vram_cap_bytes(slot.device)
        with gr.Row(equal_height=True):
            cap = gr.Number(
                value=None if cap_now is None else round(cap_now / GIB, 3),
                label="Simulate a card of (GiB)",
                elem_id="tv-vram-cap",
                info="CUDA only: caps this process's GPU memory, weights included; empty: the whole card",
            )
            set_cap = gr.Button("Set VRAM cap", size="sm", elem_id="tv-vram-cap-set")
        cap_status = gr.Markdown(vram_cap_line(cap_now), elem_id="tv-vram-cap-status", elem_classes="tv-status")

    def load_model(model_name: str, weights: str) -> Iterator[tuple[str, str, str]]:
        shown(slot.room.require_teacher, asker()[0], "load a model")
        if not (model_name or "").strip():
            raise gr.Error(
                "Give a model: 'embedded', a .gguf file, ollama:NAME, a Hugging Face id or a local folder.",
                print_exception=False,
            )
        try:
            slot.start(model_name.strip(), weights)
        except ModelUnavailable as exc:
            raise user_error(exc) from None
        for status in slot.watch():
            line = load_status_markdown(status)
            yield line, line, model_key(status)

    load.click(
        load_model,
        [name, quant],
        [progress, *model_lines],
        concurrency_limit=1,
        concurrency_id=SETTINGS_GROUP,
        api_name="load_model",
        show_progress="hidden",
    )

    def apply_cap(vram_cap_gib: float | None) -> str:
        shown(slot.room.require_teacher, asker()[0], "cap the card's memory")
        with slot.between_runs():  # a run in progress keeps the card it started on
            return vram_cap_line(shown(set_vram_cap, vram_cap_gib, slot.device))

    set_cap.click(
        apply_cap,
        cap,
        cap_status,
        concurrency_limit=1,
        concurrency_id=SETTINGS_GROUP,
        api_name="set_vram_cap",
        show_progress="hidden",
    )


def vram_cap_line(cap: int | None) -> str:
    """What the settings panel says about the VRAM cap."""
    if cap is None:
        return "No VRAM cap: runs may use the whole card."
    return (
        f"CUDA memory capped at {format_bytes(cap)}: the memory chart draws the cap and where a full cache "
        "would reach it."
    )
