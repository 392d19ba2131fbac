"""Per-browser-session state (kept in a ``gr.State``; nothing here is shared between sessions)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..events import RunRecord
from ..viz.tokens import TokenData
from .stream import TokenChannel

LIVE_TOKENS_ID = "tv-live-tokens"
COMPARE_TOKENS_IDS = tuple(f"tv-compare-tokens-{i}" for i in range(6))


@dataclass
class Session:
    """What one browser tab has run and is running.

    Gradio deep-copies a new session before first use, so it starts without a cancel event
    (a lock cannot be copied); :meth:`begin` makes one per run.
    """

    cancel: threading.Event | None = None
    running: bool = False
    live_channel: TokenChannel = field(default_factory=lambda: TokenChannel(LIVE_TOKENS_ID))
    live_view: TokenData | None = None  # the Live tab's last frame, to re-render in another mode
    live_record: RunRecord | None = None
    live_device_stats: dict[int, dict] = field(default_factory=dict)  # step -> device memory sampled then
    compare_channels: list[TokenChannel] = field(
        default_factory=lambda: [TokenChannel(target) for target in COMPARE_TOKENS_IDS]
    )
    compare_views: list[TokenData] = field(default_factory=list)
    compare_records: dict[str, RunRecord] = field(default_factory=dict)
    explore_record: RunRecord | None = None
    explore_steps: int = 0  # how many steps the explored record had when Explore opened it
    sweep_rows: list[dict] = field(default_factory=list)

    def stop(self) -> None:
        """Ask the running run, if any, to stop after its current step."""
        if self.cancel is not None:
            self.cancel.set()

    def resync(self) -> None:
        """The browser missed a token-view message: every view's next message is a reset."""
        for channel in (self.live_channel, *self.compare_channels):
            channel.resync()

    def begin(self) -> threading.Event:
        """A fresh cancel event for a new run (Stop sets it)."""
        self.cancel = threading.Event()
        self.running = True
        return self.cancel

    def sources(self) -> list[str]:
        """Runs the Explore tab can open: the last Live run and each Compare column."""
        out = ["Live run"] if self.live_record is not None else []
        return out + [f"Compare: {name}" for name in self.compare_records]

    def record_for(self, source: str) -> RunRecord | None:
        if source == "Live run":
            return self.live_record
        if source.startswith("Compare: "):
            return self.compare_records.get(source.removeprefix("Compare: "))
        return None
