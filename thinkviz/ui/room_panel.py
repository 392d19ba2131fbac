"""The room's own controls (``app.py --room``): a line under the header that tells each visitor who they
are in the room and what the teacher pushed, and the teacher's panel (push a preset to everyone, set
the cap on a student's run).  What they do lives in :mod:`.room`; this module only lays out and wires.

A push reaches every session through a timer each page runs (:data:`NEWS_SECONDS`): its ``/room_news``
event opens the pushed preset in that session's Live tab (the preset picker's own change event loads
its chat and knobs) and says so in the room line.  Scripts call ``/room_news`` themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .handlers import Updates, asker, shown
from .room import Room
from .session import Session
from .text import plain_markdown
from .wiring import bind

NEWS_SECONDS = 2.0  # how often a page asks whether the teacher pushed a preset
LIVE_PRESET_ID = "tv-live-preset"  # the Live tab's preset picker: where a pushed preset opens


@dataclass(frozen=True)
class RoomPanel:
    """The room line every visitor sees and the teacher's controls (hidden from students)."""

    line: gr.Markdown
    teacher: gr.Accordion
    preset: gr.Dropdown
    push: gr.Button
    cap: gr.Number
    set_cap: gr.Button
    said: gr.Markdown


def layout(room: Room, presets: list[tuple[str, str]]) -> RoomPanel:
    """The room line and, closed and hidden until the page knows its visitor is the teacher, the panel."""
    line = gr.Markdown(room_line(room, student=True), elem_id="tv-room-line", elem_classes="tv-status")
    with gr.Accordion("Room (teacher)", open=False, visible=False, elem_id="tv-room-teacher") as teacher:
        with gr.Row(equal_height=True):
            preset = gr.Dropdown(presets, value=None, label="Preset for everyone", elem_id="tv-room-preset")
            push = gr.Button("Everyone: open this preset", size="sm", elem_id="tv-room-push")
        with gr.Row(equal_height=True):
            cap = gr.Number(room.cap, label="Cap on a student's run (tokens × policies; empty: none)", precision=0)
            set_cap = gr.Button("Set cap", size="sm", elem_id="tv-room-set-cap")
        said = gr.Markdown(room.cap_line(), elem_id="tv-room-said", elem_classes="tv-status")
    return RoomPanel(line, teacher, preset, push, cap, set_cap, said)


def room_line(room: Room, student: bool) -> str:
    if not student:
        return "**Room:** you are the teacher: you can load models, run anything and push a preset to everyone."
    return f"**Room:** you are a student. {room.cap_line()} One run at a time per person; recordings play at once."


def greet(panel: RoomPanel, room: Room) -> Updates:
    """On page load: the visitor's room line, and the teacher's panel for the teacher."""
    teacher = room.is_teacher(asker()[0])
    return {panel.line: room_line(room, student=not teacher), panel.teacher: gr.update(visible=teacher)}


def push_preset(panel: RoomPanel, room: Room, presets: dict[str, str], preset: str | None) -> Updates:
    """Ask every session to open `preset` (teacher only)."""
    pushed = shown(room.push, preset, presets.get(preset or "", preset or ""), asker()[0])
    return {panel.said: f"Pushed to everyone: {plain_markdown(pushed.title)} (push {pushed.number})."}


def set_room_cap(panel: RoomPanel, room: Room, cap: float | None) -> Updates:
    """Cap each student's run at `cap` tokens × policies (teacher only; empty or 0: no cap)."""
    return {panel.said: shown(room.set_cap, cap, asker()[0])}


def room_news(panel: RoomPanel, room: Room, target: gr.Dropdown, s: Session) -> Updates:
    """The preset the teacher pushed since this session last asked: opened in the Live tab, and said in the
    room line after what the visitor is (a student's cap stays on screen)."""
    pushed = room.news(s.room_seen)
    if pushed is None:
        return {target: gr.skip()}  # (an empty dict reads as one output value to Gradio)
    s.room_seen = pushed.number
    teacher = room.is_teacher(asker()[0])
    opened = "You opened" if teacher else "Your teacher opened"  # after what the visitor is and may do
    title = plain_markdown(pushed.title)
    line = f"{room_line(room, student=not teacher)} {opened} *{title}* for everyone, in the Live tab."
    return {target: pushed.preset, panel.line: line}


def wire(demo: gr.Blocks, panel: RoomPanel, room: Room, session: gr.State, presets: list[tuple[str, str]]) -> None:
    """Wire the panel, once the Live tab's preset picker exists."""
    target = next((b for b in demo.blocks.values() if getattr(b, "elem_id", None) == LIVE_PRESET_ID), None)
    if not isinstance(target, gr.Dropdown):
        raise RuntimeError(f"the room pushes presets into #{LIVE_PRESET_ID}, which the page lacks")
    titles = {name: title for title, name in presets}
    hidden = {"show_progress": "hidden"}
    demo.load(bind(greet, panel, room), None, [panel.line, panel.teacher], api_visibility="private", **hidden)
    panel.push.click(bind(push_preset, panel, room, titles), panel.preset, panel.said, api_name="push_preset", **hidden)
    panel.set_cap.click(bind(set_room_cap, panel, room), panel.cap, panel.said, api_name="set_room_cap", **hidden)
    news = bind(room_news, panel, room, target)
    gr.Timer(NEWS_SECONDS).tick(news, session, [target, panel.line], api_name="room_news", queue=False, **hidden)
