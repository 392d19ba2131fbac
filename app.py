"""ThinkViz in the browser.

    python app.py [--host 127.0.0.1] [--port 7860] [--share] [--model embedded] [--quant 4bit]
                  [--quant-backend auto] [--allow-model-loading] [--vram-cap GiB] [--ray-address ADDR]
                  [--threads auto] [--room] [--auth USER:PASSWORD] [--teacher USER] [--cap N]

Binds 127.0.0.1 unless told otherwise and makes no share link unless ``--share`` is given;
``--room`` serves a classroom: on 0.0.0.0 (unless ``--host`` says otherwise), behind a login with
passwords generated and printed at start (or ``--auth``'s), the login ``--teacher`` as the teacher
and everyone else a student whose runs are capped at ``--cap`` tokens × policies (see
docs/classroom.md, "Serving a room").  ``--auth`` alone puts any app behind Gradio's login.
uploads over ``MAX_UPLOAD_BYTES`` are refused by the server.  When the app is reachable from
other machines, visitors cannot load other models (a Hugging Face download or any local
folder) unless ``--allow-model-loading`` says so.
The page opens at once; the model loads in the background with its progress shown.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import secrets
import sys
from dataclasses import dataclass

from thinkviz.cores import AUTO, TORCH, apply_threads, choose_threads
from thinkviz.core.events import MAX_RECORDING_BYTES
from thinkviz.memory import VramCapError, set_vram_cap
from thinkviz.models.loading import BACKENDS, QUANTIZATIONS
from thinkviz.models.sources import load_any
from thinkviz.ui.app import APP_CSS, build_app, queue_for_a_room
from thinkviz.ui.model_slot import ModelSlot
from thinkviz.ui.room import DEFAULT_CAP, SERVER_THREADS, STUDENT, TEACHER, Room

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
    parser.add_argument(
        "--host", default=None, help="address to bind (default 127.0.0.1: this machine only; with --room 0.0.0.0)"
    )
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
    add_room_args(parser)
    args = parser.parse_args(argv)
    try:
        args.auth = [login(pair) for pair in args.auth]
    except ValueError as exc:
        parser.error(str(exc))
    if args.room and args.auth and args.teacher not in {user for user, _ in args.auth}:
        parser.error(f"--teacher {args.teacher!r} is none of the --auth logins")
    if args.cap is not None and args.cap < 0:
        parser.error(f"--cap must be 0 (no cap) or more, got {args.cap}")
    args.host = args.host or ("0.0.0.0" if args.room else "127.0.0.1")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be between 1 and 65535, got {args.port}")
    try:
        choose_threads(args.threads)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def add_room_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--room",
        action="store_true",
        help="serve a classroom: on 0.0.0.0, behind a login (passwords printed at start unless --auth), "
        "a teacher and students whose runs are capped (--cap)",
    )
    parser.add_argument(
        "--auth",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="require this login (Gradio's own; repeat for more); with --room, --teacher names the teacher's",
    )
    parser.add_argument("--teacher", default=TEACHER, help=f"with --room: the teacher's login (default {TEACHER})")
    parser.add_argument(
        "--cap",
        type=int,
        default=None,
        help=f"with --room: the most tokens × policies a student's run may take (default {DEFAULT_CAP}; 0: none)",
    )


def login(pair: str) -> tuple[str, str]:
    """``USER:PASSWORD`` as a pair; ``ValueError`` when either is empty."""
    user, _, password = pair.partition(":")
    if not user or not password:
        raise ValueError(f"--auth takes USER:PASSWORD, got {pair!r}")
    return user, password


@dataclass(frozen=True)
class Serving:
    """How the app is served: the room (who is the teacher, the cap), the logins (empty: none) and
    what to print at start."""

    room: Room
    auth: list[tuple[str, str]]
    notice: str


def serving(args: argparse.Namespace) -> Serving:
    """The room and logins ``args`` ask for; ``--room`` without ``--auth`` makes a password each for
    the teacher and the students.  Without either flag: no room, no login, nothing to print."""
    auth = list(args.auth)
    if args.room and not auth:
        auth = [(args.teacher, secrets.token_urlsafe(9)), (STUDENT, secrets.token_urlsafe(6))]
    if not args.room:
        return Serving(Room(), auth, "Serving behind a login (--auth)." if auth else "")
    cap = DEFAULT_CAP if args.cap is None else (args.cap or None)
    room = Room(on=True, teacher=args.teacher, cap=cap)
    logins = "\n".join(
        f"  {'teacher' if user == args.teacher else 'student'}: user {user!r}, password {password!r}"
        for user, password in auth
    )
    notice = (
        f"ThinkViz room on http://{args.host}:{args.port}/ (this machine's network address, port {args.port}).\n"
        f"{logins}\n  {room.cap_line()}"
    )
    return Serving(room, auth, notice)


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
    served = serving(args)
    model_loading = args.allow_model_loading or (is_loopback(args.host) and not args.share) or args.room
    demo = build_app(
        slot,
        model=args.model,
        quantization=args.quant,
        model_loading=model_loading,
        ray_address=args.ray_address,
        quant_backend=args.quant_backend,
        room=served.room,
    )
    queue_for_a_room(demo)
    if served.notice:
        print(served.notice, flush=True)
    try:
        demo.launch(
            server_name=args.host,
            server_port=args.port,
            share=args.share,
            css=APP_CSS,
            footer_links=["api", "settings"],
            max_file_size=MAX_UPLOAD_BYTES,
            auth=served.auth or None,
            max_threads=SERVER_THREADS,
        )
    except OSError as exc:  # the port is taken, the address cannot be bound
        print(f"app.py: error: cannot serve on {args.host}:{args.port} ({exc})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
