"""ThinkViz in the browser.

    python app.py [--host 127.0.0.1] [--port 7860] [--share] [--model embedded] [--quant 4bit]
                  [--quant-backend auto] [--allow-model-loading] [--vram-cap GiB] [--ray-address ADDR]
                  [--threads auto]

Binds 127.0.0.1 unless told otherwise and makes no share link unless ``--share`` is given;
uploads over ``MAX_UPLOAD_BYTES`` are refused by the server.  When the app is reachable from
other machines, visitors cannot load other models (a Hugging Face download or any local
folder) unless ``--allow-model-loading`` says so.
The page opens at once; the model loads in the background with its progress shown.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import sys

from thinkviz.cores import AUTO, TORCH, apply_threads, choose_threads
from thinkviz.core.events import MAX_RECORDING_BYTES
from thinkviz.memory import VramCapError, set_vram_cap
from thinkviz.models.loading import BACKENDS, QUANTIZATIONS
from thinkviz.models.sources import load_any
from thinkviz.ui.app import APP_CSS, build_app
from thinkviz.ui.model_slot import ModelSlot

MAX_UPLOAD_BYTES = MAX_RECORDING_BYTES  # the server refuses bigger uploads before any handler reads them


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost: assume it is reachable from elsewhere
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ThinkViz: watch KV-cache eviction inside a real model.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", help="also create a public Gradio share link (off by default)")
    parser.add_argument(
        "--allow-model-loading",
        action="store_true",
        help="let visitors load other models (any Hugging Face id or local folder) from the "
        "settings panel even when --host or --share makes the app reachable from elsewhere",
    )
    parser.add_argument(
        "--model",
        default="embedded",
        help="'embedded', a Hugging Face id, a local folder, or random:Qwen3-4B (random weights)",
    )
    parser.add_argument("--quant", default="4bit", choices=QUANTIZATIONS, help="weight quantization (default 4bit)")
    parser.add_argument(
        "--quant-backend",
        default="auto",
        choices=BACKENDS,
        help="who holds 4-bit weights (default auto: torch-int4 on an AVX512 CPU, else bitsandbytes)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--vram-cap",
        type=float,
        default=None,
        metavar="GiB",
        help="simulate a card of GiB: cap this process's CUDA memory (weights included)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="run the Sweep tab's groups on the Ray cluster at ADDR (each worker loads the app's "
        "model; needs 'pip install ray'); default: in this process",
    )
    parser.add_argument(
        "--threads",
        default=AUTO,
        help=f"torch threads: a number, {AUTO!r} (default: every core but one, left to the browser; "
        f"OMP_NUM_THREADS wins) or {TORCH!r} (torch's default, one per core)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    try:
        choose_threads(args.threads)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.vram_cap is not None:
        try:
            set_vram_cap(args.vram_cap, args.device)  # before loading: the weights count against the card
        except VramCapError as exc:
            print(f"app.py: error: {exc}", file=sys.stderr)
            return 2
    apply_threads(args.threads)  # before the model loads: torch sizes its thread pool once
    slot = ModelSlot(device=args.device, loader=functools.partial(load_any, backend=args.quant_backend))
    slot.start(args.model, args.quant)
    model_loading = args.allow_model_loading or (is_loopback(args.host) and not args.share)
    demo = build_app(
        slot,
        model=args.model,
        quantization=args.quant,
        model_loading=model_loading,
        ray_address=args.ray_address,
        quant_backend=args.quant_backend,
    )
    demo.queue(default_concurrency_limit=4)
    try:
        demo.launch(
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            css=APP_CSS,
            footer_links=["api", "settings"],
            max_file_size=MAX_UPLOAD_BYTES,
        )
    except OSError as exc:  # the port is taken, the address cannot be bound
        print(f"app.py: error: cannot serve on {args.host}:{args.port} ({exc})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
