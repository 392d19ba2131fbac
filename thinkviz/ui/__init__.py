"""The Gradio app: plain generator functions that yield frames, and the Blocks that wire them.

Everything that computes a frame lives in a module with no Gradio import (``live``,
``compare``, ``explore``, ``learn``, ``export``, ``stream``); :mod:`thinkviz.ui.app` only
connects those functions to components.
"""
