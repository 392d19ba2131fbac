"""The Gradio app: plain generator functions that yield frames, and the Blocks that wire them.

Everything that computes a frame lives in a module with no Gradio import (``live``,
``compare``, ``sweep``, ``explore``, ``learn``, ``stream``, ``controls``, ``inputs``);
the Gradio code only connects those functions to components: one module per tab in
:mod:`.tabs`, the control groups they share in :mod:`.widgets`, the handler skeleton in
:mod:`.handlers`, and :mod:`.app`, which assembles the page.
"""
